"""The key that seals the secrets the studio stores (core.secrets): TFGRPO_SECRET_KEY, else a key file.

A fresh `make run` has no key in its environment, so the first secret stored makes a key file (TFGRPO_SECRET_KEY_FILE,
`studio.key` beside the default database, mode 0600, ignored by git): the studio works at once, and a copy of the
database alone still cannot sign. A team with several machines sets TFGRPO_SECRET_KEY everywhere instead.

Either may hold several keys, newest first (comma- or line-separated): the first seals, every one opens, so a key
can rotate (`python -m core secrets rotate`, core/records/notifications/webhooks.py). The key file is written whole:
a temporary file in the same folder, linked into place only once it is complete, so a reader never sees half a key
and of two processes making it at once one wins and both read its key.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from core.secrets import KEY_ENV, new_key
from core.settings import get_settings, secret


def secret_key(create: bool = False) -> str | None:
    """The key setting: TFGRPO_SECRET_KEY, else the key file's (its lines joined by commas); with `create`, the key
    file is made when absent (mode 0600, written whole, once)."""
    if secret(KEY_ENV):
        return secret(KEY_ENV)
    path = key_file()
    if path.exists():
        return _read(path)
    if not create:
        return None
    write_key_file([new_key()], replace=False)
    return _read(path)


def key_file() -> Path:
    return get_settings().secret_key_file


def key_from_environment() -> bool:
    return bool(secret(KEY_ENV))


def _read(path: Path) -> str:
    return ",".join(line.strip() for line in path.read_text().splitlines() if line.strip())


def write_key_file(keys: list[str], *, replace: bool) -> None:
    """The key file holding `keys` (newest first), written to a temporary file and moved into place whole. Without
    `replace` an existing file wins (os.link refuses to overwrite it)."""
    path = key_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write("".join(f"{key}\n" for key in keys))
        os.chmod(temporary, 0o600)
        if replace:
            os.replace(temporary, path)
            return
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
