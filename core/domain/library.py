"""The experience library and its operations: render, validate, apply.

Pure functions over lists of {"id": "E3", "text": "...", "kind": "example"}; storing versions is
core.records.library.versions' job. Ids are stable across versions so that a reviewer, a diff and the learner all
talk about the same experience; the agent sees them by the same ids (`[E3] text`), where the paper renumbers
them [G0], [G1], ... (core.domain.library_io.to_prompt_block).

An entry has a kind: a `lesson` (the paper's experience: a short general rule) or an `example` (a worked
example: a problem in brief and the steps that reached its right answer, verified by the task's reward
before it was proposed). A small agent gains from worked examples where abstract lessons do nothing
(DESIGN §8, "A small agent learns knowledge, not reasoning"), and an example needs more words than a rule,
so each kind has its own length limit. The kind is a key of the entry itself and only written for
examples: a library stored before kinds existed reads as all lessons, with no migration.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

OPS = ("ADD", "MODIFY", "DELETE", "MERGE", "KEEP")
MAX_WORDS = 64  # the longest experience, in words and in characters: the learner's and a person's edits
MAX_CHARS = 500
MAX_EXPERIENCES = 30  # the most a library holds by default (RunSettings.max_experiences); an import's limit
LESSON, EXAMPLE = "lesson", "example"
KINDS = (LESSON, EXAMPLE)
# A worked example holds a problem in brief and the steps to its answer: some 120 words, not a rule's 32.
EXAMPLE_MAX_WORDS = 120
EXAMPLE_MAX_CHARS = 1000
MAX_EXAMPLES = 6  # the most worked examples a library holds by default (RunSettings.max_examples) when all are shown
# With top_k selection a query is shown its few nearest entries (selection.DEFAULT_K), so size costs no prompt
# length; the cap is as large as retrieval stays no worse than at 6: bench/retrieval_cap.py measured, with top_k 2,
# 11-14 of 16 held-out messages shown every fact of their reference from 8 to 28 examples (9 of 16 at 6; with
# top_k 3, 14-16 from 8 on). Also an import's limit.
MAX_EXAMPLES_TOP_K = 24


def replaced_ids(op: str, target_ids: list[str]) -> list[str]:
    """The existing entries an operation rewrites or removes (MODIFY, MERGE, DELETE): the ones whose measured
    effect (leave-one-out) a reviewer should read beside it. ADD and KEEP replace none."""
    return list(target_ids) if (op or "").upper() in ("MODIFY", "MERGE", "DELETE") else []


def kind_of(entry: dict) -> str:
    """An entry's kind; an entry without one (every library stored before kinds existed) is a lesson."""
    return entry.get("kind") or LESSON


def entry(entry_id: str, text: str, kind: str = LESSON) -> dict:
    """A library entry as stored: the kind key is written for examples only, so a library of lessons is
    stored (and exported, and compared) exactly as before kinds existed."""
    return {"id": entry_id, "text": text} if kind == LESSON else {"id": entry_id, "text": text, "kind": kind}


def limits(kind: str) -> tuple[int, int]:
    """The most words and characters an entry of this kind may have."""
    return (EXAMPLE_MAX_WORDS, EXAMPLE_MAX_CHARS) if kind == EXAMPLE else (MAX_WORDS, MAX_CHARS)


@dataclass
class ProposedOp:
    """One operation as the learner (or a reviewer) wrote it."""

    op: str
    target_ids: list[str] = field(default_factory=list)
    text: str | None = None
    rationale: str = ""
    # None: the kind of its targets (a MODIFY or MERGE keeps it), a lesson for an ADD. validate_ops fills it in.
    kind: str | None = None


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
    with the same texts of the same kinds in the same order measure the same (an example is shown apart from
    the lessons, so the same text as a lesson is another prompt)."""
    return [e["text"] if kind_of(e) == LESSON else f"{kind_of(e)}: {e['text']}" for e in experiences or []]


def lessons(experiences: list[dict] | None) -> list[dict]:
    return [e for e in experiences or [] if kind_of(e) == LESSON]


def examples(experiences: list[dict] | None) -> list[dict]:
    return [e for e in experiences or [] if kind_of(e) == EXAMPLE]


def render_for_learner(experiences: list[dict]) -> str:
    """The library's lessons with stable ids, so operations can name their targets. Worked examples are left
    out: they are chosen by the reward from successful rollouts, not written by the learner, and ten of them
    would bury the lessons the learner consolidates (people edit and delete them on Review and Library)."""
    return "\n".join(f"[{exp['id']}] {exp['text']}" for exp in lessons(experiences)) or "(the library is empty)"


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
    max_examples: int | None = None,
) -> list[CheckedOp]:
    """Check each operation against the library as the earlier valid operations leave it.

    Rejected for: an unknown op or kind, unknown or already-changed target ids, empty text or text over its
    kind's limit (`max_words` / `max_chars` for lessons, EXAMPLE_MAX_WORDS / EXAMPLE_MAX_CHARS for examples),
    a MODIFY or MERGE that would change the kind of its targets (or merge a lesson with an example), text
    that duplicates an existing experience or an earlier operation of the batch, an ADD that would grow the
    lessons past `max_size` or the examples past `max_examples`. Each checked op carries its kind.
    """
    kinds = {exp["id"]: kind_of(exp) for exp in experiences}
    size = {LESSON: len(lessons(experiences)), EXAMPLE: len(examples(experiences))}
    known = {exp["id"]: normalize_text(exp["text"]) for exp in experiences}
    touched: set[str] = set()
    seen_texts = set(known.values())
    checked: list[CheckedOp] = []
    for op in ops:
        kind = (op.op or "").upper()
        ids = [str(i) for i in op.target_ids]
        error: str | None = None
        target_kinds = sorted({kinds[i] for i in ids if i in kinds})
        entry_kind = op.kind or (target_kinds[0] if kind in ("MODIFY", "MERGE") and target_kinds else LESSON)
        if kind not in OPS:
            error = f"unknown operation {op.op!r}"
        elif kind == "KEEP":
            error = None
        elif entry_kind not in KINDS:
            error = f"unknown kind {entry_kind!r} (a lesson or an example)"
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
            elif kind in ("MODIFY", "MERGE") and (len(target_kinds) > 1 or entry_kind not in target_kinds):
                error = (f"{kind} would change a {' and a '.join(target_kinds)} into a {entry_kind}: an entry keeps "
                         "its kind (delete it and add the other kind instead)")
            elif kind != "DELETE":
                words, chars = (max_words, max_chars) if entry_kind == LESSON else limits(entry_kind)
                error = _text_error(op.text, words, chars)
                if error is None and normalize_text(op.text or "") in seen_texts:
                    error = "duplicates an existing experience"
        full = {LESSON: (max_size, "experiences"), EXAMPLE: (max_examples, "worked examples")}.get(entry_kind)
        if error is None and kind == "ADD" and full and full[0] is not None and size[entry_kind] >= full[0]:
            error = f"the library is full ({full[0]} {full[1]}): merge or delete first"
        if error is None and kind in ("ADD", "MERGE"):
            size[entry_kind] += 1 - len(ids)
        if error is None and kind == "DELETE":
            for i in ids:
                size[kinds[i]] -= 1
        if error is None and kind in ("ADD", "MODIFY", "MERGE"):
            seen_texts.add(normalize_text(op.text or ""))
        if error is None and kind != "KEEP":
            touched.update(ids)
        checked.append(CheckedOp(op=ProposedOp(kind, ids, op.text, op.rationale, entry_kind), error=error))
    return checked


def next_id_number(all_ids: list[str]) -> int:
    """The next free number for E<n> ids, given every id the library ever used."""
    numbers = [int(m.group(1)) for i in all_ids if (m := re.fullmatch(r"E(\d+)", str(i)))]
    return max(numbers, default=0) + 1


def apply_ops(experiences: list[dict], ops: list[ProposedOp], first_new_id: int) -> list[dict]:
    """The next library: valid operations applied in order (validate first).

    MODIFY keeps the id, place and kind; MERGE puts the merged text at the place of its first target
    under a new id (of its targets' kind); ADD appends under a new id, of the op's kind.
    """
    result = [dict(exp) for exp in experiences]
    kinds = {exp["id"]: kind_of(exp) for exp in experiences}
    counter = first_new_id
    for op in ops:
        kind = op.op.upper()
        if kind == "ADD":
            result.append(entry(f"E{counter}", op.text.strip(), op.kind or LESSON))
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
            result.insert(position, entry(f"E{counter}", op.text.strip(), op.kind or kinds[op.target_ids[0]]))
            counter += 1
    return result


def diff(old: list[dict], new: list[dict]) -> list[dict]:
    """What changed between two versions, per experience id: added, removed, changed (each with its kind)."""
    before = {exp["id"]: exp["text"] for exp in old}
    after = {exp["id"]: exp["text"] for exp in new}
    kinds = {exp["id"]: kind_of(exp) for exp in [*old, *new]}
    changes = [{"change": "removed", "id": i, "before": t, "after": None} for i, t in before.items() if i not in after]
    for i, text in after.items():
        if i not in before:
            changes.append({"change": "added", "id": i, "before": None, "after": text})
        elif before[i] != text:
            changes.append({"change": "changed", "id": i, "before": before[i], "after": text})
    return [{**change, "kind": kinds[change["id"]]} for change in changes]
