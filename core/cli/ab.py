"""`ab --status`: the A/B experiment's figures as the Production page shows them (core.records.production.ab_verdict.ab_status),
as lines or as JSON."""

from __future__ import annotations

import argparse
import json

from sqlmodel import Session

from core.cli.base import engine_of
from core.errors import InvalidInput
from core.records.production.ab_verdict import ab_status


def cmd_ab_status(args: argparse.Namespace) -> int:
    if args.label or args.off:
        raise InvalidInput("ab --status only shows the experiment; leave out the label and --off")
    with Session(engine_of(args)) as session:
        status = ab_status(session, args.task, args.library, effect=args.effect)
    if args.json:
        print(json.dumps(status.as_dict(), indent=2))
        return 0
    if status.experiment is None:
        print(status.words)
        return 0
    state = "running" if status.running else f"ended {status.ended_at:%Y-%m-%d %H:%M} UTC: {status.end_reason}"
    print(f"A/B experiment {status.experiment} of {status.task!r} / {status.library}: {status.candidate_label!r} to "
          f"{status.share:.0%} of users since {status.started_at:%Y-%m-%d %H:%M} UTC, {state}")
    print(f"{'arm':<12}{'label':<16}{'version':<9}{'users':>6}{'traces':>8}  mean per user")
    for arm in status.arms:
        mean = "-" if arm["mean per user"] is None else f"{arm['mean per user']:.3f}"
        print(f"{arm['arm']:<12}{arm['label'][:15]:<16}{arm['version']:<9}{arm['users']:>6}{arm['scored traces']:>8}"
              f"  {mean}")
    found = status.verdict
    interval = "-" if found.low is None else f"{found.difference:+.3f} [{found.low:+.3f}, {found.high:+.3f}]"
    print(f"difference  {interval}  ({1 - found.alpha:.0%} anytime-valid, each user counted once)  "
          f"decided: {str(found.decided).lower()}")
    for reason, count in sorted(status.excluded.items()):
        print(f"left out    {count} trace(s): {reason}")
    print(status.words)
    return 0
