"""Library versions as stored objects: create, resolve, import, export and label them.

Versions are immutable: every change (a training step, a manual edit, an import, a revert)
appends a new version whose parent is the one it started from.
"""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from core.domain import library_io
from core.domain.library import LESSON, ProposedOp, apply_ops, entry, next_id_number, validate_ops
from core.errors import Conflict, InvalidInput, NotFound, StaleVersion, StudioError
from core.records.library.events import LabelMoved, label_moved
from core.records.library.promotion import PRODUCTION, Approval, preview_promotion
from core.records.people.roles import require_role
from core.records.tasks.lookup import ensure_library, get_library, get_task
from storage import queries
from storage.db import session_scope
from storage.tables import AuditEvent, Library, LibraryLabel, LibraryVersion, Task, utcnow

EMPTY = "empty"
CREATE_HINT = "import a file to create it"


def all_ids(session: Session, library_id: int) -> list[str]:
    return [exp["id"] for v in queries.versions(session, library_id) for exp in v.experiences]


def lock_library(session: Session, library_id: int) -> LibraryVersion | None:
    """Hold the library until this transaction ends (PostgreSQL's row lock, SQLite's write lock), then read
    its latest version: two changes made at once are numbered one after the other, and the second sees
    the first."""
    session.exec(update(Library).where(Library.id == library_id).values(name=Library.name))
    return queries.latest_version(session, library_id)


def check_latest(latest: LibraryVersion | None, base_id: int | None) -> None:
    """Refuse a change made on `base_id` when another version has become the latest meanwhile.

    The newer version is named by its number, as everywhere a person reads one (only a page makes a change on a
    version it showed: the CLI and the HTTP API pass no base)."""
    if latest is None or base_id is None or latest.id == base_id:
        return
    origin = "from the same parent" if latest.parent_id == base_id else "after the version your change started from"
    raise StaleVersion(f"version #{latest.number} was created by {latest.created_by} {origin}; "
                       f"your change was not applied; re-apply it on #{latest.number}?")


def create_version(
    session: Session,
    library: Library,
    experiences: list[dict],
    *,
    parent_id: int | None,
    source: str,
    created_by: str,
    note: str = "",
    run_id: int | None = None,
    step_id: int | None = None,
    expect_latest: int | None = None,
) -> LibraryVersion:
    """Append a version. With `expect_latest`, the change was made on that version and is refused
    (StaleVersion) when another one became the latest meanwhile; a run's step, which builds on its own
    line of versions, passes none."""
    latest = lock_library(session, library.id)
    check_latest(latest, expect_latest)
    version = LibraryVersion(library_id=library.id, number=(latest.number + 1) if latest else 1, parent_id=parent_id,
                             experiences=experiences, source=source, created_by=created_by, note=note,
                             run_id=run_id, step_id=step_id)
    session.add(version)
    session.flush()
    session.add(AuditEvent(actor=created_by, action=f"version.{source}", object_type="libraryversion",
                           object_id=version.id, after={"number": version.number, "size": len(experiences)}))
    return version


def new_experiences(session: Session, library: Library, texts: list[str] | list[dict]) -> list[dict]:
    """Fresh ids for entries that enter the library from outside (import, baseline): texts (lessons) or
    {"text", "kind"} entries as library_io.parse_library_entries reads them."""
    start = next_id_number(all_ids(session, library.id))
    items = [item if isinstance(item, dict) else {"text": item} for item in texts]
    return [entry(f"E{start + i}", item["text"], item.get("kind") or LESSON) for i, item in enumerate(items)]


LATEST = "latest"
MAX_DIGITS = 18  # a larger number is no version's (and would not fit the database's integer)


def _digits(ref: str) -> str | None:
    """The digits of `ref` when every lookup takes it for a version's number ("12", "#12", and also "٣" or "²",
    which `version_number` then refuses), else None: the one test both the lookup and `set_label` apply."""
    text = str(ref).strip().removeprefix("#").strip()
    return text if text.isdigit() else None


def version_number(ref: str) -> int | None:
    """The number a person typed for a version ("12" or "#12", ASCII digits), or None when `ref` is no number (a
    label, `latest`, `empty`). Other digits (`²`, `١٢`) and numbers too long to be a version's are refused with
    InvalidInput rather than read or taken for a label."""
    text = _digits(ref)
    if text is None:
        return None
    if not text.isascii():
        raise InvalidInput(f"version {ref!r}: write a version's number in the digits 0-9 (e.g. 3 or #3)")
    if len(text) > MAX_DIGITS:
        raise InvalidInput(f"version {ref!r}: no version has a number that long")
    return int(text)


def resolve_version(session: Session, task: Task, ref: str, library_name: str = "default", *,
                    labels: bool = True) -> LibraryVersion | None:
    """The version a person named: its number in the library ("12" or "#12", what every page shows), a label
    (`production`), `latest`, or None for `empty` (the empty library). The one resolution the CLI, the pages,
    the HTTP API and OTLP use; `labels=False` (the HTTP API's `version=`, whose labels come by `label=`) takes
    only a number or `latest` and refuses anything else with InvalidInput.

    A version's database id is never taken for its number: a number the library does not have, but that is the
    id of a version, is refused with a message naming both (scripts written when the CLI took ids then stop
    instead of reaching another version)."""
    if not isinstance(ref, str):
        raise TypeError("resolve_version takes what a person typed (a number, a label, latest or empty); "
                        f"got {type(ref).__name__} {ref!r}: a caller holding a database id has the version already")
    ref = ref.strip()
    number = version_number(ref)
    if not labels and number is None and ref.lower() != LATEST:
        raise InvalidInput(f"version {ref!r}: give a version's number in the library (e.g. 3) or latest, or a label "
                           "with label=")
    if ref.lower() == EMPTY:
        return None
    lib = queries.library_by_name(session, task.id, library_name)
    if lib is None:
        raise NotFound(f"task {task.name!r} has no library {library_name!r}")
    if number is not None:
        version = session.exec(select(LibraryVersion).where(LibraryVersion.library_id == lib.id,
                                                            LibraryVersion.number == number)).first()
        if version is None:
            raise _no_such_number(session, task, lib, number)
        return version
    if ref.lower() == LATEST:
        return queries.latest_version(session, lib.id)
    label = queries.label_by_name(session, lib.id, ref)
    if label is None:
        raise NotFound(f"no version or label {ref!r} in library {library_name!r} of task {task.name!r} (name a "
                       "version by its number, e.g. 3 or #3, or use a label, latest or empty)")
    return session.get(LibraryVersion, label.version_id)


def _no_such_number(session: Session, task: Task, library: Library, number: int) -> StudioError:
    """Why library `library` has no version #`number`: it has only these numbers, and, when `number` is a version's
    database id (the name the CLI took before), which version that id is, by its number."""
    latest = queries.latest_version(session, library.id)
    where = f"library {library.name!r} of task {task.name!r}"
    has = ("it has no version yet" if latest is None else "its only version is #1" if latest.number == 1
           else f"its versions are #1 to #{latest.number}")
    same_id = session.get(LibraryVersion, number)
    if same_id is None:
        return NotFound(f"{where} has no version #{number} ({has})")
    owner = session.get(Library, same_id.library_id)
    owner_task = session.get(Task, owner.task_id) if owner else None
    said = (f"{where} has no version #{number} ({has}); {number} is the database id of version #{same_id.number} of "
            f"library {owner.name if owner else '?'!r}")
    if owner is None or owner_task is None or owner_task.id != task.id:
        return InvalidInput(f"{said} of task {owner_task.name if owner_task else '?'!r}, and a version is named by "
                            "its number in its library")
    return InvalidInput(f"{said}, and a version is named by its number in its library: type {same_id.number} "
                        f"(or #{same_id.number})" + ("" if owner.id == library.id else f" with --library {owner.name}"))


def import_library(engine: Engine, task_name: str, text: str, filename: str, *, library_name: str = "default",
                   actor: str = "cli") -> LibraryVersion:
    """A new version holding the experiences of an imported file (replacing the current content)."""
    with session_scope(engine) as session:
        require_role(session, actor, "reviewer", "importing a library")
        task = get_task(session, task_name, name_others=False)
        texts = library_io.parse_library_entries(text, filename, examples_intro=task.examples_intro)
        lib = ensure_library(session, task, library_name, actor=actor)
        parent = lock_library(session, lib.id)
        return create_version(session, lib, new_experiences(session, lib, texts), expect_latest=parent.id if parent else None,
                              parent_id=parent.id if parent else None, source="import", created_by=actor,
                              note=f"imported from {filename or 'text'}")


def export_version(experiences: list[dict], fmt: str, meta: dict | None = None, *, task: object | None = None) -> str:
    """The library as Markdown, JSON, or the block to paste into a system prompt, in `task`'s wording (its
    library header and examples' intro, core.domain.prompts.LibraryWording.of; no task: the neutral default),
    exactly as the agent reads it."""
    if fmt == "md":
        return library_io.to_markdown(experiences)
    if fmt == "json":
        return library_io.to_json(experiences, meta)
    if fmt == "prompt":
        from core.domain.prompts import LibraryWording, library_block

        return f"{library_block(experiences, LibraryWording.of(task))}\n" if experiences else ""
    raise InvalidInput(f"unknown export format {fmt!r}: use md, json or prompt")


def set_label(engine: Engine, task_name: str, version_ref: str, name: str, actor: str, *,
              library_name: str = "default", reason: str = "") -> LibraryLabel:
    """Point a label at a version (its number, a label or `latest`) of the library, moving it if it exists. Any label
    moves freely (a reviewer's); `production` is the admin's and moves only through `promote`, its guard."""
    name = (name or "").strip()
    if not name:
        raise InvalidInput("give the label a name, e.g. production")
    if _digits(name) is not None or name.lower() in (LATEST, EMPTY):
        raise InvalidInput(f"a label cannot be named {name!r}: every lookup reads it as a version's number (digits of "
                           "any script), latest or empty, so the label could never be reached; choose a word, e.g. "
                           "candidate")
    if name == PRODUCTION:
        with Session(engine) as session:
            version_id = version_in_library(session, task_name, version_ref, library_name).id
        return promote(engine, version_id, actor, reason=reason)
    with session_scope(engine) as session:
        version = version_in_library(session, task_name, version_ref, library_name)
        return _move_label(session, version, name, actor, reason=reason)


def version_in_library(session: Session, task_name: str, version_ref: str,
                       library_name: str = "default") -> LibraryVersion:
    """The version of the task's library a label would point at: its number, a label or `latest` (not `empty`)."""
    return _version_in(session, get_task(session, task_name, name_others=False), version_ref, library_name)


def promote(engine: Engine, version_id: int, actor: str, *, reason: str = "") -> LibraryLabel:
    """Point `production` at a version: an admin's decision, through the one guarded flow every path takes.

    First core.records.library.promotion.preview_promotion (the diff against production and the paired comparison
    of the two versions' newest evaluations on the same split and k), then its guard: without a comparison
    a written `reason` is needed (and is not enough when the setting promotion_requires_comparison is on),
    and a candidate the comparison finds worse needs a reason too; refused with InvalidInput saying what to
    do. The audit event records the comparison's evaluations and verdict, and the reason."""
    preview = preview_promotion(engine, version_id)
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "moving the production label")
        approval = preview.approve(reason)
        version = session.get(LibraryVersion, version_id)
        if version is None:
            raise NotFound("that version no longer exists")
        return _move_label(session, version, PRODUCTION, actor, approval=approval)


def _move_label(session: Session, version: LibraryVersion, name: str, actor: str, *, reason: str = "",
                approval: Approval | None = None) -> LibraryLabel:
    """Move the label in the caller's transaction. `production` needs the Approval of its guard (`promote`), made
    for this version against the production that is still current, checked under the library's lock."""
    if name == PRODUCTION:
        require_role(session, actor, "admin", "moving the production label")
        if approval is None or approval.version_id != version.id:
            raise InvalidInput("production moves only through promote (the comparison with production first)")
        lock_library(session, version.library_id)
    else:
        require_role(session, actor, "reviewer", "moving labels")
    label = queries.label_by_name(session, version.library_id, name)
    labelled = queries.version_by_id(session, label.version_id) if label else None
    if approval is not None and (label.version_id if label else None) != approval.production_id:
        raise Conflict(f"production was moved to version #{labelled.number if labelled else '?'} while this "
                       "promotion was checked; nothing was changed: look at the comparison again, then promote")
    before = {"version_id": label.version_id, "number": labelled.number if labelled else None} if label else None
    if label is None:
        label = LibraryLabel(library_id=version.library_id, name=name, version_id=version.id, moved_by=actor)
    else:
        label.version_id, label.moved_by, label.moved_at = version.id, actor, utcnow()
    session.add(label)
    session.flush()
    after = {"name": name, "version_id": version.id, "number": version.number}  # the number is what people read
    if approval is not None:
        after |= approval.record
    elif reason.strip():
        after["reason"] = reason.strip()
    label_moved(LabelMoved(session, version, name, before, actor, after))
    session.add(AuditEvent(actor=actor, action="label.move", object_type="librarylabel", object_id=label.id,
                           before=before, after=after))
    return label


def version_json_meta(task: Task, version: LibraryVersion | None) -> dict:
    """What a JSON export says of its version, in the keys the HTTP API uses for a version (`version_id`, `number`);
    an import reads only the experiences, so files written with the older `version_number` still import."""
    return {"task": task.name, "version_id": version.id if version else None,
            "number": version.number if version else None}



def edit_library(engine: Engine, task_name: str, ops: list[ProposedOp], actor: str, *, library_name: str = "default",
                 note: str = "", base_version_id: int | None = None) -> LibraryVersion:
    """A person's change (ADD, MODIFY, DELETE, MERGE) as a new version on top of the latest one.

    The operations pass the same validation as the learner's; any invalid one rejects the whole edit.
    `base_version_id` is the version the person made the change on (the one the page showed): when
    another became the latest meanwhile, nothing is written and StaleVersion says which.
    """
    if not ops:
        raise InvalidInput("nothing to change")
    with session_scope(engine) as session:
        require_role(session, actor, "reviewer", "editing libraries")
        library = get_library(session, get_task(session, task_name, name_others=False), library_name, hint=CREATE_HINT)
        base = lock_library(session, library.id)
        check_latest(base, base_version_id)
        checked = validate_ops(base.experiences, ops)
        errors = [f"{c.op.op} {', '.join(c.op.target_ids)}: {c.error}".replace("  ", " ") for c in checked if not c.valid]
        if errors:
            raise InvalidInput("; ".join(errors))
        experiences = apply_ops(base.experiences, [c.op for c in checked], next_id_number(all_ids(session, library.id)))
        summary = ", ".join(f"{c.op.op} {' '.join(c.op.target_ids)}".strip() for c in checked)
        return create_version(session, library, experiences, parent_id=base.id, source="manual", created_by=actor,
                              note=note.strip() or f"manual edit: {summary}", expect_latest=base.id)


def revert_to(engine: Engine, task_name: str, version_id: int, actor: str, *,
              library_name: str = "default") -> LibraryVersion:
    """A new version with the content of an older one (history is never rewritten)."""
    with session_scope(engine) as session:
        require_role(session, actor, "reviewer", "reverting libraries")
        library = get_library(session, get_task(session, task_name, name_others=False), library_name, hint=CREATE_HINT)
        old = session.get(LibraryVersion, version_id)
        if old is None or old.library_id != library.id:
            raise NotFound(f"that version is not in library {library_name!r}")
        latest = lock_library(session, library.id)
        return create_version(session, library, [dict(exp) for exp in old.experiences], parent_id=latest.id,
                              expect_latest=latest.id, source="revert", created_by=actor, note=f"revert to version #{old.number}")



def _version_in(session: Session, task: Task, ref: str, library_name: str) -> LibraryVersion:
    """A version of this library by its number, a label or `latest`; the empty library is no version."""
    get_library(session, task, library_name, hint=CREATE_HINT)
    version = resolve_version(session, task, ref, library_name)
    if version is None:
        raise InvalidInput("the empty library has no version to label")
    return version
