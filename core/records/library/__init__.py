"""Experience libraries: immutable versions and their labels, promotion's preview and guard, entry selection,
libraries per segment, coverage of the train references, and the hook a label move announces itself on
(events.py), so the library never calls production or notifications."""
