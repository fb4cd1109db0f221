"""Passwords kept only as salted scrypt hashes whose cost figures travel with them.

A hash made with older figures still verifies and is remade at the next sign-in (core.records.people.sign_in); a stored
hash asking for absurd figures is refused rather than allowed to take gigabytes, and at most two hashes run at once
per process, so a burst of sign-ins waits instead of taking all the memory.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading

# scrypt's cost: N=2^17, r=8, p=1 (OWASP's password storage guidance) takes ~0.4 s and 128 MiB per hash.
# Hashes made with other figures still verify and are remade with these at the next sign-in.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**17, 8, 1
_MAX_N, _MAX_R, _MAX_P = 2**20, 32, 16  # a stored hash asking for more is refused, not allowed to take GiBs
# At most this many hashes at once per process: a burst of sign-ins waits instead of taking all the memory.
_HASHING = threading.BoundedSemaphore(2)
MIN_LENGTH = 8


def hash_password(password: str) -> str:
    """A salted scrypt hash at today's cost, as `scrypt$N$r$p$salt$digest` (the figures travel with it)."""
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    """scrypt with room for its memory (128·r·N bytes: hashlib's default limit of 32 MiB is too small for N=2^17)."""
    with _HASHING:
        return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=32,
                              maxmem=2 * 128 * r * (n + p + 2))


def _parameters(stored: str) -> tuple[int, int, int, bytes, str] | None:
    """N, r, p, salt and digest of a stored hash; None for anything that is not a sane scrypt hash."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        n, r, p, raw_salt = int(n), int(r), int(p), bytes.fromhex(salt)
    except (ValueError, TypeError, AttributeError):
        return None
    sane = scheme == "scrypt" and 1 < n <= _MAX_N and n & (n - 1) == 0 and 0 < r <= _MAX_R and 0 < p <= _MAX_P
    return (n, r, p, raw_salt, digest) if sane and raw_salt and digest else None


def check_password(password: str, stored: str) -> bool:
    """Whether `password` matches the stored hash, whatever scrypt figures it was made with."""
    found = _parameters(stored)
    if found is None:
        return False
    n, r, p, salt, digest = found
    try:
        got = _scrypt(password, salt, n, r, p)
    except ValueError:  # OpenSSL could not run it (e.g. no memory): no match, counted as a failure
        return False
    return hmac.compare_digest(got.hex(), digest)


def needs_rehash(stored: str) -> bool:
    """Whether a hash was made with other scrypt figures than today's (it is remade at the next sign-in)."""
    found = _parameters(stored)
    return found is None or found[:3] != (SCRYPT_N, SCRYPT_R, SCRYPT_P)


def dummy_hash() -> str:
    """A hash no password matches, at today's cost: an unknown name takes as long to refuse as a wrong password."""
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${'00' * 16}${'00' * 32}"
