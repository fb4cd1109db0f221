"""Import and export of experience libraries in the formats people and other Training-Free GRPO tools use.

An experience is a dict {"id": str, "text": str}; a library is an ordered list of them. Imports return
texts only: ids are assigned by whoever stores the imported library. An import meets the limits the
learner's operations meet (core.domain.library: MAX_EXPERIENCES experiences of at most MAX_WORDS words and
MAX_CHARS characters) in a file of at most MAX_FILE_BYTES, so a library that comes in from outside can
always go into the agent's system prompt.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from core.domain import json_input
from core.domain.library import MAX_CHARS, MAX_EXPERIENCES, MAX_WORDS
from core.errors import InvalidInput

_ITEM_MARKER = re.compile(r"^(?:(?P<id>\[G?\d+\]\.?)|[-*+]|\d+[.)])(?:\s+|$)", re.IGNORECASE)
_ID_PREFIX = re.compile(r"^\[G?\d+\]\.?(?:\s+|$)", re.IGNORECASE)
_NUMBERED_KEY = re.compile(r"^\[?G?(\d+)\]?$", re.IGNORECASE)
_BRACKET_ITEM = re.compile(r"^\[G?\d+\]", re.IGNORECASE)
_HEADING_OR_FENCE = re.compile(r"^(?:#{1,6}(?:\s|$)|```)")
MB = 1024 * 1024
MAX_FILE_BYTES = 2 * MB  # 30 experiences of 500 characters are some 15 kB; this leaves room for any format


class LibraryFormatError(InvalidInput):
    """A library file that holds no experiences or cannot be parsed in any supported format."""


def check_file_size(size: int, filename: str = "") -> None:
    """Refuse a library file over MAX_FILE_BYTES; a caller holding only a path checks before reading it."""
    if size > MAX_FILE_BYTES:
        megabytes = math.ceil(size * 10 / MB) / 10
        raise LibraryFormatError(f"{filename or 'library'}: the file is {megabytes:.1f} MB; the limit for a library "
                                 f"is {MAX_FILE_BYTES / MB:g} MB")


def decode_library(data: bytes, filename: str = "") -> str:
    """An uploaded or read library file as text: the size checked first, then UTF-8 (with or without BOM)."""
    check_file_size(len(data), filename)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LibraryFormatError(f"{filename or 'library'}: not UTF-8 text (byte {exc.start}); save it as UTF-8 "
                                 "Markdown, JSON or plain text") from None


def parse_library_text(text: str, filename: str = "") -> list[str]:
    """Read experience texts from JSON (list, {"G0": ...} object, to_json output) or a Markdown/plain list.

    A plain file with no list markers at all gives one experience per non-empty line. The file size,
    the number of experiences and each one's length are checked (see the module docstring).
    """
    name = filename or "library"
    check_file_size(len(text.encode("utf-8", errors="surrogatepass")), name)
    stripped = text.lstrip("\ufeff").strip()
    if not stripped:
        raise LibraryFormatError(f"{name}: the file is empty")

    if _looks_like_json(stripped, filename):
        try:
            value = json_input.loads(stripped, name)
        except json_input.TooDeep as exc:
            raise LibraryFormatError(str(exc)) from None
        except json.JSONDecodeError as exc:
            raise LibraryFormatError(
                f"{name}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
            ) from exc
        texts = _texts_from_json(value, name)
    else:
        texts = _texts_from_list(stripped)

    texts = [t.strip() for t in texts if t.strip()]
    if not texts:
        raise LibraryFormatError(
            f"{name}: no experiences found; expected a JSON list or object, or a list with one "
            "experience per line ('- ', '* ', '1. ' or '[G0]. ')"
        )
    _check_limits(texts, name)
    return texts


def _check_limits(texts: list[str], name: str) -> None:
    """The learner's limits (core.domain.library), so an imported library is one the studio could have learned."""
    if len(texts) > MAX_EXPERIENCES:
        raise LibraryFormatError(f"{name}: {len(texts):,} experiences; an import holds at most {MAX_EXPERIENCES}, "
                                 "as many as a run lets the learner keep by default")
    for number, text in enumerate(texts, start=1):
        words = len(text.split())
        if words > MAX_WORDS or len(text) > MAX_CHARS:
            raise LibraryFormatError(f"{name}: experience {number} is too long ({words:,} words, {len(text):,} "
                                     f"characters; at most {MAX_WORDS} words / {MAX_CHARS} characters)")


def to_markdown(experiences: list[dict], title: str = "Experience library") -> str:
    """A heading and one `- [G<n>] text` line per experience, numbered as the agent sees them."""
    lines = [f"# {title}", ""]
    lines += [f"- [G{i}] {_one_line(e['text'])}" for i, e in enumerate(experiences)]
    return "\n".join(lines) + "\n"


def to_json(experiences: list[dict], meta: dict | None = None) -> str:
    """Pretty JSON {"experiences": [{"id", "text"}, ...], **meta}, keeping the stable ids."""
    meta = dict(meta or {})
    if "experiences" in meta:
        raise InvalidInput("meta must not contain the key 'experiences'")
    document = {"experiences": [{"id": str(e["id"]), "text": e["text"]} for e in experiences], **meta}
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


def to_prompt_block(experiences: list[dict]) -> str:
    """The numbered list put into the agent's system prompt, as in the paper: `[G0]. text`, one per line."""
    return "\n".join(f"[G{i}]. {_one_line(e['text'])}" for i, e in enumerate(experiences))


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _looks_like_json(stripped: str, filename: str) -> bool:
    if filename.lower().endswith(".json"):
        return True
    if stripped.startswith("{"):
        return True
    return stripped.startswith("[") and not _BRACKET_ITEM.match(stripped)


def _texts_from_json(value: Any, name: str) -> list[str]:
    if isinstance(value, list):
        texts = []
        for number, item in enumerate(value, start=1):
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, dict) and isinstance(item.get("text"), str):
                texts.append(item["text"])
            else:
                raise LibraryFormatError(
                    f"{name}: item {number} is neither a string nor an object with a string 'text'"
                )
        return texts
    if isinstance(value, dict):
        if "experiences" in value:
            if not isinstance(value["experiences"], list | dict):
                raise LibraryFormatError(f"{name}: 'experiences' must be a list or an object")
            return _texts_from_json(value["experiences"], name)
        for key, item in value.items():
            if not isinstance(item, str):
                raise LibraryFormatError(f"{name}: the value of {key!r} is not a string")
        keys = list(value)
        numbered = [(int(m[1]), key) for key in keys if (m := _NUMBERED_KEY.match(key))]
        if keys and len(numbered) == len(keys):
            keys = [key for _, key in sorted(numbered)]
        return [value[key] for key in keys]
    raise LibraryFormatError(f"{name}: expected a JSON list or object, got {type(value).__name__}")


def _texts_from_list(text: str) -> list[str]:
    """Markdown/plain list items; unmarked lines continue the item above, or stand alone if none is marked."""
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not _HEADING_OR_FENCE.match(line.strip())
    ]
    if not any(_ITEM_MARKER.match(line) for line in lines):
        return lines
    items: list[str] = []
    for line in lines:
        marker = _ITEM_MARKER.match(line)
        if marker:
            rest = line[marker.end() :]
            items.append(rest if marker["id"] else _ID_PREFIX.sub("", rest, count=1))
        elif items:
            items[-1] = f"{items[-1]} {line}"
    return items
