"""The experience library and its operations: render, validate, apply.

Pure functions over lists of {"id": "E3", "text": "..."}; storing versions is core.records.versions' job.
Ids are stable across versions so that a reviewer, a diff and the learner all talk about the same
experience; the agent sees them renumbered as [G0], [G1], ... as in the paper.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

OPS = ("ADD", "MODIFY", "DELETE", "MERGE", "KEEP")
MAX_WORDS = 64  # the longest experience, in words and in characters: the learner's and a person's edits
MAX_CHARS = 500
MAX_EXPERIENCES = 30  # the most a library holds by default (RunSettings.max_experiences); an import's limit


@dataclass
class ProposedOp:
    """One operation as the learner (or a reviewer) wrote it."""

    op: str
    target_ids: list[str] = field(default_factory=list)
    text: str | None = None
    rationale: str = ""


@dataclass
class CheckedOp:
    op: ProposedOp
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.error is None


def normalize_text(text: str) -> str:
    """Text as compared for duplicates: case, spacing and end punctuation do not count."""
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", "", text.lower())).strip()


def experience_texts(experiences: list[dict] | None) -> list[str]:
    """What the agent sees of a library (its prompt numbers the texts; ids never reach it): two libraries
    with the same texts in the same order measure the same."""
    return [e["text"] for e in experiences or []]


def render_for_learner(experiences: list[dict]) -> str:
    """The library with stable ids, so operations can name their targets."""
    return "\n".join(f"[{exp['id']}] {exp['text']}" for exp in experiences) or "(the library is empty)"


def _text_error(text: str | None, max_words: int, max_chars: int) -> str | None:
    if not text or not text.strip():
        return "empty text"
    if re.fullmatch(r"\s*<[^<>]*>\s*", text):
        return "a placeholder, not an experience"
    if len(re.findall(r"[^\W\d_]{2,}", text)) < 3:
        return "too short to be an experience (fewer than 3 words)"
    words = len(text.split())
    if words > max_words or len(text) > max_chars:
        return f"text too long ({words} words, {len(text)} characters; at most {max_words} words / {max_chars})"
    return None


def validate_ops(
    experiences: list[dict],
    ops: list[ProposedOp],
    *,
    max_words: int = MAX_WORDS,
    max_chars: int = MAX_CHARS,
    max_size: int | None = None,
) -> list[CheckedOp]:
    """Check each operation against the library as the earlier valid operations leave it.

    Rejected for: an unknown op, unknown or already-changed target ids, empty or over-long text,
    text that duplicates an existing experience or an earlier operation of the batch, an ADD that
    would grow the library past `max_size`.
    """
    size = len(experiences)
    known = {exp["id"]: normalize_text(exp["text"]) for exp in experiences}
    touched: set[str] = set()
    seen_texts = set(known.values())
    checked: list[CheckedOp] = []
    for op in ops:
        kind = (op.op or "").upper()
        ids = [str(i) for i in op.target_ids]
        error: str | None = None
        if kind not in OPS:
            error = f"unknown operation {op.op!r}"
        elif kind == "KEEP":
            error = None
        else:
            unknown = [i for i in ids if i not in known]
            again = [i for i in ids if i in touched]
            need = {"ADD": (0, 0), "MODIFY": (1, 1), "DELETE": (1, None), "MERGE": (2, None)}[kind]
            if unknown:
                error = f"unknown experience id {', '.join(unknown)}"
            elif again:
                error = f"{', '.join(again)} already changed by an earlier operation of this batch"
            elif len(ids) < need[0] or (need[1] is not None and len(ids) > need[1]):
                error = f"{kind} takes {'no' if need[0] == 0 else need[0]} target id(s), got {len(ids)}"
            elif len(set(ids)) != len(ids):
                error = "the same id is named twice"
            elif kind != "DELETE":
                error = _text_error(op.text, max_words, max_chars)
                if error is None and normalize_text(op.text or "") in seen_texts:
                    error = "duplicates an existing experience"
        if error is None and kind == "ADD" and max_size is not None and size >= max_size:
            error = f"the library is full ({max_size} experiences): merge or delete first"
        if error is None:
            size += {"ADD": 1, "DELETE": -len(ids), "MERGE": 1 - len(ids)}.get(kind, 0)
        if error is None and kind in ("ADD", "MODIFY", "MERGE"):
            seen_texts.add(normalize_text(op.text or ""))
        if error is None and kind != "KEEP":
            touched.update(ids)
        checked.append(CheckedOp(op=ProposedOp(kind, ids, op.text, op.rationale), error=error))
    return checked


def next_id_number(all_ids: list[str]) -> int:
    """The next free number for E<n> ids, given every id the library ever used."""
    numbers = [int(m.group(1)) for i in all_ids if (m := re.fullmatch(r"E(\d+)", str(i)))]
    return max(numbers, default=0) + 1


def apply_ops(experiences: list[dict], ops: list[ProposedOp], first_new_id: int) -> list[dict]:
    """The next library: valid operations applied in order (validate first).

    MODIFY keeps the id and place; MERGE puts the merged text at the place of its first target
    under a new id; ADD appends under a new id.
    """
    result = [dict(exp) for exp in experiences]
    counter = first_new_id
    for op in ops:
        kind = op.op.upper()
        if kind == "ADD":
            result.append({"id": f"E{counter}", "text": op.text.strip()})
            counter += 1
        elif kind == "MODIFY":
            for exp in result:
                if exp["id"] == op.target_ids[0]:
                    exp["text"] = op.text.strip()
        elif kind == "DELETE":
            result = [exp for exp in result if exp["id"] not in op.target_ids]
        elif kind == "MERGE":
            position = min(i for i, exp in enumerate(result) if exp["id"] in op.target_ids)
            result = [exp for exp in result if exp["id"] not in op.target_ids]
            result.insert(position, {"id": f"E{counter}", "text": op.text.strip()})
            counter += 1
    return result


def diff(old: list[dict], new: list[dict]) -> list[dict]:
    """What changed between two versions, per experience id: added, removed, changed."""
    before = {exp["id"]: exp["text"] for exp in old}
    after = {exp["id"]: exp["text"] for exp in new}
    changes = [{"change": "removed", "id": i, "before": t, "after": None} for i, t in before.items() if i not in after]
    for i, text in after.items():
        if i not in before:
            changes.append({"change": "added", "id": i, "before": None, "after": text})
        elif before[i] != text:
            changes.append({"change": "changed", "id": i, "before": before[i], "after": text})
    return changes
