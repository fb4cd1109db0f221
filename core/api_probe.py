"""Whether the studio's HTTP API answers on a port: one short request, for the sidebar. Kept out of
core.records, whose modules read and write what is stored and call no network."""

from __future__ import annotations

import urllib.request


def api_status(port: int, host: str = "127.0.0.1", timeout_s: float = 0.3) -> str:
    """The API's address and whether it answers, in words, for the sidebar and `make run`'s users."""
    url = f"http://{host}:{port}"
    try:
        with urllib.request.urlopen(f"{url}/v1/health", timeout=timeout_s) as response:
            up = response.status == 200
    except OSError:
        up = False
    return f"{url}/v1 (docs at /docs)" if up else f"not running on port {port}: python -m core serve"
