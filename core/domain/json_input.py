"""Reading JSON that a person handed in (dataset, library and task files): nesting is checked first.

Python's json parser recurses once per `[` or `{`, so a file of 100,000 brackets ends in a
RecursionError with a traceback instead of a message. Every reader of user files goes through
`loads` here, which refuses anything nested deeper than MAX_DEPTH before parsing it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from core.errors import InvalidInput

MAX_DEPTH = 100  # far beyond any real dataset, task or library file; far below the interpreter's limit
# A JSON string (an unterminated one runs to the end, as the parser reads it), or one bracket.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class TooDeep(InvalidInput):
    """JSON nested more than MAX_DEPTH levels; the message says where, in one line."""


def too_deep(where: str, max_depth: int = MAX_DEPTH) -> TooDeep:
    return TooDeep(f"{where} is nested more than {max_depth} levels deep")


def depth(text: str, stop_after: int = MAX_DEPTH) -> int:
    """How deep the brackets of `text` nest outside strings; counting stops just past `stop_after`."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    level = deepest = 0
    for char in brackets:
        level += 1 if char in "[{" else -1
        if level > deepest:
            deepest = level
            if deepest > stop_after:
                break
    return deepest


def check_depth(text: str, where: str, max_depth: int = MAX_DEPTH) -> None:
    """Raise TooDeep ("<where> is nested more than N levels deep") for text nested deeper than max_depth."""
    if depth(text, max_depth) > max_depth:
        raise too_deep(where, max_depth)


def loads(text: str, where: str, **kwargs: Any) -> Any:
    """json.loads after the nesting check; `where` names the file (and line) in the message.

    json.JSONDecodeError passes through for the caller to word; a RecursionError that gets past the
    check anyway (a deep call stack) is reported as the same TooDeep.
    """
    check_depth(text, where)
    try:
        return json.loads(text, **kwargs)
    except RecursionError:
        raise too_deep(where) from None
