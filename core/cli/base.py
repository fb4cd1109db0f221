"""What every command module shares: the parser that reports a usage mistake on one line, and the helpers
that turn arguments into a database engine, a file's bytes or a list of names."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import InvalidInput
from core.settings import engine as settings_engine

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

BAD_INPUT = (ValueError, LookupError, FileNotFoundError)  # raised by argparse values and the filesystem
# How every command names a version: its number in the library, as every page shows it (core.records.library.versions.
# resolve_version; a database id is refused), a label, or latest.
VERSION_HELP = "the version's number in the library (3 or #3, as the pages show it), a label, or latest"


class UsageError(InvalidInput):
    """A mistake on the command line itself."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake on one line with exit code 2. Given `implied`, the name of one of
    its subcommands, arguments that start with a number or an option mean that subcommand (`review 3` is
    `review show 3`)."""

    def __init__(self, *args, implied: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.implied = implied

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        args = list(sys.argv[1:] if args is None else args)
        if self.implied and args and (args[0].isdigit() or args[0].startswith("-") and args[0] not in ("-h", "--help")):
            args = [self.implied, *args]
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def engine_of(args: argparse.Namespace) -> Engine:
    """The database of --db, else the configured one (migrated on first use)."""
    return settings_engine(args.db)


def read_file(path: Path, check: Callable[[int, str], object]) -> bytes:
    """A file's bytes, its size checked by `check(size, name)` before it is read."""
    try:
        check(path.stat().st_size, path.name)
        return path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"{path.name}: cannot read file: {exc.strerror or exc}") from None


def name_list(text: str | None) -> list[str]:
    """Comma-separated names (personas) as a list, spaces and empty entries dropped."""
    return [name.strip() for name in (text or "").split(",") if name.strip()]


def write_output(output: str | None, text: str, end: str = "") -> None:
    """An export written to --output (said on stderr, so a pipe gets only the text), else to stdout."""
    if output:
        Path(output).write_text(text, encoding="utf-8")
        print(f"wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text + end)
