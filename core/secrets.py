"""Keep credentials out of what the studio stores and shows.

Keys come from environment variables. A provider URL (`--api-base`) may still carry a user name and
password or a token in its query; such a URL is stored and shown masked, and a process that must
call it reads the full URL from STUDIO_API_BASE, which stays in the environment like every other key.

A secret the studio itself must use (a webhook's signing secret) is stored sealed: encrypted with a key the
caller hands in (core/records/notifications/secret_key.py finds it: TFGRPO_SECRET_KEY, or a key file made with mode 0600).
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


# ---- secrets the studio must keep (a webhook's signing secret), encrypted at rest ---------------------------------

SEALED = "fernet:"
KEY_ENV = "TFGRPO_SECRET_KEY"


def key_list(key: str | None) -> list[str]:
    """The keys a key setting holds, newest first: comma- or line-separated (a rotation keeps the old one after the
    new one until every secret is sealed again: `python -m core secrets rotate`)."""
    return [part.strip() for part in (key or "").replace("\n", ",").split(",") if part.strip()]


def _fernet(key: str | None):
    """A MultiFernet over the setting's keys: the first seals, every one opens."""
    from cryptography.fernet import Fernet, MultiFernet

    if not key_list(key):
        raise InvalidInput(f"the key that decrypts stored secrets is missing: set {KEY_ENV} or restore the key file "
                           "(TFGRPO_SECRET_KEY_FILE) this database's secrets were encrypted with")
    try:
        return MultiFernet([Fernet(part.encode()) for part in key_list(key)])
    except ValueError:
        raise InvalidInput(f"the secret key ({KEY_ENV} or the key file) is not a Fernet key: 32 url-safe base64 "
                           "bytes, e.g. from `python -c 'from cryptography.fernet import Fernet; "
                           "print(Fernet.generate_key().decode())'`") from None


def new_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


def seal(text: str, key: str | None) -> str:
    """`text` encrypted for storing (Fernet: AES with an HMAC), so a copy of the database alone reveals nothing."""
    return SEALED + _fernet(key).encrypt(text.encode()).decode()


def is_sealed(stored: str | None) -> bool:
    return bool(stored) and stored.startswith(SEALED)


def unseal(stored: str, key: str | None) -> str:
    """The secret a stored value holds: decrypted, or as it is when stored before encryption (until `python -m
    core migrate` seals it); InvalidInput when the key is missing or is not the one it was sealed with."""
    if not is_sealed(stored):
        return stored
    from cryptography.fernet import InvalidToken

    try:
        return _fernet(key).decrypt(stored.removeprefix(SEALED).encode()).decode()
    except InvalidToken:
        raise InvalidInput(f"a stored secret does not decrypt with this key ({KEY_ENV} or the key file): it was "
                           "encrypted with another one; restore that key") from None


def reseal(stored: str, key: str | None) -> str:
    """A sealed value sealed again under the setting's first key (MultiFernet.rotate), readable by it alone."""
    if not is_sealed(stored):
        return seal(stored, key)
    from cryptography.fernet import InvalidToken

    try:
        return SEALED + _fernet(key).rotate(stored.removeprefix(SEALED).encode()).decode()
    except InvalidToken:
        raise InvalidInput(f"a stored secret does not decrypt with any of the keys ({KEY_ENV} or the key file): "
                           "restore the key it was sealed with") from None


def key_problem(key: str | None) -> str | None:
    """Why stored secrets could not be decrypted with `key` (none, or not a Fernet key), or None."""
    try:
        _fernet(key)
    except InvalidInput as exc:
        return str(exc)
    return None
