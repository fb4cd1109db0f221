"""The production loop's commands: `serve` the HTTP API, manage `apikey`s, look at `traces`, set a task's
`production-rules`, split traffic with `ab`, and `harvest` failures into training data.

`serve` hands the process over to the `api` package (`python -m api`): core never imports the API, which
is a face over core like the pages, so the command line starts it as its own program.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from core.cli.base import Parser, engine_of
from core.domain.roles import API_ROLES
from core.errors import InvalidInput

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def _day(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"--since {text!r} is not a date such as 2026-11-01 or 2026-11-01T12:00") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def cmd_serve(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if args.db:
        env["DATABASE_URL"] = args.db
    command = [sys.executable, "-m", "api", "--host", args.host] + (["--port", str(args.port)] if args.port else [])
    sys.stdout.flush()
    os.execve(sys.executable, command, env)
    return 0  # not reached: the API program replaced this one


def cmd_apikey_create(args: argparse.Namespace, engine: Engine) -> int:
    from core.records.api_keys import create_key

    key = create_key(engine, args.name, args.role, "cli", person=args.person)
    person = f", for {args.person}" if args.person else ""
    print(f"API key {key.id} ({key.name}, {key.role}{person}): {key.secret}")
    print("This is the only time the key is shown; it is stored hashed.", file=sys.stderr)
    return 0


def cmd_apikey_list(args: argparse.Namespace, engine: Engine) -> int:
    from sqlmodel import Session

    from core.records.api_keys import list_keys

    with Session(engine) as session:
        keys = list_keys(session)
    print(f"{'id':>4}  {'name':<24}{'role':<8}{'prefix':<14}{'last used':<18}revoked")
    for key in keys:
        used = f"{key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "never"
        revoked = f"{key.revoked_at:%Y-%m-%d %H:%M} by {key.revoked_by}" if key.revoked_at else "no"
        print(f"{key.id:>4}  {key.name:<24}{key.role:<8}{key.prefix:<14}{used:<18}{revoked}")
    return 0


def cmd_apikey_revoke(args: argparse.Namespace, engine: Engine) -> int:
    from core.records.api_keys import revoke_key

    revoke_key(engine, args.id, "cli")
    print(f"API key {args.id} revoked")
    return 0


def cmd_traces(args: argparse.Namespace, engine: Engine) -> int:
    from collections import Counter

    from sqlmodel import Session

    from core.records.traces import daily_summary, lowest_scored, source_of, task_traces, trace_score
    from storage import queries

    with Session(engine) as session:
        traces = task_traces(session, args.task, since=_day(args.since), max_score=args.max_score)
        numbers = queries.version_numbers(session, sorted({trace.version_id for trace in traces} - {None}))
    rows = daily_summary(traces, numbers)
    if not rows:
        print(f"no traces for {args.task!r}" + (f" since {args.since}" if args.since else ""))
        return 0
    print(f"{'day':<12}{'version':<16}{'traces':>7}{'scored':>8}  mean score [95% interval]")
    for row in rows:
        mean = "-" if row["mean score"] is None else f"{row['mean score']:.3f} [{row['low']:.3f}, {row['high']:.3f}]"
        print(f"{row['day']!s:<12}{row['version']:<16}{row['traces']:>7}{row['scored']:>8}  {mean}")
    sources = Counter(source_of(trace) for trace in traces)
    print("\nfrom: " + ", ".join(f"{source} {count}" for source, count in sorted(sources.items())))
    lowest = lowest_scored(traces, args.lowest)
    if lowest:
        print("\nlowest scored:")
        for trace in lowest:
            print(f"  {trace_score(trace):.2f}  trace {trace.id} ({trace.client_id}): {trace.input[:100]!r}")
    return 0


def cmd_production_rules(args: argparse.Namespace, engine: Engine) -> int:
    from core.records.traces import set_rules

    rules = {name: value for name, value in (("below", args.below), ("share", args.share)) if value is not None}
    rules = set_rules(engine, args.task, rules, "cli")
    print(f"production rules of {args.task!r}: {rules or 'none (no trace goes to people)'}")
    return 0


def cmd_ab(args: argparse.Namespace, engine: Engine) -> int:
    from core.records.serving import set_ab_split

    label = None if args.off else args.label
    if label is None and not args.off:
        raise InvalidInput("ab: name the candidate label, or give --off")
    set_ab_split(engine, args.task, args.library, label, 0.0 if args.off else args.share, "cli")
    print("A/B split ended" if args.off else f"{args.share:.0%} of users get {label!r}; the rest production")
    return 0


def cmd_harvest(args: argparse.Namespace, engine: Engine) -> int:
    from core.records.traces import harvest

    added, skipped = harvest(engine, args.task, "cli", since=_day(args.since), max_score=args.max_score,
                             labelled_only=args.labelled_only)
    print(f"added {added} train samples from production traces; {skipped} skipped (a sample has that input)")
    return 0


def _with_engine(command: Callable[[argparse.Namespace, Engine], int]) -> Callable[[argparse.Namespace], int]:
    """A command of this module, given the database of --db when it runs."""
    return lambda args: command(args, engine_of(args))


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The production commands under `python -m core`."""
    p = sub.add_parser("serve", help="serve the HTTP API (python -m api) on its own port")
    p.add_argument("--host", default="127.0.0.1", help="loopback unless sign-in is on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="default TFGRPO_API_PORT or 8502")
    p.set_defaults(func=cmd_serve)

    apikey = sub.add_parser("apikey", help="create, list or revoke the API keys live agents use")
    asub = apikey.add_subparsers(dest="apikey_command", required=True, parser_class=Parser)
    p = asub.add_parser("create", help="make a key; it is printed once and stored hashed")
    p.add_argument("--name", required=True, help="which agent uses it")
    p.add_argument("--role", choices=list(API_ROLES), required=True,
                   help="; ".join(f"{role}: {what}" for role, what in API_ROLES.items()))
    p.add_argument("--person", metavar="USER", help="the user the key acts for: it carries at most their role "
                                                     "(a read key needs a labeler, an ingest key a reviewer)")
    p.set_defaults(func=_with_engine(cmd_apikey_create))
    asub.add_parser("list", help="every key: name, role, prefix, last use, revoked").set_defaults(
        func=_with_engine(cmd_apikey_list))
    p = asub.add_parser("revoke", help="revoke a key for good")
    p.add_argument("id", type=int)
    p.set_defaults(func=_with_engine(cmd_apikey_revoke))

    p = sub.add_parser("traces", help="production traces of a task: per day and version, and the lowest scored")
    p.add_argument("--task", required=True)
    p.add_argument("--since", help="a date such as 2026-11-01")
    p.add_argument("--max-score", type=float)
    p.add_argument("--lowest", type=int, default=5)
    p.set_defaults(func=_with_engine(cmd_traces))

    p = sub.add_parser("production-rules", help="which production traces go to the labelling queue")
    p.add_argument("--task", required=True)
    p.add_argument("--below", type=float, help="every trace scored under this")
    p.add_argument("--share", type=float, help="and this fraction of the rest")
    p.set_defaults(func=_with_engine(cmd_production_rules))

    p = sub.add_parser("ab", help="serve a candidate label to a share of users beside production")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("label", nargs="?")
    p.add_argument("--share", type=float, default=0.1)
    p.add_argument("--off", action="store_true", help="end the split: everyone gets production")
    p.set_defaults(func=_with_engine(cmd_ab))

    p = sub.add_parser("harvest", help="turn production traces into train samples (deduplicated)")
    p.add_argument("--task", required=True)
    p.add_argument("--since", help="only traces from this date, e.g. 2026-11-01")
    p.add_argument("--max-score", type=float, help="only traces scored at most this")
    p.add_argument("--labelled-only", action="store_true", help="only traces a person labelled")
    p.set_defaults(func=_with_engine(cmd_harvest))
