"""The model-server command: the embedded model as a supervised local server. Its own module, apart from the
model connections, so that the long-running server process loads no database code."""

from __future__ import annotations

import argparse

from core.models import model_server
from core.settings import get_settings


def cmd_model_server(args: argparse.Namespace) -> int:
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
