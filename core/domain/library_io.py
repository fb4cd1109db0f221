"""Import and export of experience libraries in the formats people and other Training-Free GRPO tools use.

An experience is a dict {"id": str, "text": str} with a "kind" key for worked examples
(core.domain.library); a library is an ordered list of them. Imports return texts and kinds only: ids are
assigned by whoever stores the imported library. Every format keeps the kind: JSON as a "kind" key (written
for examples only, so a library of lessons exports as before), Markdown and the prompt block as a section
of their own that starts with a "Worked examples" heading, its items numbered [W0], [W1], ...; a file from
an earlier version, which has no such section, reads as all lessons. An import meets the limits the
learner's operations meet (core.domain.library: MAX_EXPERIENCES lessons of at most MAX_WORDS words and
MAX_CHARS characters, MAX_EXAMPLES examples within their own limit) in a file of at most MAX_FILE_BYTES, so
a library that comes in from outside can always go into the agent's system prompt.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from core.domain import json_input
from core.domain.library import (
    EXAMPLE,
    KINDS,
    LESSON,
    MAX_EXAMPLES_TOP_K,
    MAX_EXPERIENCES,
    examples,
    kind_of,
    lessons,
    limits,
)
from core.errors import InvalidInput

# An item's marker: the studio's `[E3].` and `- [E3]`, the paper's `[G0].` (and `[W0].` of earlier exports), or a list mark.
_ITEM_MARKER = re.compile(r"^(?:(?P<id>\[[EGW]?\d+\]\.?)|[-*+]|\d+[.)])(?:\s+|$)", re.IGNORECASE)
_ID_PREFIX = re.compile(r"^\[[EGW]?\d+\]\.?(?:\s+|$)", re.IGNORECASE)
_NUMBERED_KEY = re.compile(r"^\[?[EG]?(\d+)\]?$", re.IGNORECASE)
_BRACKET_ITEM = re.compile(r"^\[[EGW]?\d+\]", re.IGNORECASE)
_HEADING_OR_FENCE = re.compile(r"^(?:#{1,6}(?:\s|$)|```)")
# The line that opens the worked examples in Markdown ("## Worked examples") and in the prompt block
# (core.domain.prompts.EXAMPLES_INTRO starts with these words): the items after it are examples.
_EXAMPLES_HEADING = re.compile(r"^(?:#{1,6}\s+)?worked examples?\b", re.IGNORECASE)
EXAMPLES_TITLE = "Worked examples"
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
    """The experience texts of a library file (parse_library_entries without the kinds)."""
    return [item["text"] for item in parse_library_entries(text, filename)]


def parse_library_entries(text: str, filename: str = "", examples_intro: str | None = None) -> list[dict]:
    """Read entries {"text", "kind"} from JSON (list, {"G0": ...} object, to_json output) or a Markdown/plain
    list, in the file's order. `examples_intro`: a task's own line that opens the worked examples of its prompt
    block (core.domain.prompts.LibraryWording), read like the "Worked examples" heading.

    A plain file with no list markers at all gives one experience per non-empty line. The file size,
    the number of entries of each kind and each one's length are checked (see the module docstring).
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
        entries = _entries_from_json(value, name)
    else:
        entries = _entries_from_list(stripped, examples_intro)

    entries = [{"text": t.strip(), "kind": kind} for t, kind in entries if t.strip()]
    if not entries:
        raise LibraryFormatError(
            f"{name}: no experiences found; expected a JSON list or object, or a list with one "
            "experience per line ('- ', '* ', '1. ' or '[E1] ')"
        )
    _check_limits(entries, name)
    return entries


def _check_limits(entries: list[dict], name: str) -> None:
    """The learner's limits (core.domain.library), so an imported library is one the studio could have learned."""
    if len(lessons(entries)) > MAX_EXPERIENCES:
        raise LibraryFormatError(f"{name}: {len(lessons(entries)):,} experiences; an import holds at most "
                                 f"{MAX_EXPERIENCES}, as many as a run lets the learner keep by default")
    if len(examples(entries)) > MAX_EXAMPLES_TOP_K:
        raise LibraryFormatError(f"{name}: {len(examples(entries)):,} worked examples; an import holds at most "
                                 f"{MAX_EXAMPLES_TOP_K}, as many as a run keeps by default with top_k selection")
    for number, item in enumerate(entries, start=1):
        text, kind = item["text"], item["kind"]
        words, (max_words, max_chars) = len(text.split()), limits(kind)
        if words > max_words or len(text) > max_chars:
            what = "worked example" if kind == EXAMPLE else "experience"
            raise LibraryFormatError(f"{name}: {what} {number} is too long ({words:,} words, {len(text):,} "
                                     f"characters; at most {max_words} words / {max_chars} characters)")


def to_markdown(experiences: list[dict], title: str = "Experience library") -> str:
    """A heading and one `- [E3] text` line per lesson, by the entry's id as the agent sees it; worked examples
    after them under a `## Worked examples` heading, `- [E7] text`."""
    lines = [f"# {title}", ""]
    lines += [f"- [{entry_label(e, i)}] {_one_line(e['text'])}" for i, e in enumerate(lessons(experiences))]
    if examples(experiences):
        lines += ["", f"## {EXAMPLES_TITLE}", ""]
        lines += [f"- [{entry_label(e, i)}] {_one_line(e['text'])}" for i, e in enumerate(examples(experiences))]
    return "\n".join(lines) + "\n"


def to_json(experiences: list[dict], meta: dict | None = None) -> str:
    """Pretty JSON {"experiences": [{"id", "text"}, ...], **meta}, keeping the stable ids and, for a worked
    example, its "kind"."""
    meta = dict(meta or {})
    if "experiences" in meta:
        raise InvalidInput("meta must not contain the key 'experiences'")
    items = [{"id": str(e["id"]), "text": e["text"], **({"kind": kind_of(e)} if kind_of(e) != LESSON else {})}
             for e in experiences]
    document = {"experiences": items, **meta}
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


def to_prompt_block(experiences: list[dict]) -> str:
    """The list put into the agent's system prompt, one entry a line as in the paper (`[G0]. text` there), each
    by its stable id: `[E3] text`, as the pages, the Markdown export and the learner's prompts write it (no period
    after the id: "[E3]." read as a stray full stop). The id is what the pages, the learner's prompts, a review,
    the HTTP API's `entries` and a trace's feedback call the entry, so the agent's "I used E3" names the same one;
    the paper's renumbering G0, G1, ... would name a different entry under another version or another query's
    selection. A block pasted from an earlier version, `[E3]. text`, still reads back (_ITEM_MARKER)."""
    return "\n".join(f"[{entry_label(e, i)}] {_one_line(e['text'])}" for i, e in enumerate(experiences))


def entry_label(entry: dict, position: int) -> str:
    """An entry's id as the prompt and the exports show it; entries without one (texts given without ids) are
    numbered E1, E2, ... by position, as a new library numbers them."""
    return str(entry.get("id") or f"E{position + 1}")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _looks_like_json(stripped: str, filename: str) -> bool:
    if filename.lower().endswith(".json"):
        return True
    if stripped.startswith("{"):
        return True
    return stripped.startswith("[") and not _BRACKET_ITEM.match(stripped)


def _entries_from_json(value: Any, name: str) -> list[tuple[str, str]]:
    """(text, kind) pairs; an item's "kind" (absent in files from earlier versions: a lesson) must be known."""
    if isinstance(value, list):
        entries = []
        for number, item in enumerate(value, start=1):
            if isinstance(item, str):
                entries.append((item, LESSON))
            elif isinstance(item, dict) and isinstance(item.get("text"), str):
                kind = item.get("kind") or LESSON
                if kind not in KINDS:
                    raise LibraryFormatError(f"{name}: item {number} has kind {kind!r}; an entry is a "
                                             f"{' or an '.join(KINDS)}")
                entries.append((item["text"], kind))
            else:
                raise LibraryFormatError(
                    f"{name}: item {number} is neither a string nor an object with a string 'text'"
                )
        return entries
    if isinstance(value, dict):
        if "experiences" in value:
            if not isinstance(value["experiences"], list | dict):
                raise LibraryFormatError(f"{name}: 'experiences' must be a list or an object")
            return _entries_from_json(value["experiences"], name)
        for key, item in value.items():
            if not isinstance(item, str):
                raise LibraryFormatError(f"{name}: the value of {key!r} is not a string")
        keys = list(value)
        numbered = [(int(m[1]), key) for key in keys if (m := _NUMBERED_KEY.match(key))]
        if keys and len(numbered) == len(keys):
            keys = [key for _, key in sorted(numbered)]
        return [(value[key], LESSON) for key in keys]
    raise LibraryFormatError(f"{name}: expected a JSON list or object, got {type(value).__name__}")


def _entries_from_list(text: str, examples_intro: str | None = None) -> list[tuple[str, str]]:
    """Markdown/plain list items with their kind; unmarked lines continue the item above, or stand alone if
    none is marked. A "Worked examples" heading (Markdown's `## Worked examples`, the prompt block's line, or the
    task's own `examples_intro`) makes the items after it examples; any other Markdown heading makes them
    lessons again."""
    lines: list[tuple[str, str]] = []
    kind = LESSON
    intro = _one_line(examples_intro or "")
    for raw in text.splitlines():
        line = raw.strip()
        if _EXAMPLES_HEADING.match(line) or (intro and _one_line(line) == intro):
            kind = EXAMPLE
        elif line.startswith("#") and _HEADING_OR_FENCE.match(line):
            kind = LESSON
        elif line and not _HEADING_OR_FENCE.match(line):
            lines.append((line, kind))
    if not any(_ITEM_MARKER.match(line) for line, _ in lines):
        return lines
    items: list[tuple[str, str]] = []
    for line, kind in lines:
        marker = _ITEM_MARKER.match(line)
        if marker:
            rest = line[marker.end() :]
            items.append((rest if marker["id"] else _ID_PREFIX.sub("", rest, count=1), kind))
        elif items and items[-1][1] == kind:
            items[-1] = (f"{items[-1][0]} {line}", kind)
    return items
