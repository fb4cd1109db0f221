"""`python -m api [--port 8502]`: serve the HTTP API with uvicorn, on loopback only.

API keys (issue 16) are not built yet, so nothing may reach the API from another machine: a host other
than a loopback address is refused rather than served without authentication.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8502)
    args = parser.parse_args(argv)
    try:
        loopback = args.host == "localhost" or ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        print(f"error: the API has no API keys yet, so it listens on loopback only (not {args.host})", file=sys.stderr)
        return 2
    import uvicorn

    from api.app import create_app
    from core.settings import engine

    print(f"API on http://{args.host}:{args.port}/v1 (docs at /docs)", file=sys.stderr)
    uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
