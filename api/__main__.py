"""`python -m api [--host 127.0.0.1] [--port 8502]` (also `python -m core serve`): serve the HTTP API with uvicorn.

Every route but /v1/health needs an API key. Without sign-in (no user accounts: the single local user, who
is admin on every page) the API listens on loopback only and says so, because whoever reaches the studio
could then make themselves keys; with sign-in on, a host such as 0.0.0.0 is allowed (put TLS in front).
"""

from __future__ import annotations

import argparse
import ipaddress
import sys


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    from core.settings import get_settings

    settings = get_settings()
    parser = argparse.ArgumentParser(prog="python -m api", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=settings.api_port)
    args = parser.parse_args(argv)

    from sqlmodel import Session

    from core.records.people.roles import sign_in_required
    from core.settings import engine

    with Session(engine()) as session:
        signed = sign_in_required(session)
    if not signed and not is_loopback(args.host):
        print(f"error: sign-in is off (no user accounts), so the API listens on loopback only, not {args.host}; "
              "add an admin with `python -m core user add` first", file=sys.stderr)
        return 2
    import uvicorn

    from api.app import create_app

    where = "" if signed else " (loopback only: sign-in is off)"
    print(f"API on http://{args.host}:{args.port}/v1{where}; docs at /docs; OpenTelemetry exporters: "
          f"OTEL_EXPORTER_OTLP_ENDPOINT=http://{args.host}:{args.port}/otlp", file=sys.stderr, flush=True)
    app = create_app(engine, max_body_bytes=settings.api_max_body_bytes, rate_per_minute=settings.api_rate_per_minute)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
