"""What the Audit page calls the object of an event: a library version by its number in its library ("version #3
of 'default'"), a label by its name, everything else by its kind and id ("run 12"). A version's database id is
what the event stores; a person reads and types its number everywhere else (issue 41), so the log says the same.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlmodel import Session

from storage.tables import AuditEvent, Library, LibraryLabel, LibraryVersion

KINDS = {"libraryversion": "version", "librarylabel": "label", "apikey": "API key",
         "webhookendpoint": "webhook", "webhookdelivery": "webhook delivery", "abexperiment": "A/B experiment"}


def object_names(session: Session, events: Iterable[AuditEvent]) -> dict[int, str]:
    """Each event's object in words, by event id. A version or label that no longer exists keeps its id."""
    names: dict[int, str] = {}
    libraries: dict[int, str] = {}

    def library_name(library_id: int) -> str:
        if library_id not in libraries:
            library = session.get(Library, library_id)
            libraries[library_id] = library.name if library else f"library {library_id}"
        return libraries[library_id]

    for event in events:
        kind = KINDS.get(event.object_type, event.object_type)
        name = kind if event.object_id is None else f"{kind} {event.object_id}"
        if event.object_type == "libraryversion" and event.object_id is not None:
            version = session.get(LibraryVersion, event.object_id)
            if version is not None:
                name = f"version #{version.number} of {library_name(version.library_id)!r}"
        elif event.object_type == "librarylabel" and event.object_id is not None:
            label = session.get(LibraryLabel, event.object_id)
            if label is not None:
                name = f"label {label.name!r} of {library_name(label.library_id)!r}"
        names[event.id] = name
    return names
