"""The production loop's commands: `serve` the HTTP API, manage `apikey`s, look at `traces`, set a task's
`production-rules`, split traffic with `ab`, and `harvest` failures into training data.

`serve` hands the process over to the `api` package (`python -m api`): core never imports the API, which
is a face over core like the pages, so the command line starts it as its own program.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from datetime import UTC, datetime

from sqlmodel import Session, select

from core.cli.ab import cmd_ab_status
from core.cli.base import engine_of
from core.errors import InvalidInput
from core.records.keys.api_keys import create_key, key_writes_to, list_keys, revoke_key
from core.records.production.otlp import map_service
from core.records.production.otlp_held import held_services
from core.records.production.scores import score_source, trace_score
from core.records.production.scoring import judge_summary, rules_words
from core.records.production.serving import set_ab_split
from core.records.production.trace_views import daily_rows, lowest_traces
from core.records.production.traces import (
    TraceFilter,
    harvest,
    set_rules,
    source_of,
    task_traces,
)
from storage import queries
from storage.tables import Task


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


def cmd_apikey_create(args: argparse.Namespace) -> int:
    engine = engine_of(args)
    key = create_key(engine, args.name, args.role, "cli", person=args.person, task=args.task, library=args.library,
                     any_task=args.any_task)
    person = f", for {args.person}" if args.person else ""
    where = (f", writes to task {args.task}" + (f" library {args.library}" if args.library else "") if args.task
             else ", writes to any task" if args.any_task else "")
    print(f"API key {key.id} ({key.name}, {key.role}{person}{where}): {key.secret}")
    print("This is the only time the key is shown; it is stored hashed.", file=sys.stderr)
    return 0


def cmd_apikey_list(args: argparse.Namespace) -> int:
    engine = engine_of(args)
    with Session(engine) as session:
        keys = list_keys(session)
        tasks = dict(session.exec(select(Task.id, Task.name)).all()) if keys else {}
    print(f"{'id':>4}  {'name':<24}{'role':<8}{'prefix':<14}{'writes to':<24}{'last used':<18}revoked")
    for key in keys:
        used = f"{key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "never"
        revoked = f"{key.revoked_at:%Y-%m-%d %H:%M} by {key.revoked_by}" if key.revoked_at else "no"
        print(f"{key.id:>4}  {key.name:<24}{key.role:<8}{key.prefix:<14}{key_writes_to(key, tasks):<24}{used:<18}"
              f"{revoked}")
    return 0


def cmd_apikey_revoke(args: argparse.Namespace) -> int:
    engine = engine_of(args)
    revoke_key(engine, args.id, "cli")
    print(f"API key {args.id} revoked")
    return 0


def cmd_map_service(args: argparse.Namespace) -> int:
    engine = engine_of(args)
    mapped = map_service(engine, args.service, args.map_task, args.library, "cli")
    print(mapped.words(args.service, args.map_task))
    return 0


def cmd_held(args: argparse.Namespace) -> int:
    with Session(engine_of(args)) as session:
        rows = held_services(session)
    if not rows:
        print("no OpenTelemetry span is held")
        return 0
    print(f"{'service':<32}{'not mapped':>11}{'unreadable':>11}{'dropped':>9}  oldest held")
    for row in rows:
        print(f"{row['service'][:31]:<32}{row['held (not mapped)']:>11}{row['held (unreadable)']:>11}"
              f"{row['dropped past the bound']:>9}  {row['oldest'] or '-'}")
    return 0


def cmd_traces(args: argparse.Namespace) -> int:
    if not args.task:
        raise InvalidInput("traces: give --task, or a subcommand (map-service, held)")
    engine = engine_of(args)
    window = TraceFilter(since=_day(args.since), max_score=args.max_score)
    with Session(engine) as session:
        traces = task_traces(session, args.task, since=window.since, max_score=window.max_score)
        numbers = queries.version_numbers(session, sorted({trace.version_id for trace in traces} - {None}))
        rows = daily_rows(session, args.task, window, numbers)
        lowest = lowest_traces(session, args.task, window, args.lowest)
    if not rows:
        print(f"no traces for {args.task!r}" + (f" since {args.since}" if args.since else ""))
        return 0
    print(f"{'day':<12}{'version':<16}{'traces':>7}{'scored':>8}  mean score [95% interval]")
    for row in rows:
        mean = "-" if row["mean score"] is None else f"{row['mean score']:.3f} [{row['low']:.3f}, {row['high']:.3f}]"
        print(f"{row['day']!s:<12}{row['version']:<16}{row['traces']:>7}{row['scored']:>8}  {mean}")
    sources = Counter(source_of(trace) for trace in traces)
    print("\nfrom: " + ", ".join(f"{source} {count}" for source, count in sorted(sources.items())))
    scorers = Counter(score_source(trace) or "nobody" for trace in traces)
    print("score by: " + ", ".join(f"{scorer} {scorers[scorer]}" for scorer in ("person", "user", "judge", "nobody")
                                   if scorers[scorer]))
    with Session(engine) as session:
        judged = judge_summary(session, traces[0].task_id)
    if judged.calls or judged.scored or judged.unsure or judged.retrying:
        print(judged.words())
    if judged.unavailable:
        print(judged.unavailable)
    if lowest:
        print("\nlowest scored:")
        for trace in lowest:
            print(f"  {trace_score(trace):.2f} by {score_source(trace):<6} trace {trace.id} ({trace.client_id}): "
                  f"{trace.input[:100]!r}")
    return 0


def cmd_production_rules(args: argparse.Namespace) -> int:
    engine = engine_of(args)
    rules = {name: value for name, value in (("below", args.below), ("share", args.share),
                                             ("judge_share", args.judge_share), ("judge_ab", args.judge_ab or None))
             if value is not None}
    rules = set_rules(engine, args.task, rules, "cli")
    print(f"production rules of {args.task!r}: {rules or 'none (no trace goes to people)'}")
    print(rules_words(rules))
    return 0


def cmd_ab(args: argparse.Namespace) -> int:
    if args.status:
        return cmd_ab_status(args)
    engine = engine_of(args)
    label = None if args.off else args.label
    if label is None and not args.off:
        raise InvalidInput("ab: name the candidate label, give --off, or --status to see the experiment")
    set_ab_split(engine, args.task, args.library, label, 0.0 if args.off else args.share, "cli")
    print("A/B split ended" if args.off else f"{args.share:.0%} of users get {label!r}; the rest production")
    return 0


def cmd_harvest(args: argparse.Namespace) -> int:
    engine = engine_of(args)
    added, skipped = harvest(engine, args.task, "cli", since=_day(args.since), max_score=args.max_score,
                             labelled_only=args.labelled_only)
    print(f"added {added} train samples from production traces; {skipped} skipped (a sample has that input)")
    return 0
