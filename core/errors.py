"""Every error the studio raises on purpose: one base, shown as a one-line message by the CLI and pages.

The builtin base of each class (LookupError, ValueError, PermissionError, RuntimeError) is kept so that
code written against the builtins still catches them; `exit_code` is what the CLI returns and `http_status`
what the HTTP API answers (a subclass inherits both, so a new error needs no entry anywhere else).
"""

from __future__ import annotations


class StudioError(Exception):
    """A failure the user can act on; its message says what and why, in one line."""

    exit_code = 2
    http_status = 400


class NotFound(StudioError, LookupError):
    """A named thing (task, library, version, run, operation, user) does not exist; the message names it."""

    http_status = 404


class InvalidInput(StudioError, ValueError):
    """A setting, file, reference or request that cannot be used as given; the message says which and why."""

    http_status = 422


class BatchRefused(InvalidInput):
    """A batch refused whole, nothing stored: `problems` names each bad item as {"position" (from 1),
    "id" (the sender's, when it gave one), "reason"}; the message says the same in one line."""

    def __init__(self, problems: list[dict], *, shown: int = 5) -> None:
        self.problems = problems
        parts = [f"trace {p['position']}" + (f" (id {p['id']!r})" if p.get("id") is not None else "")
                 + f": {p['reason']}" for p in problems[:shown]]
        more = f"; and {len(problems) - shown} more" if len(problems) > shown else ""
        super().__init__("; ".join(parts) + more + "; nothing was stored")


class MalformedBody(InvalidInput):
    """A request body that cannot be decoded at all (not protobuf, not JSON, a broken gzip stream): 400."""

    http_status = 400


class BodyTooLarge(InvalidInput):
    """A request body over the API's cap, as sent or once inflated: 413."""

    http_status = 413


class UnsupportedMedia(InvalidInput):
    """A request body in a content type or encoding the route does not read: 415."""

    http_status = 415


class Conflict(StudioError, ValueError):
    """The state changed under the request (decided by someone else, already applied, wrong status)."""

    http_status = 409


class DuplicateJob(Conflict):
    """A job identical to one already queued or running (a form sent twice: Enter, a double click, a second tab);
    nothing new was queued. `kind` ("evaluation" or "run") and `existing_id` name the one to follow."""

    def __init__(self, message: str, kind: str, existing_id: int) -> None:
        super().__init__(message)
        self.kind, self.existing_id = kind, existing_id


class AlreadyDecided(Conflict):
    """The operation is no longer pending: somebody decided it first, or it was applied."""


class TakenOver(Conflict):
    """Another worker took over the job this process was executing (it stalled, or a person resumed it);
    this process stopped without writing anything more."""


class StaleVersion(Conflict):
    """A library version was created from the same parent while this change was being made; the change was
    not applied and can be re-applied on the newer version."""


class PermissionDenied(StudioError, PermissionError):
    """The acting person's role does not allow this change."""

    http_status = 403


class OutsideTask(PermissionDenied):
    """An API key bound to one task asked to read or write another's: refused, and audited for that key."""

    def __init__(self, message: str, key_id: int, key_name: str) -> None:
        super().__init__(message)
        self.key_id, self.key_name = key_id, key_name


class QuotaExceeded(StudioError, PermissionError):
    """A key has stored all it may today (TFGRPO_INGEST_KEY_DAILY_BYTES); `retry_after` is the seconds to the
    next UTC day, when its allowance starts again."""

    http_status = 429

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Unauthorized(StudioError, PermissionError):
    """A request came without a usable credential (no API key, an unknown or a revoked one)."""

    http_status = 401


class SignInLocked(PermissionDenied):
    """Too many failed sign-ins on this name; it must wait."""


class SignInRefused(PermissionDenied):
    """The identity provider signed a person in whom the studio does not let in (unknown, from another domain, an
    unverified email, switched off); the message says why and whom to ask."""


class ModelCallError(StudioError, RuntimeError):
    """A model call failed for good (after retries); the ledger holds the details."""

    exit_code = 1


class ModelUnreachable(ModelCallError):
    """Nothing answers at the model's address (the connection was refused, or its host name does not resolve):
    retrying within seconds would meet the same, so the call fails at once and its job ends with this reason."""


class StructuredOutputError(ModelCallError):
    """The model did not return the JSON that was asked for, even after repair and one more try."""

    def __init__(self, message: str, raw: str) -> None:
        super().__init__(message)
        self.raw = raw


def exit_code(exc: BaseException) -> int:
    """The CLI's exit code for an error: the class's own, else 2 for bad input, else 1."""
    if isinstance(exc, StudioError):
        return exc.exit_code
    return 2 if isinstance(exc, ValueError | LookupError | PermissionError | FileNotFoundError) else 1


_PHRASES = {
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "literal_error": "must be {expected}",
    "string_too_short": "must not be empty",
    "string_too_long": "must be at most {max_length} characters",
    "missing": "is missing",
    "extra_forbidden": "is not a known setting",
}


def describe_validation(exc: object) -> str:
    """A pydantic ValidationError as one line a person can act on: "group size must be at least 1; ..."."""
    return describe_errors(getattr(exc, "errors", lambda: [])()) or str(exc)


def describe_errors(errors: list[dict]) -> str:
    """pydantic's error dicts (their `loc` relative to what is described) as one line."""
    parts = []
    for error in errors:
        where = " ".join(str(p) for p in error.get("loc", ()) if p != "__root__").replace("_", " ")
        phrase = _PHRASES.get(error.get("type", ""))
        try:
            message = phrase.format(**error.get("ctx", {})) if phrase else None
        except (KeyError, IndexError):
            message = None
        message = message or str(error.get("msg", "invalid")).removeprefix("Value error, ")
        joined = phrase or message.startswith(("must ", "is "))
        parts.append(f"{where} {message}" if where and joined else f"{where}: {message}" if where else message)
    return "; ".join(parts)
