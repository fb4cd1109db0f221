"""Command line: `python -m core COMMAND`. Same core functions as the pages and the worker.

Exit codes: 0 success, 1 the work itself failed (a run or an evaluation ended in failure),
2 bad input (one line on stderr saying why).

Every command is declared once, in core.cli.commands: its name, help, arguments, and its handler named by a
dotted path ("core.cli.versions:cmd_export"). The parser imports no handler module; the one handler a command
names is imported when that command runs, so `--help` and a usage mistake answer before litellm, scipy, the
model or the database load (tests/test_cli_imports.py keeps it so). One handler module per command group
(tasks, people, models, model_server, jobs, worker, review, versions, production, deploy, webhooks), importing
at its top what its commands need; the worker and the model server have modules of their own so that starting
them loads none of the training and evaluation code.
"""

from __future__ import annotations

import logging
import sys

from core.cli.base import BAD_INPUT, Parser
from core.cli.commands import add_commands, load_handler
from core.cli.logs import configure_logging
from core.errors import StudioError, exit_code

__all__ = ["build_parser", "main"]


def build_parser() -> Parser:
    """The command line: global options, then every command (core.cli.commands); no handler is imported."""
    parser = Parser(prog="python -m core", description="Training-Free GRPO studio engine")
    parser.add_argument("--db", help="SQLAlchemy URL (default: DATABASE_URL or the studio.db SQLite file)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log warnings and retries")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command, its handler imported now; a StudioError or bad input becomes one line on stderr and its
    exit code."""
    try:
        args = build_parser().parse_args(argv)
        configure_logging(logging.WARNING if args.verbose else logging.ERROR)
        import core.records.subscribers  # noqa: F401  (a command that moves a label is heard: records/subscribers.py)

        return load_handler(args.handler)(args)
    except (StudioError, *BAD_INPUT) as exc:
        print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return exit_code(exc)
