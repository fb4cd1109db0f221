"""The model commands: the connections that say where models are served (the embedded model's server is
core.cli.model_server)."""

from __future__ import annotations

import argparse
import json

from sqlmodel import Session

from core.cli.base import UsageError, engine_of
from core.records.models.connections import (
    add_connection,
    describe,
    list_connections,
    remove_connection,
    try_connection,
)


def cmd_models_add(args: argparse.Namespace) -> int:
    try:
        params = json.loads(args.params) if args.params else None
    except ValueError:
        raise UsageError(f"--params is not JSON: {args.params!r}") from None
    kind = "litellm" if args.provider else "openai"
    add_connection(engine_of(args), args.name, kind, actor="cli", base_url=args.base_url, provider=args.provider,
                   key_env=args.key_env, params=params)
    print(f"connection {args.name} added: models are {args.name}/<model>")
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    with Session(engine_of(args)) as session:
        rows = [describe(row) for row in list_connections(session)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        key = {True: "set", False: "NOT SET", None: "no key"}[row["key set here"]]
        print(f"{row['name']:<16} {row['kind']:<8} {row['where']}  key {row['key variable']} ({key})")
    if not rows:
        print("no model connections (python -m core models add NAME --base-url URL)")
    return 0


def cmd_models_test(args: argparse.Namespace) -> int:
    result = try_connection(engine_of(args), args.name, args.model, timeout_s=args.timeout)
    print(result.words())
    return 0 if result.ok else 1


def cmd_models_remove(args: argparse.Namespace) -> int:
    remove_connection(engine_of(args), args.name, "cli")
    print(f"connection {args.name} removed")
    return 0
