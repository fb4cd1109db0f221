"""Keep credentials out of what the studio stores and shows.

Keys come from environment variables. A provider URL (`--api-base`) may still carry a user name and
password or a token in its query; such a URL is stored and shown masked, and a process that must
call it reads the full URL from STUDIO_API_BASE, which stays in the environment like every other key.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from core.errors import InvalidInput

MASK = "***"
API_BASE_ENV = "STUDIO_API_BASE"
_SECRET_PARAMS = ("key", "token", "secret", "password", "passwd", "pwd", "sig", "signature", "auth", "credential")


def _secret_param(name: str) -> bool:
    name = name.lower().replace("-", "_")
    return any(part in name for part in _SECRET_PARAMS)


def mask_url(url: str | None) -> str | None:
    """The URL with its user info and secret-looking query values replaced by ***; a URL without either is
    returned as given (stripped), so only credentials change it. None stays None."""
    if not url:
        return url
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return MASK
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    has_user = bool(parts.username or parts.password)
    if not has_user and not any(_secret_param(k) for k, _ in pairs):
        return url.strip()
    netloc = (f"{MASK}@" if has_user else "") + host + (f":{port}" if port else "")
    query = urlencode([(k, MASK if _secret_param(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def has_credentials(url: str | None) -> bool:
    return bool(url) and mask_url(url) != url.strip()


def resolve_api_base(stored: str | None, full: str = "") -> str | None:
    """The URL to call for a stored (perhaps masked) api_base: itself, or `full` (the value of STUDIO_API_BASE,
    which the caller reads through core.settings.secret) when that masks to it."""
    if not stored or MASK not in stored:
        return stored
    if full and mask_url(full) == stored:
        return full
    raise InvalidInput(f"the run's api_base {stored} had credentials, which are never stored; set {API_BASE_ENV} "
                       "to the full URL in the environment of the process that runs it")
