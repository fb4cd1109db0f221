"""Listing a connection's models (core/models/connections.py::fetch_models) sends the connection's key only to the
address it was given: a redirect is not followed, and a cloud metadata address is never asked (issue 61)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from core.models.connections import fetch_models


class Server:
    """A loopback server that answers every GET with `answer(path)` -> (code, headers) and records the headers."""

    def __init__(self, answer) -> None:
        self.seen: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                server.seen.append({k.lower(): v for k, v in self.headers.items()})
                code, headers = answer(self.path)
                self.send_response(code)
                for name, value in headers.items():
                    self.send_header(name, value)
                body = b'{"data": [{"id": "m"}]}' if code == 200 else b""
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()


def test_a_redirect_is_not_followed_and_the_key_never_reaches_the_other_host(monkeypatch):
    other = Server(lambda path: (200, {}))
    redirecting = Server(lambda path: (302, {"Location": f"{other.url}/v1/models"}))
    monkeypatch.setenv("LISTING_KEY", "sk-secret-123")
    try:
        with pytest.raises(OSError, match="redirected to .*not followed"):
            fetch_models(f"{redirecting.url}/v1", "LISTING_KEY", timeout_s=5)
        assert redirecting.seen[0]["authorization"] == "Bearer sk-secret-123"
        assert other.seen == []
        assert fetch_models(f"{other.url}/v1", "LISTING_KEY", timeout_s=5) == ["m"]  # loopback itself is allowed
    finally:
        other.close()
        redirecting.close()


@pytest.mark.parametrize("host", ["169.254.169.254", "[::ffff:169.254.169.254]", "[64:ff9b::a9fe:a9fe]"])
def test_a_cloud_metadata_address_is_never_asked_for_models(host):
    with pytest.raises(OSError, match="cloud metadata address"):
        fetch_models(f"http://{host}/v1", timeout_s=1)
