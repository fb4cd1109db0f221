"""The facts a text states, and what a rewrite of a verified entry drops or adds (issue 52, item 1).

Measured on a held-out shop's policies: an auto-applied MODIFY, passed by the validation gate, replaced a worked
example that stated the return window and the ticket reference with one that lost the window and claimed the
ticket was "a brand name". The gate measures a library's mean on a few queries, not whether an entry stays true,
so a MODIFY or MERGE is checked here against the entries it replaces and the references of its source messages.

A **fact** is what a small model's text can state and get wrong, found without a language model:

- a quantity: a number with a unit (45 days, 72-hour, 25 MB, 15%, fourteen days) or money ($20, 15 euros);
- a number of two digits or more (an order number, 8:00), any decimal;
- a code a customer quotes back (LK-50786, PC-48213);
- a name: capitalised words inside a sentence (Quality Desk, Tidepool), not the sentence's first word;
- a quoted string ("Express Plus").

`fact_changes` says what a new text **drops** (a fact its predecessors state, that a reference states too, which
the new text does not) and **adds** (a fact no known text holds: the references and messages of its sources, the
task's instructions, the predecessors). With the task's reward needs (core.domain.coverage: `facts` or
`contains_all` references, whose alternative wordings count as one fact and whose codes count by their letters),
drops are counted by them; otherwise by the facts above.

Pure: texts in, facts out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from core.domain.coverage import Need, needs_stated

CODE = re.compile(r"\b[A-Z]{1,6}[-_/]?\d[A-Z0-9-]*\b")
_WORD_NUMBERS = {w: n for n, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_WORD_NUMBERS |= {"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}
_TENS = "twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety"
_WORD_NUMBER = (rf"(?:(?:{_TENS})[- ](?:one|two|three|four|five|six|seven|eight|nine)|"
                rf"{'|'.join(sorted(_WORD_NUMBERS, key=len, reverse=True))})(?:[- ]hundred)?")
_DIGITS = r"\d+(?:,\d{3})*(?:\.\d+)?"
# A unit as written after its number, and the name it is compared by.
UNITS = {
    "second": "second", "sec": "second", "s": "second", "minute": "minute", "min": "minute", "hour": "hour",
    "hr": "hour", "h": "hour", "day": "day", "week": "week", "month": "month", "year": "year", "ms": "millisecond",
    "millisecond": "millisecond", "%": "percent", "percent": "percent", "per cent": "percent",
    "kb": "kb", "kilobyte": "kb", "mb": "mb", "megabyte": "mb", "gb": "gb", "gigabyte": "gb", "tb": "tb",
    "terabyte": "tb", "byte": "byte", "km": "km", "kilometre": "km", "kilometer": "km", "mile": "mile", "m": "m",
    "metre": "m", "meter": "m", "cm": "cm", "mm": "mm", "kg": "kg", "kilo": "kg", "g": "g", "gram": "g", "lb": "lb",
    "pound": "money:gbp", "dollar": "money:usd", "usd": "money:usd", "euro": "money:eur", "eur": "money:eur",
    "gbp": "money:gbp", "cent": "money:cent", "request": "request", "req": "request", "call": "request",
    "item": "item", "character": "character", "char": "character", "user": "user", "seat": "seat",
}
_CURRENCY = {"$": "money:usd", "€": "money:eur", "£": "money:gbp"}
_UNIT = "|".join(sorted((re.escape(u) for u in UNITS), key=len, reverse=True))
_NUMBER_TEXT = rf"(?:{_DIGITS}|{_WORD_NUMBER})"
# "45 days", "45-day", "7 business days", "25MB", "15%", "$20", "20 euros"
_QUANTITY = re.compile(
    rf"(?P<cur>[$€£])\s?(?P<money>{_DIGITS})"
    rf"|(?<![\w.])(?P<num>{_NUMBER_TEXT})(?:\s?-\s?|\s)?(?:(?:business|working|calendar|full)\s)?"
    rf"(?P<unit>{_UNIT})(?:e?s)?(?![\w])", re.IGNORECASE)
_NUMBER = re.compile(rf"(?<![\w.]){_DIGITS}(?::\d+)?")
# A capitalised word, or a run of them, with its place in the text (the first word of a sentence is no name).
_NAME = re.compile(r"[A-Z][\w'’&-]*(?:\s+(?:of\s+|the\s+|de\s+)?[A-Z][\w'’&-]*)*")
_SENTENCE_START = re.compile(r"(?:^|[.!?:;\n]|[.!?:;][\"'”’)\]])\s*[\"'“‘(\[]*$")
_QUOTED = re.compile(r"\"([^\"\n]{2,80})\"|“([^”\n]{2,80})”")
# Words a capital does not make a name of: an example's parts, a reply's openings, the pronoun.
_PLAIN = frozenset("problem problems steps step answer answers note i i'm i'll i've i'd ok okay yes no hi hello "
                   "dear thanks thank please we you your our it the a an this that".split())


@dataclass(frozen=True)
class Fact:
    """One fact as written (`text`) and how it is compared (`kind`, `key`)."""

    kind: str  # quantity | number | code | name | quoted
    key: str
    text: str


def _number_value(raw: str) -> str:
    """A number as compared: digits with commas dropped and trailing decimal zeros cut, a word number as digits."""
    word = raw.lower().replace("-", " ").split()
    if word and word[0] in _WORD_NUMBERS:
        value = _WORD_NUMBERS[word[0]] + (_WORD_NUMBERS.get(word[1], 0) if len(word) > 1 and word[1] != "hundred"
                                          else 0)
        return str(value * 100 if word[-1] == "hundred" else value)
    number = raw.replace(",", "")
    return number.rstrip("0").rstrip(".") if "." in number else number


def _unit(raw: str) -> str:
    raw = " ".join(raw.lower().split())
    return UNITS.get(raw) or UNITS.get(raw.rstrip("s")) or UNITS.get(raw.removesuffix("es")) or raw


def facts_of(text: str | None) -> list[Fact]:
    """The facts a text states, in order, once each by key."""
    text = " ".join((text or "").split())
    found: dict[tuple[str, str], Fact] = {}

    def add(kind: str, key: str, written: str) -> None:
        found.setdefault((kind, key), Fact(kind, key, written))

    spans: list[tuple[int, int]] = []
    for match in _QUANTITY.finditer(text):
        if match.group("cur"):
            add("quantity", f"{_number_value(match.group('money'))} {_CURRENCY[match.group('cur')]}", match.group(0))
        else:
            unit = _unit(match.group("unit"))
            if unit in ("second", "m", "g", "hour") and len(match.group("unit")) == 1 and " " in match.group(0):
                continue  # "5 s" or "3 m" written apart is more often a word than a unit
            add("quantity", f"{_number_value(match.group('num'))} {unit}", match.group(0))
        spans.append(match.span())
    codes = [m for m in CODE.finditer(text)]
    for match in codes:
        add("code", match.group(0).upper(), match.group(0))
    covered = spans + [m.span() for m in codes]
    for match in _NUMBER.finditer(text):
        if any(start <= match.start() < end for start, end in covered):
            continue
        value = _number_value(match.group(0))
        if "." in value or ":" in value or len(value) >= 2:
            add("number", value, match.group(0))
    for match in _QUOTED.finditer(text):
        quoted = match.group(1) or match.group(2)
        add("quoted", " ".join(quoted.lower().split()), quoted)
        covered.append(match.span())
    for match in _NAME.finditer(text):
        if any(start <= match.start() < end for start, end in covered):
            continue
        words = match.group(0).split()
        if _SENTENCE_START.search(text[:match.start()]):
            words = words[1:]  # the sentence's first word; the rest of a run is a name ("Send it to Quality Desk")
        words = [w.strip("'’-") for w in words]
        while words and (words[0].lower() in _PLAIN or CODE.fullmatch(words[0])):
            words = words[1:]
        while words and words[-1].lower() in ("of", "the", "de"):
            words = words[:-1]
        if words and not all(CODE.fullmatch(w) for w in words):
            name = " ".join(words)
            add("name", name.lower(), name)
    return list(found.values())


def _numbers(texts: Iterable[str]) -> set[str]:
    values = set()
    for text in texts:
        values |= {f.key.split()[0] for f in facts_of(text) if f.kind == "quantity" and not f.key.startswith("$")}
        values |= {f.key for f in facts_of(text) if f.kind == "number"}
        values |= {_number_value(m.group(0)) for m in _NUMBER.finditer(text)}
        values |= {_number_value(m.group(0)) for m in re.finditer(_WORD_NUMBER, text, re.IGNORECASE)}
    return values


def states(texts: Sequence[str], fact: Fact) -> bool:
    """Whether any of `texts` states `fact`: a quantity or number by its value (a unit written otherwise, "two weeks"
    against "14 days", is a person's call, not this check's), a code as written, a name by all its words, a quoted
    string as a phrase, case aside."""
    joined = " ".join(" ".join(t.split()) for t in texts)
    if fact.kind in ("quantity", "number"):
        value = fact.key.split()[0]
        return value in _numbers([joined])
    if fact.kind == "code":
        return fact.key in {m.group(0).upper() for m in CODE.finditer(joined)}
    words = set(re.findall(r"[\w'’&-]+", joined.lower()))
    words |= {part for w in words for part in re.split(r"['’-]", w) if part}  # "PC" is stated by "PC-48213"
    if fact.kind == "name":
        return all(w in words for w in re.findall(r"[\w'’&-]+", fact.key))
    return fact.key in " ".join(joined.lower().split())


@dataclass(frozen=True)
class FactChanges:
    """What a rewrite drops and adds; `reason` says it in words for a person."""

    drops: list[str] = field(default_factory=list)
    adds: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.drops or self.adds)

    @property
    def reason(self) -> str:
        said = []
        if self.drops:
            said.append("drops: " + ", ".join(self.drops))
        if self.adds:
            said.append("adds: " + ", ".join(repr(a) for a in self.adds))
        return "; ".join(said)


def fact_changes(new_text: str | None, predecessors: Sequence[str], *, references: Sequence[str],
                 known: Sequence[str] = (), needs: Iterable[Need] = ()) -> FactChanges:
    """What `new_text` drops of its `predecessors` (the entries a MODIFY or MERGE replaces) and adds beyond every
    `known` text (the references and messages of the operation's sources, the task's instructions).

    A predecessor's fact is verified when a reference states it: with the task's reward `needs` (every need of the
    task's references), a need the predecessors state and the new text does not is dropped, named by its label
    ("return window: 45 days"); without them, a fact of a predecessor that one of the `references` states and the
    new text does not. A fact of the new text that neither the known texts, the references nor the predecessors
    state is added. With no reference at all nothing is verified and nothing is checked."""
    new_text = new_text or ""
    if not any((r or "").strip() for r in references):
        return FactChanges()
    needs = frozenset(needs)
    if needs:
        before = frozenset().union(*(needs_stated(p, needs) for p in predecessors)) if predecessors else frozenset()
        after = needs_stated(new_text, needs)
        drops = sorted(need.key for need in before - after)
    else:
        drops = []
        for fact in (f for p in predecessors for f in facts_of(p)):
            if states(references, fact) and not states([new_text], fact) and fact.text not in drops:
                drops.append(fact.text)
    support = [*known, *references, *predecessors]
    adds = []
    for fact in facts_of(new_text):
        if not states(support, fact) and fact.text not in adds:
            adds.append(fact.text)
    return FactChanges(drops, adds)


# Begins the reason of a rewrite auto review leaves to a person (Review shows it on the operation's card).
HELD = "held for a person"
REWRITES = ("MODIFY", "MERGE")


@dataclass(frozen=True)
class RewriteCheck:
    """What a MODIFY or MERGE is checked against: every reference of the task (`references`, with their reward
    `needs`), and the texts its sources hold (`known`: their references and messages, the task's instructions)."""

    references: tuple[str, ...]
    known: tuple[str, ...] = ()
    needs: frozenset[Need] = frozenset()

    def changes(self, op_kind: str, target_ids: Iterable[str], text: str | None,
                experiences: Sequence[dict]) -> FactChanges:
        """What a rewrite of the entries `target_ids` of `experiences` drops and adds; nothing for other operations."""
        if (op_kind or "").upper() not in REWRITES:
            return FactChanges()
        targets = {str(i) for i in target_ids}
        predecessors = [e.get("text") or "" for e in experiences if str(e.get("id")) in targets]
        return fact_changes(text, predecessors, references=self.references, known=self.known, needs=self.needs)

    def held(self, op_kind: str, target_ids: Iterable[str], text: str | None, experiences: Sequence[dict]) -> str | None:
        """The reason auto review leaves the rewrite to a person, or None when it keeps every fact true."""
        found = self.changes(op_kind, target_ids, text, experiences)
        if not found.changed:
            return None
        return (f"{HELD}: auto review applies no rewrite that changes a verified fact ({found.reason}); if it is "
                "right, write it into the library on the Library page")
