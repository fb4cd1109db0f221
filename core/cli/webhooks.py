"""The webhook commands: `python -m core webhook add/list/remove/test/replay/deliveries/deliver`, the same core
functions (core/records/webhooks.py) the Notifications page calls."""

from __future__ import annotations

import argparse

from core.cli.base import Parser, engine_of, name_list
from core.domain.webhooks import EVENTS


def cmd_add(args: argparse.Namespace) -> int:
    from core.records.webhooks import add_endpoint

    view, made = add_endpoint(engine_of(args), args.name, args.url, "cli", events=name_list(args.events),
                              secret_env=args.secret_env)
    print(f"added webhook {view.name} to {view.url} for {', '.join(view.events) or 'every event'}")
    if made:
        print(f"signing secret (shown this once; keep it where the receiver verifies): {made}")
    else:
        print(f"signing secret: read from the environment variable {args.secret_env} when sending")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from sqlmodel import Session

    from core.records.webhooks import endpoints

    with Session(engine_of(args)) as session:
        rows = endpoints(session)
    if not rows:
        print("no webhooks: add one with `python -m core webhook add NAME URL`")
    for row in rows:
        print(f"{row.name:<20}{row.url:<40}{', '.join(row.events) or 'every event'}  (secret {row.secret_from})")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    from core.records.webhooks import remove_endpoint

    remove_endpoint(engine_of(args), args.name, "cli")
    print(f"removed webhook {args.name} and its delivery log")
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    from core.records.webhooks import describe, send_test

    row = send_test(engine_of(args), args.name, "cli")
    print(f"delivery {row.id}: {describe(row)}")
    return 0 if row.status == "delivered" else 1


def cmd_replay(args: argparse.Namespace) -> int:
    from core.records.webhooks import replay

    row = replay(engine_of(args), args.delivery, "cli")
    print(f"queued delivery {row.id} (replay of {args.delivery}, webhook-id {row.message_id}); a worker sends it")
    return 0


def cmd_deliveries(args: argparse.Namespace) -> int:
    from sqlmodel import Session

    from core.records.webhooks import deliveries, describe, endpoint_names

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
    from core.records.webhooks import deliver_due

    print(f"{deliver_due(engine_of(args), 'cli')} attempt(s) made")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    webhook = sub.add_parser("webhook", help="notify a team's tools when a person is needed (Standard Webhooks)")
    wsub = webhook.add_subparsers(dest="webhook_command", required=True, parser_class=Parser)
    p = wsub.add_parser("add", help="add a receiver; prints its signing secret once",
                        epilog="events: " + "; ".join(f"{name}: {line}" for name, line in EVENTS.items()))
    p.add_argument("name", help="a name for it, e.g. team-chat")
    p.add_argument("url", help="http(s) URL the events are posted to (a chat tool's incoming webhook works)")
    p.add_argument("--events", help="comma-separated events it hears (default: all)")
    p.add_argument("--secret-env", help="read the whsec_ signing secret from this environment variable instead of "
                                        "storing a new one")
    p.set_defaults(func=cmd_add)
    wsub.add_parser("list", help="the receivers: name, host, events (never the secret)").set_defaults(func=cmd_list)
    p = wsub.add_parser("remove", help="remove a receiver and its delivery log")
    p.add_argument("name")
    p.set_defaults(func=cmd_remove)
    p = wsub.add_parser("test", help="send a signed test message now and say what the receiver answered")
    p.add_argument("name")
    p.set_defaults(func=cmd_test)
    p = wsub.add_parser("replay", help="queue a logged delivery again (same webhook-id)")
    p.add_argument("delivery", type=int, help="the delivery's id in `webhook deliveries`")
    p.set_defaults(func=cmd_replay)
    p = wsub.add_parser("deliveries", help="the delivery log: status, response code, attempts")
    p.add_argument("--name", help="of this receiver only")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_deliveries)
    wsub.add_parser("deliver", help="one delivery pass now (a worker does this every few seconds)"
                    ).set_defaults(func=cmd_deliver)
