"""The worker command: execute queued runs and evaluations. Its own module, apart from the job commands,
so that a worker starts without the training and evaluation code (litellm among it), which core.jobs.worker
imports only when a job comes (tests/test_cli_imports.py: `worker --once` on an empty queue)."""

from __future__ import annotations

import argparse
import logging
import sys

from core.cli.base import engine_of
from core.cli.logs import configure_logging
from core.jobs.worker import serve
from storage.db import describe_url


def cmd_worker(args: argparse.Namespace) -> int:
    configure_logging(logging.INFO)  # the worker's own progress; other libraries' only from WARNING up
    engine = engine_of(args)
    print(f"worker on {describe_url(str(engine.url))}", file=sys.stderr, flush=True)
    done = serve(engine, poll=args.poll, once=args.once)
    print(f"worker stopped after {done} job(s)", file=sys.stderr)
    return 0
