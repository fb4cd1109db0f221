"""Final-answer extraction and normalisation for agent outputs.

Rewards, majority voting and the review UI all need "the answer" an agent gave, so the
heuristics live in one place and behave identically everywhere.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["extract_final_answer", "normalize_answer"]

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_RE = re.compile(r"\banswer\s*(?:\*\*)?\s*:", re.IGNORECASE)
# A minus sign right after a word character or ")" is subtraction ("5-3"), not a negative number.
_NUMBER_RE = re.compile(r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)")
_PLAIN_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_TEXT_WRAP_RE = re.compile(r"^\\(?:text|textbf|mathrm|mathbf)\s*\{(.*)\}$", re.DOTALL)


def _balanced_group(text: str, open_idx: int) -> str | None:
    """Return the content of the brace group opening at ``open_idx``, or None if it never closes."""
    depth = 0
    for i in range(open_idx, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_idx + 1 : i]
    return None


def _last_boxed(text: str) -> str | None:
    for match in reversed(list(_BOX_RE.finditer(text))):
        content = _balanced_group(text, match.end() - 1)
        if content is not None:
            return content.strip()
    return None


def _clean_inline(value: str) -> str:
    """Strip the markdown/LaTeX decoration models put around a stated answer."""
    previous = None
    while value != previous:
        previous = value
        value = value.strip().strip("*").strip("$").strip()
        if value.startswith("\\(") and value.endswith("\\)"):
            value = value[2:-2]
        value = value.rstrip(".").strip()
    return value


def _after_answer_label(text: str) -> str | None:
    matches = list(_ANSWER_RE.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end() :]
    for line in rest.splitlines():
        value = _clean_inline(line)
        if value:
            return value
    return None


def _last_number(text: str) -> str | None:
    matches = _NUMBER_RE.findall(text)
    if not matches:
        return None
    return matches[-1].replace(",", "")


def extract_final_answer(text: str) -> str | None:
    """Pull the final answer out of free text, preferring the most explicit marker.

    Order: last ``\\boxed{}``/``\\fbox{}``, then the text after the last "answer:" label,
    then the last number; None when nothing looks like an answer.
    """
    if not text:
        return None
    for finder in (_last_boxed, _after_answer_label, _last_number):
        value = finder(text)
        if value:
            return value
    return None


def _canonical_number(value: str) -> str | None:
    candidate = value.replace(",", "") if _THOUSANDS_RE.fullmatch(value) else value
    if not _PLAIN_NUMBER_RE.fullmatch(candidate):
        return None
    try:
        number = Decimal(candidate)
    except InvalidOperation:
        return None
    if number.adjusted() > 30:
        return str(number.normalize())
    if number == number.to_integral_value():
        return str(int(number))
    return format(number.normalize(), "f")


def normalize_answer(ans: str | None) -> str | None:
    """Canonical form for string comparison, so "12.0", "$12$" and "12." all compare equal.

    Returns None for missing or blank answers so two empty answers never count as agreement.
    """
    if ans is None:
        return None
    value = ans
    previous = None
    while value != previous:
        previous = value
        value = value.strip().strip("$").strip()
        wrapped = _TEXT_WRAP_RE.match(value)
        if wrapped:
            value = wrapped.group(1)
        value = value.rstrip(".").strip()
    if not value:
        return None
    number = _canonical_number(value)
    if number is not None:
        return number
    return " ".join(value.lower().split())
