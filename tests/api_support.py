"""A real API process for tests: `python -m core serve` on a free loopback port over a test database."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from storage.db import url_with_password
from tests.ui_support import ROOT


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def api_server(engine, port: int | None = None, extra_env: dict | None = None,
               command: tuple[str, ...] = ("core", "serve")) -> Iterator[str]:
    """The API's base URL while its process runs (`python -m core serve`, or `command=("api",)` for
    `python -m api`); stopped afterwards."""
    port = port or free_port()
    env = {**os.environ, "DATABASE_URL": url_with_password(engine), "PYTHONPATH": str(ROOT), **(extra_env or {})}
    server = subprocess.Popen([sys.executable, "-m", *command, "--port", str(port)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, server.stderr.read()
            assert time.monotonic() < deadline, "the API did not come up"
            time.sleep(0.2)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)
