"""The model commands: the connections that say where models are served, and the embedded model's server."""

from __future__ import annotations

import argparse
import json

from core.cli.base import Parser, UsageError, engine_of
from core.models.local_model import MODELS
from core.settings import get_settings


def cmd_model_server(args: argparse.Namespace) -> int:
    from core.models import model_server

    configured = get_settings().model
    if not args.model and not configured.startswith(model_server.LOCAL_PREFIX):
        print(f"the studio's model is {configured}, not an embedded one: no model server needed (--model NAME "
              "serves one anyway)", flush=True)
        return 0
    name = args.model or model_server.default_model()
    if args.stop:
        print(f"model server for {name} stopped" if model_server.stop(name) else f"no model server runs for {name}",
              flush=True)
        return 0
    if args.child:
        return model_server.run_child(name, args.slots or get_settings().local_slots)
    return model_server.serve(name, args.slots, idle_exit_s=args.idle_exit, stall_s=args.stall)


def cmd_models_add(args: argparse.Namespace) -> int:
    from core.records.connections import add_connection

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
    from sqlmodel import Session

    from core.records.connections import describe, list_connections

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
    from core.records.connections import try_connection

    result = try_connection(engine_of(args), args.name, args.model, timeout_s=args.timeout)
    print(result.words())
    return 0 if result.ok else 1


def cmd_models_remove(args: argparse.Namespace) -> int:
    from core.records.connections import remove_connection

    remove_connection(engine_of(args), args.name, "cli")
    print(f"connection {args.name} removed")
    return 0


def add_connection_parsers(sub: argparse._SubParsersAction) -> None:
    """The model connections: where models are served (`<connection>/<model>` then names one)."""
    models = sub.add_parser("models", help="add, list, test or remove model connections (an OpenAI-compatible "
                            "server or a litellm provider; a model is then <connection>/<model>)")
    msub = models.add_subparsers(dest="models_command", required=True, parser_class=Parser)
    p = msub.add_parser("add", help="add a connection")
    p.add_argument("name", help="lower-case, e.g. my-vllm; models are then my-vllm/<model>")
    p.add_argument("--base-url", help="an OpenAI-compatible server's address, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--provider", help="instead of --base-url: a litellm provider (openai, anthropic, deepseek, ...)")
    p.add_argument("--key-env", metavar="VAR", help="the environment variable that holds the key (never the key)")
    p.add_argument("--params", help='default request parameters as JSON, e.g. \'{"temperature": 0.2}\'')
    p.set_defaults(func=cmd_models_add)
    p = msub.add_parser("list", help="the connections, with whether each key variable is set here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models_list)
    p = msub.add_parser("test", help="one short call through a connection: the latency and the reply, or the error")
    p.add_argument("name")
    p.add_argument("--model", required=True, help="the model name the server or provider knows")
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(func=cmd_models_test)
    p = msub.add_parser("remove", help="remove a connection")
    p.add_argument("name")
    p.set_defaults(func=cmd_models_remove)


def add_server_parser(sub: argparse._SubParsersAction) -> None:
    """The embedded model's server: one supervised process per model that every process of this machine calls."""
    p = sub.add_parser("model-server", help="run the embedded model as a supervised local server that every "
                       "process of this machine calls (one per model; `make run` starts it)")
    p.add_argument("--model", default=None, help="embedded model name (default: the studio's model if embedded, "
                   f"else {next(iter(MODELS))})")
    p.add_argument("--slots", type=int, help="requests served at once (default TFGRPO_LOCAL_SLOTS)")
    p.add_argument("--idle-exit", type=float, metavar="S", help="stop after S seconds unused (servers a process "
                   "started for itself)")
    p.add_argument("--stall", type=float, metavar="S", help="restart the server after S seconds of waiting "
                   "requests without a token (default TFGRPO_MODEL_STALL_S)")
    p.add_argument("--stop", action="store_true", help="stop the model's running server (for instance to start "
                   "it again with other TFGRPO_THREADS or slots)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_model_server)
