"""Command line: `python -m core COMMAND`. Same core functions as the pages and the worker.

Exit codes: 0 success, 1 the work itself failed (a run or an evaluation ended in failure),
2 bad input (one line on stderr saying why).

One module per command group. A module imports at its top only what its parsers need; a command imports
the core modules that do its work when it runs, database code included (SQLAlchemy, SQLModel, the tables, the
queries), so `--help` and a usage mistake answer before litellm, scipy, the model or the database load
(tests/test_cli_imports.py keeps it so). Type hints of database objects are imported for type checkers only.
"""

from __future__ import annotations

import logging
import sys

from core.cli import deploy, jobs, models, people, production, review, tasks, versions, webhooks
from core.cli.base import BAD_INPUT, Parser
from core.cli.logs import configure_logging
from core.errors import StudioError, exit_code

__all__ = ["build_parser", "main"]


def build_parser() -> Parser:
    """The command line: global options, then each command group's parsers."""
    parser = Parser(prog="python -m core", description="Training-Free GRPO studio engine")
    parser.add_argument("--db", help="SQLAlchemy URL (default: DATABASE_URL or the studio.db SQLite file)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log warnings and retries")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add_parsers in (tasks.add_parsers, people.add_parsers, models.add_connection_parsers, jobs.add_parsers,
                        review.add_parsers, models.add_server_parser, versions.add_parsers, production.add_parsers,
                        deploy.add_parsers, webhooks.add_parsers):
        add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; a StudioError or bad input becomes one line on stderr and its exit code."""
    try:
        args = build_parser().parse_args(argv)
        configure_logging(logging.WARNING if args.verbose else logging.ERROR)
        return args.func(args)
    except (StudioError, *BAD_INPUT) as exc:
        print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return exit_code(exc)
