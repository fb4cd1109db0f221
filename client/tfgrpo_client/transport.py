"""JSON over urllib: one request, one answer the callers can decide on.

The client promises that the agent never fails because the studio is down, so every way a request can go
wrong ends here as one of two things: a `Response` (the studio answered, with whatever status) or
`Unreachable` (it did not: refused, reset, timed out, no answer in time). The callers then choose between
the cached copy, a retry, or a loud `ClientError` for the developer's own configuration mistakes.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

USER_AGENT = "tfgrpo-client/0.1.0"
TRANSIENT_STATUSES = frozenset({408, 429})


class ClientError(Exception):
    """The studio refused a request for a reason a developer must fix (an unknown, revoked or missing API
    key, a key without the right role, a task or library that does not exist): raised, never swallowed, when
    there is no cached copy or fallback to serve instead."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Unreachable(Exception):
    """No usable answer from the studio: a connection error, a timeout, or a body that is not its JSON.
    `retry_after` is the server's own hint in seconds when it gave one (429 / 503)."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Response:
    """What the studio answered: the status, the headers (lower-cased names) and the parsed JSON body
    (None for an empty body or one that is not JSON)."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def transient(self) -> bool:
        """A status worth retrying later: the server is overloaded, restarting or rate-limiting us."""
        return self.status in TRANSIENT_STATUSES or self.status >= 500

    @property
    def message(self) -> str:
        """The studio's `{"error": ...}` message, or the bare status when the body has none."""
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), str):
            return f"HTTP {self.status}: {self.body['error']}"
        if 300 <= self.status < 400 and self.header("Location"):
            return f"HTTP {self.status}: redirected to {self.header('Location')} (use that address as the URL)"
        return f"HTTP {self.status}"

    @property
    def retry_after(self) -> float | None:
        return parse_retry_after(self.header("Retry-After"))


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header: delay-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:  # Python < 3.10 returns None instead of raising
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed: urllib would turn a POST into a GET without its body, and would carry the
    Authorization header to wherever the Location points. A 3xx becomes an answer the caller reports."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[override]
        return None


class Transport:
    """Requests to one studio with one API key; safe to share between threads (each call opens its own
    connection, so a hung request never holds up another)."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"the studio URL must look like http://host:port, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(_NoRedirect())

    def url(self, path: str, query: dict[str, str] | None = None) -> str:
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        return url

    def request(self, method: str, path: str, *, query: dict[str, str] | None = None, body: Any = None,
                headers: dict[str, str] | None = None) -> Response:
        """Send one request; returns the studio's answer whatever its status, raises `Unreachable` when there
        is none. Never raises anything else for a network problem, and never puts the key in a message."""
        data = None if body is None else json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        request = urllib.request.Request(self.url(path, query), data=data, method=method)
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", USER_AGENT)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self._api_key:
            request.add_header("Authorization", f"Bearer {self._api_key}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        started = time.monotonic()
        try:
            try:
                with self._opener.open(request, timeout=self.timeout_s) as answer:
                    status, raw_headers, raw = answer.status, answer.headers, answer.read()
            except urllib.error.HTTPError as error:  # any status outside 2xx, 304 included
                status, raw_headers = error.code, error.headers
                try:
                    raw = error.read()
                finally:
                    error.close()
        except (OSError, http.client.HTTPException) as error:  # URLError, refused, reset, timeout
            reason = getattr(error, "reason", None) or error
            took = time.monotonic() - started
            raise Unreachable(f"{method} {self.base_url}{path}: {reason} (after {took:.1f} s)") from None
        return Response(status=status, headers={k.lower(): v for k, v in (raw_headers or {}).items()},
                        body=_json_or_none(raw))


def _json_or_none(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
