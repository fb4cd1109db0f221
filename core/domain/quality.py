"""Quality flags on a proposed experience: signs that it could land but a person should look first.

Validation (core.domain.library.validate_ops) refuses what cannot land at all; these flags mark what often
should not (DESIGN §8, "experiences are general and whole"): a text cut off mid-sentence, a near copy
of an experience already there or of another operation, a retold problem's numbers, an over-long text.
Pure: text in, flags out, so the Review page and auto review mode judge an operation the same way.

Each entry kind is judged by its own rules (`quality_flags`' entry_kind). A lesson is a sentence: it must end
with a stop, stay within a lesson's length and name no number of the step's queries. A worked example keeps its
problem's numbers by design, has an example's length limit, and ends with its answer, which may be a code, a
number or a quantity (an example made from the reference reads "Answer: 7 years;LK-50786"): only an ending on
a word no sentence ends on ("and", "the"), or unbalanced brackets or quotes, mark it cut off.

In auto review mode (with the run's hold_flagged on) a flagged operation of either kind is refused before the
validation gate (`screen_ops`): invalid, its flags as the reason, so the gate never measures it and it never
lands; nothing is left for a person who was not asked. In manual mode it waits for the reviewer with its flags
shown, as every operation does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from core.domain.facts import RewriteCheck
from core.domain.library import EXAMPLE, LESSON, CheckedOp, ProposedOp, limits, normalize_text, validate_ops

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
                  other_ops_texts: Mapping[str, str], *, query_texts: Iterable[str] = (),
                  entry_kind: str | None = None) -> list[Flag]:
    """The flags of one operation's text, against the library it changes (`library_experiences`), the other
    operations of its step (`other_ops_texts`, label such as "operation 2" to text) and the step's queries,
    by the rules of the entry kind it writes (`entry_kind`: `example`, else a lesson's rules)."""
    text = (op_text or "").strip()
    if (op_kind or "").upper() not in TEXT_KINDS or not text:
        return []
    example = entry_kind == EXAMPLE
    max_words, max_chars = limits(EXAMPLE if example else LESSON)
    checks = (_cut_off(text, ends_with_answer=example),
              _near_duplicate(text, op_kind, target_ids, library_experiences, other_ops_texts),
              None if example else _query_numbers(text, query_texts), _too_long(text, max_chars, max_words))
    return [flag for flag in checks if flag is not None]


def _cut_off(text: str, *, ends_with_answer: bool = False) -> Flag | None:
    """Unbalanced brackets or quotes, or an ending no whole sentence has. A text that ends with its answer (a
    worked example) may end on a code, a number or a quantity with no stop; on a dangling word it is cut off."""
    reasons = []
    for opening, closing in PAIRS:
        if text.count(opening) != text.count(closing):
            reasons.append(f"its {opening}{closing} are unbalanced")
    if text.count('"') % 2:
        reasons.append('its " quotes are unbalanced')
    if not TERMINAL.search(text):
        last = re.sub(r"\W", "", text.split()[-1].lower()) if text.split() else ""
        if last in DANGLING:
            reasons.append(f'it ends on "{last}" with no full stop')
        elif not ends_with_answer:
            reasons.append("it ends with no . ! or ?")
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
               labels: Sequence[str] | None = None, rewrite_checks: Mapping[int, RewriteCheck] | None = None,
               **validation_limits: int | None) -> list[CheckedOp]:
    """validate_ops, one operation at a time against the library as the operations accepted before it leave it,
    refusing also (invalid, with the reason) the positions in `refused` (texts the learner wrote over the limit
    twice) and, with `refuse_flagged`, every operation that carries a quality flag by its kind's rules: its text
    against the library, the operations accepted before it and the step's queries. Checking in order means that of
    two near-duplicates the first stands and the second is refused, not both. `labels` name the operations in a
    flag ("operation 2", the default by position); `validation_limits` are validate_ops' (max_size, max_examples);
    `rewrite_checks` (auto review mode), by position: a MODIFY or MERGE that drops a verified fact or adds one no
    source holds is refused with core.domain.facts' reason, whatever the flags; without refusals this is
    validate_ops."""
    refused = refused or {}
    query_texts = list(query_texts)
    labels = list(labels) if labels is not None else [f"operation {i + 1}" for i in range(len(ops))]
    accepted: list[tuple[int, ProposedOp]] = []
    checked: list[CheckedOp] = []
    for position, op in enumerate(ops):
        item = validate_ops(experiences, [*(o for _, o in accepted), op], **validation_limits)[-1]
        if position in refused:  # its reason says more than validation's (asked again, cut off)
            item = CheckedOp(op=item.op, error=refused[position])
        if item.valid and refuse_flagged:
            earlier = {labels[i]: o.text or "" for i, o in accepted}
            flags = quality_flags(item.op.text, item.op.op, item.op.target_ids, experiences, earlier,
                                  query_texts=query_texts, entry_kind=item.op.kind)
            if flags:
                item = CheckedOp(op=item.op, error=flag_reason(flags))
        if item.valid and (check := (rewrite_checks or {}).get(position)) is not None:
            held = check.held(item.op.op, item.op.target_ids, item.op.text, experiences)
            if held:
                item = CheckedOp(op=item.op, error=held)
        if item.valid:
            accepted.append((position, item.op))
        checked.append(item)
    return checked
