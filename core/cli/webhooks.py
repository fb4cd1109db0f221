"""The webhook commands: `python -m core webhook add/list/remove/test/replay/deliveries/deliver`, the same core
functions (core/records/notifications/webhooks.py) the Notifications page calls."""

from __future__ import annotations

import argparse

from sqlmodel import Session

from core.cli.base import engine_of, name_list
from core.errors import InvalidInput
from core.records.notifications.webhooks import (
    add_endpoint,
    deliver_due,
    deliveries,
    describe,
    endpoint_names,
    endpoints,
    remove_endpoint,
    replay,
    rotate_secrets,
    send_test,
    send_waiting_now,
)


def cmd_add(args: argparse.Namespace) -> int:
    view, made = add_endpoint(engine_of(args), args.name, args.url, "cli", events=name_list(args.events),
                              secret_env=args.secret_env)
    print(f"added webhook {view.name} to {view.url} for {', '.join(view.events) or 'every event'}")
    if made:
        print(f"signing secret (shown this once; keep it where the receiver verifies): {made}")
    else:
        print(f"signing secret: read from the environment variable {args.secret_env} when sending")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    with Session(engine_of(args)) as session:
        rows = endpoints(session)
    if not rows:
        print("no webhooks: add one with `python -m core webhook add NAME URL`")
    for row in rows:
        print(f"{row.name:<20}{row.url:<40}{', '.join(row.events) or 'every event'}  (secret {row.secret_from})")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    remove_endpoint(engine_of(args), args.name, "cli")
    print(f"removed webhook {args.name} and its delivery log")
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    row = send_test(engine_of(args), args.name, "cli")
    print(f"delivery {row.id}: {describe(row)}")
    return 0 if row.status == "delivered" else 1


def cmd_replay(args: argparse.Namespace) -> int:
    row = replay(engine_of(args), args.delivery, "cli")
    print(f"queued delivery {row.id} (replay of {args.delivery}, webhook-id {row.message_id}); a worker sends it")
    return 0


def cmd_deliveries(args: argparse.Namespace) -> int:
    with Session(engine_of(args)) as session:
        rows = deliveries(session, args.name, limit=args.limit)
        names = endpoint_names(session)
    print(f"{'id':>6}  {'webhook':<16}{'event':<22}{'code':>5}  state")
    for row in rows:
        replayed = f" (replay of {row.replay_of})" if row.replay_of else ""
        print(f"{row.id:>6}  {names.get(row.endpoint_id, '?'):<16}{row.event_type:<22}"
              f"{row.last_code if row.last_code is not None else '-':>5}  {describe(row)}{replayed}")
    return 0


def cmd_deliver(args: argparse.Namespace) -> int:
    if args.name and not args.now:
        raise InvalidInput("a receiver's name goes with --now (send what waits for it now)")
    made = send_waiting_now(engine_of(args), "cli", args.name) if args.now else deliver_due(engine_of(args), "cli")
    print(f"{made} attempt(s) made")
    return 0


def cmd_rotate(args: argparse.Namespace) -> int:
    print(rotate_secrets(engine_of(args), "cli"))
    return 0
