"""Quality flags on a proposed experience: signs that it could land but a person should look first.

Validation (core.domain.library.validate_ops) refuses what cannot land at all; these flags mark what often
should not (DESIGN §8, "experiences are general and whole"): a text cut off mid-sentence, a near copy
of an experience already there or of another operation, a retold problem's numbers, an over-long text.
Pure: text in, flags out, so the Review page and auto review mode judge an operation the same way.

In auto review mode (with the run's hold_flagged on) a flagged operation is refused before the validation gate
(`screen_ops`): invalid, its flags as the reason, so the gate never measures it and it never lands; in manual
mode it waits for the reviewer with its flags shown, as every operation does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from difflib import SequenceMatcher

from core.domain.library import MAX_CHARS, MAX_WORDS, CheckedOp, ProposedOp, normalize_text, validate_ops

# Two texts at or above this difflib ratio (of their normalize_text forms) say the same thing: one changed
# word in a 60-character experience still scores about 0.9, two different lessons on one topic about 0.6.
NEAR_DUPLICATE = 0.85
TEXT_KINDS = ("ADD", "MODIFY", "MERGE")  # the operations that write a text (DELETE and KEEP have none)
TERMINAL = re.compile(r"[.!?…][\"'”’)\]]*$")
# Words a sentence does not end on: a text ending on one (and with no full stop) was cut off.
DANGLING = frozenset("a an the and or but nor of to in on at by for from with into onto as if than then that "
                     "which who whose when while because so such its their your our my is are was were be "
                     "each every any some this these those".split())
PAIRS = (("(", ")"), ("[", "]"), ("{", "}"), ("“", "”"))
# A number as written in a query: thousands commas and decimals allowed, not the digits of an id like E12.
NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?")


@dataclass(frozen=True)
class Flag:
    """One concern about an operation: a short code (for tables and tests) and a sentence for people."""

    code: str
    message: str


def quality_flags(op_text: str | None, op_kind: str, target_ids: Iterable[str], library_experiences: list[dict],
                  other_ops_texts: Mapping[str, str], *, max_chars: int = MAX_CHARS, max_words: int = MAX_WORDS,
                  query_texts: Iterable[str] = ()) -> list[Flag]:
    """The flags of one operation's text, against the library it changes (`library_experiences`), the other
    operations of its step (`other_ops_texts`, label such as "operation 2" to text) and the step's queries."""
    text = (op_text or "").strip()
    if (op_kind or "").upper() not in TEXT_KINDS or not text:
        return []
    checks = (_cut_off(text), _near_duplicate(text, op_kind, target_ids, library_experiences, other_ops_texts),
              _query_numbers(text, query_texts), _too_long(text, max_chars, max_words))
    return [flag for flag in checks if flag is not None]


def _cut_off(text: str) -> Flag | None:
    reasons = []
    for opening, closing in PAIRS:
        if text.count(opening) != text.count(closing):
            reasons.append(f"its {opening}{closing} are unbalanced")
    if text.count('"') % 2:
        reasons.append('its " quotes are unbalanced')
    if not TERMINAL.search(text):
        last = re.sub(r"\W", "", text.split()[-1].lower()) if text.split() else ""
        reasons.append(f'it ends on "{last}" with no full stop' if last in DANGLING else "it ends with no . ! or ?")
    if not reasons:
        return None
    return Flag("cut_off", f"The text looks cut off mid-sentence: {'; '.join(reasons)}.")


def similarity(a: str, b: str) -> float:
    """How alike two experience texts are, 0 to 1, ignoring case, spacing and punctuation."""
    return SequenceMatcher(None, normalize_text(a), normalize_text(b), autojunk=False).ratio()


def _near_duplicate(text: str, op_kind: str, target_ids: Iterable[str], library: list[dict],
                    others: Mapping[str, str]) -> Flag | None:
    """A MODIFY or MERGE rewrites its own targets, so it is not compared with them."""
    own = {str(i) for i in target_ids} if op_kind.upper() in ("MODIFY", "MERGE") else set()
    candidates = [(f"experience {exp.get('id')}", exp.get("text") or "") for exp in library
                  if str(exp.get("id")) not in own]
    candidates += [(label, other) for label, other in others.items() if other]
    close = [(label, score) for label, other in candidates if (score := similarity(text, other)) >= NEAR_DUPLICATE]
    if not close:
        return None
    listed = ", ".join(f"{label} ({score:.2f})" for label, score in close)
    return Flag("near_duplicate", f"Nearly the same as {listed}: keep one of them, or merge them.")


def numbers_in(text: str) -> set[str]:
    """Numbers worth noticing in a text (two digits or more, or with decimals), commas dropped."""
    found = set()
    for raw in NUMBER.findall(text):
        number = raw.replace(",", "")
        if "." in number or len(number) >= 2:
            found.add(number.rstrip("0").rstrip(".") if "." in number else number)
    return found


def _query_numbers(text: str, query_texts: Iterable[str]) -> Flag | None:
    in_queries = set().union(*(numbers_in(query) for query in query_texts))
    shared = sorted(numbers_in(text) & in_queries, key=lambda n: (len(n), n))
    if not shared:
        return None
    return Flag("query_numbers", f"Names numbers from this step's queries ({', '.join(shared)}): an experience "
                                 "should be a general lesson, not one problem retold.")


def _too_long(text: str, max_chars: int, max_words: int) -> Flag | None:
    words = len(text.split())
    if words <= max_words and len(text) <= max_chars:
        return None
    return Flag("too_long", f"Longer than the limit: {words} words and {len(text)} characters "
                            f"(at most {max_words} words and {max_chars} characters).")


def rank_sources(text: str | None, lessons: dict[int, list[str]]) -> list[tuple[int, float]]:
    """The source groups of an operation, closest first: the learner folds every group's lessons into its
    operations without saying which came from where, so the group whose proposed lessons read most like the
    operation's text is the likeliest origin. Returns (group id, best similarity 0-1) for each group."""
    scores = {gid: max((similarity(text or "", lesson) for lesson in found), default=0.0)
              for gid, found in lessons.items()}
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


def flag_reason(flags: Iterable[Flag]) -> str:
    """An operation's flags as the validation error of an operation refused for them."""
    return "refused in auto review mode, flagged: " + " ".join(flag.message for flag in flags)


def screen_ops(experiences: list[dict], ops: list[ProposedOp], *, refuse_flagged: bool = False,
               query_texts: Iterable[str] = (), refused: Mapping[int, str] | None = None,
               **limits: int | None) -> list[CheckedOp]:
    """validate_ops, one operation at a time against the library as the operations accepted before it leave it,
    refusing also (invalid, with the reason) the positions in `refused` (texts the learner wrote over the limit
    twice) and, with `refuse_flagged`, every operation that carries a quality flag: its text against the library,
    the operations accepted before it and the step's queries. Checking in order means that of two
    near-duplicates the first stands and the second is refused, not both. `limits` are validate_ops' (max_size);
without refusals this is validate_ops."""
    refused = refused or {}
    query_texts = list(query_texts)
    accepted: list[tuple[int, ProposedOp]] = []
    checked: list[CheckedOp] = []
    for position, op in enumerate(ops):
        item = validate_ops(experiences, [*(o for _, o in accepted), op], **limits)[-1]
        if position in refused:  # its reason says more than validation's (asked again, cut off)
            item = CheckedOp(op=item.op, error=refused[position])
        if item.valid and refuse_flagged:
            earlier = {f"operation {i + 1}": o.text or "" for i, o in accepted}
            flags = [flag for flag in quality_flags(item.op.text, item.op.op, item.op.target_ids, experiences, earlier,
                                                    query_texts=query_texts)
                     # a worked example (an entry kind other than a lesson) keeps its problem's numbers by design
                     if flag.code != "query_numbers" or getattr(item.op, "kind", None) in (None, "lesson")]
            if flags:
                item = CheckedOp(op=item.op, error=flag_reason(flags))
        if item.valid:
            accepted.append((position, item.op))
        checked.append(item)
    return checked
