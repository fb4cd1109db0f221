"""The key that seals the secrets the studio stores (core.secrets): TFGRPO_SECRET_KEY, else a key file.

A fresh `make run` has no key in its environment, so the first secret stored makes a key file (TFGRPO_SECRET_KEY_FILE,
`studio.key` beside the default database, mode 0600, ignored by git): the studio works at once, and a copy of the
database alone still cannot sign. A team with several machines sets TFGRPO_SECRET_KEY everywhere instead.
"""

from __future__ import annotations

import os

from core.secrets import KEY_ENV, new_key
from core.settings import get_settings, secret


def secret_key(create: bool = False) -> str | None:
    """The key: TFGRPO_SECRET_KEY, else the key file's; with `create`, the key file is made when absent (mode
    0600, written once: of two processes making it at once, both read the one that won)."""
    if secret(KEY_ENV):
        return secret(KEY_ENV)
    path = get_settings().secret_key_file
    if path.exists():
        return path.read_text().strip()
    if not create:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(descriptor, "w") as file:
        file.write(new_key() + "\n")
    return path.read_text().strip()
