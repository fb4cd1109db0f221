"""A reference answer written as the reply a person would send (issue 36, item 3).

Where every attempt of a group failed, the run's reference option makes the sample's reference the group's worked
example (core.grpo.worked_examples). A reference is written for the verifier ("7 years;LK-72886", or a `facts`
list of labels and alternative wordings), and an example that reads "Answer: 7 years;LK-72886" teaches the agent
nothing it can say: measured on a held-out shop's policies, the same six examples written as replies lifted the
agent from 0.000 to 0.359 against 0.141 for the raw form. So the learner is asked for the reply a person would
send, stating every part of the reference (core.domain.prompts.reference_reply_messages), and the reward checks
that reply like any example's answer; where the learner's reply is unusable or does not score, `template_reply`
writes one sentence per part of the reference, by the reward method's own notion of parts (`reference_parts`).

Pure: no model, no database; the caller scores what these functions write.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from core.domain.library import EXAMPLE, limits
from core.domain.quality import TERMINAL, quality_flags
from core.domain.rewards import parse_facts, required_phrases, score_or_error
from core.errors import InvalidInput

# A code a customer quotes back (a ticket or an order reference: "LK-72886", "PC-48213", "AB12"): capitals, an
# optional separator, then a digit. "45-day" or "7 years" are not codes.
_CODE = re.compile(r"[A-Z]{1,6}[-_/]?\d[A-Z0-9-]*")
# A label that ends in one of these words runs straight into its value ("refund within 7 business days",
# "damaged items go to Quality Desk"); any other label is a noun ("the return window is 45 days").
_JOINING = frozenset("within to over under at in on for by from of after before until than about into via".split())
_ASIDE = re.compile(r"\s*\([^()]*\)")  # "ticket reference (PC- and the order number)": how the code is formed
# A label with one of these is a clause ("damaged items go to", "deliveries are retried for"); without, a noun phrase.
_VERBS = frozenset("is are was were be been go goes get gets come comes take takes has have must can will may "
                   "should expire expires apply applies".split())
_NAME_START = re.compile(r"[A-Z][A-Z]|[A-Z][a-z]+ [A-Z]")  # a label that opens with a name or acronym keeps its case
ECHO_WORDS = 8  # a reply that repeats this many words of the message in a row repeats the message


@dataclass(frozen=True)
class Part:
    """One thing a reference requires: a `facts` fact (its label and first wording), a `contains_all` phrase, or
    for any other method the whole reference."""

    label: str
    text: str

    def __str__(self) -> str:
        return f"{self.label}: {self.text}" if self.label else self.text


def reference_parts(method: str, reference: str | None, settings: dict | None = None) -> list[Part]:
    """The parts of a reference as the task's reward method counts them: `facts` its facts (label and the first
    accepted wording, never the verifier's list of alternatives), `contains_all` its required phrases (the
    `phrases` setting, else the reference split at ; or new lines), every other method the reference whole.
    A `facts` reference the method cannot read is one part, as it is."""
    reference = (reference or "").strip()
    if method == "facts":
        try:
            return [Part(fact.label, fact.wordings[0]) for fact in parse_facts(reference)]
        except InvalidInput:
            pass
    elif method == "contains_all":
        return [Part("", phrase) for phrase in required_phrases(reference, settings or {})]
    return [Part("", reference)] if reference else []


def reference_as_answer(method: str, reference: str | None, settings: dict | None = None) -> str:
    """The reference's parts in one line ("return window: 45 days; ticket reference: PC-48213"): what the learner
    is shown, and the example's answer where the reference is one value no sentence may wrap (an `exact` text)."""
    return "; ".join(str(part) for part in reference_parts(method, reference, settings))


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text if TERMINAL.search(text) else f"{text}."


def fact_sentence(label: str, text: str) -> str:
    """A labelled fact as a sentence a person would send: "Our return window is 45 days.", a code as the
    customer's with how it is formed where the label says it ("Your ticket reference is PC-48213, made of PC- and
    your order number."), a label that ends in a joining word as its words and value ("Damaged or unsafe items go to
    Quality Desk."), and such a label without a verb as what the sender offers ("We offer price match within 10
    days.", not the fragment "Price match within 10 days." the agent copied as it stood)."""
    asides = [aside.strip(" ()") for aside in _ASIDE.findall(label)]
    label = " ".join(_ASIDE.sub("", label).split()).rstrip(":")
    words = label.split()
    if words and words[-1].lower() in _JOINING:
        if not _VERBS & {word.lower() for word in words}:
            return _sentence(f"We offer {label[:1].lower() if not _NAME_START.match(label) else label[:1]}"
                             f"{label[1:]} {text}")
        return _sentence(f"{label[:1].upper()}{label[1:]} {text}")
    if not label:
        return _sentence(text)
    if _CODE.fullmatch(text):
        how = f", made of {_yours(asides[0])}" if asides else ""
        return _sentence(f"Your {label} is {text}{how}")
    return _sentence(f"Our {label} is {text}")


def _yours(aside: str) -> str:
    """A label's note in the customer's terms: "PC- and the order number" -> "PC- and your order number"."""
    return re.sub(r"\bthe\b", "your", aside, count=1)


def template_reply(parts: Sequence[Part]) -> str:
    """One sentence per labelled part, for any task, in a reply's voice (as fact_sentence writes it), and the parts
    without a label together in one sentence that claims nothing about what they are: "In your case: APP-5 and
    P4." A reference without field names says only its values, and any sentence about what a value is would be
    one task's guess: the shop's "Your reference is ..." turned a queue and a priority into "Your reference is
    APP-5. Your reference is P4." on an IT desk (issue 59). Never a quiz's "The answer is". Each part's words stay
    exactly as the reference has them, so the reward that counts those parts finds every one."""
    sentences: list[str] = []
    values = [part.text for part in parts if not part.label]
    for part in parts:
        if part.label:
            sentences.append(fact_sentence(part.label, part.text))
        elif values:
            sentences.append(_sentence(f"In your case: {_listed(values)}"))
            values = []
    return " ".join(sentences)


def _listed(values: Sequence[str]) -> str:
    """Values as a list in prose: "a", "a and b", "a, b and c"."""
    values = [" ".join(value.split()).rstrip(".") for value in values]
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} and {values[-1]}"


def example_text(query: str, answer: str) -> str:
    """A worked example made from a reference: the problem and the answer, on one line as every entry is shown."""
    return " ".join(f"Problem: {query} Answer: {answer}".split())


def reply_words(query: str) -> int:
    """The most words a reply may have so that its example stays within an example's limit (at least 20)."""
    max_words, _chars = limits(EXAMPLE)
    return max(20, max_words - len(example_text(query, "").split()))


def repeats_message(reply: str, query: str, words: int = ECHO_WORDS) -> bool:
    """Whether the reply repeats `words` words of the message in a row: the embedded learner often starts its
    reply by copying the customer's message, which teaches the agent to echo, not to answer."""
    def runs(text: str) -> set[tuple[str, ...]]:
        tokens = re.findall(r"\w+", text.lower())
        return {tuple(tokens[i:i + words]) for i in range(len(tokens) - words + 1)}

    return bool(runs(reply) & runs(query))


def unusable(reply: str, query: str, reference: str | None, parts: Sequence[Part],
             instructions: Sequence[str] = ()) -> str | None:
    """Why a reply cannot be an example's answer (None when it can): empty, not ending in a whole sentence, the
    reference's raw form copied, the message repeated, a fact that neither the reference, the message nor the
    task's `instructions` hold (see `invented_facts`), for a learner's reply (given the `instructions`) a sentence
    that states no fact of the reference (`idle_sentences`), or an example a quality flag would hold (cut off, over
    the example's limit)."""
    text = " ".join((reply or "").split())
    if not text:
        return "it is empty"
    if not TERMINAL.search(text):
        return "it does not end with a full stop"
    raw = " ".join((reference or "").split())
    if len(parts) > 1 and raw and raw in text:
        return "it copies the reference as it is"
    if repeats_message(text, query):
        return f"it repeats {ECHO_WORDS} or more words of the message in a row"
    if invented := invented_facts(text, [reference or "", query, *instructions]):
        return invented_reason(invented)
    if instructions and (idle := idle_sentences(text, parts)):
        return f"its sentence {idle[0]!r} states no fact of the reference"
    flags = quality_flags(example_text(query, text), "ADD", [], [], {}, entry_kind=EXAMPLE)
    return f"as an example, {flags[0].message[:1].lower()}{flags[0].message[1:].rstrip('.')}" if flags else None


# What an invented fact looks like in a reply: a number (45, 0800, 7.5), a code (LK-50786), or a capitalised word
# inside a sentence (a name or a place: "Larkspur", "Ontario"). A capitalised word that starts a sentence is not
# counted: "Your", "We" and "Thank" start replies.
_NUMBER = re.compile(r"\d+(?:[.,:/]\d+)*")
_NAME = re.compile(r"(?<![.!?:;\n]\s)(?<!^)(?<=\s)[A-Z][\w'’-]*")
_ALWAYS = frozenset({"i", "i'm", "i'll", "i've", "i'd", "ok", "okay"})


def invented_facts(text: str, known: Sequence[str], *, numbers: bool = True) -> list[str]:
    """The numbers, codes and names or places a text states that none of the `known` texts (the reference, the
    message, the task's instructions) holds, in order, once each. Measured: the embedded learner's reply to a shop's
    message said "The workshop is located in Larkspur, Ontario, Canada", which no reference holds, and it landed
    as a worked example. With `numbers` off (a task whose examples compute numbers on the way, such as arithmetic)
    only codes and names count."""
    known_text = " ".join(known)
    known_words = {w.lower().strip("'’-") for w in re.findall(r"[\w'’-]+", known_text)}  # "PC-" is known as "pc"
    known_numbers = {n.replace(",", "") for n in _NUMBER.findall(known_text)}
    known_codes = {c.upper() for c in _CODE.findall(known_text)}
    found: list[str] = []
    for code in _CODE.findall(text):
        if code.upper() not in known_codes and code not in found:
            found.append(code)
    for name in _NAME.findall(text):
        word = name.strip("'’-")
        if _CODE.fullmatch(word) or word.lower() in _ALWAYS or word.lower() in known_words or word in found:
            continue
        found.append(word)
    if numbers:
        stripped = _CODE.sub(" ", text)
        for number in _NUMBER.findall(stripped):
            if number.replace(",", "") not in known_numbers and number not in found:
                found.append(number)
    return found


def invented_reason(invented: Sequence[str]) -> str:
    """The flag's sentence, as Review and a refused operation show it."""
    return (f"it states {', '.join(repr(word) for word in invented[:5])}, which neither the reference, the message "
            "nor the task's instructions hold")


def idle_sentences(reply: str, parts: Sequence[Part]) -> list[str]:
    """The sentences of a reply that state no part of the reference (as whole words). Measured on the shop's
    policies: the embedded learner's replies carried such sentences, retelling the message in the customer's voice
    ("The warehouse received my returned headlamp on Friday") or echoing it ("You should be sure before you spend
    300 euros on one."), and the agent copied them instead of the policy; the template states only the facts."""
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", " ".join((reply or "").split())) if s]
    return [sentence for sentence in sentences
            if not any(score_or_error("contains", sentence, part.text, {}).value >= 1.0 for part in parts)]
