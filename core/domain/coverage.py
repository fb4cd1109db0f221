"""What a library's worked examples cover, and where a new example goes (issue 44: coverage before repetition).

A worked example made from a reference teaches the facts that reference requires (a shop's return window, its
ticket format). Measured on a held-out shop's policies, a library that filled its 6 examples in the first epoch
held 4 on one policy and none on another, and the policy without an example was the one the agent could not
answer (0.06 against 0.56). So an example's **need** is the set of facts it states, by the task's own reward
(`facts`: each labelled fact; `contains_all`: each required phrase), with a code's digits masked: "PC-48213" and
"PC-49302" are the same need (the ticket format), "45 days" is its own. Two examples with the same need are
near-duplicates whatever their wording; a task whose reward counts no facts has no needs, and its examples are
added as before.

`plan_examples` turns a step's new examples into operations: one whose need an example of the library already
states in full (with more) is refused as covered; one whose need includes an existing example's replaces it
(MODIFY, or MERGE of several); a new need is added, and when the examples are at the library's cap it takes the
place of the most redundant example (one whose every fact another example states too), never of the only example
of a need; when every example is the only one of its need, it is refused for space. `coverage` says which train
references an example that retrieval would show them states.

Pure: texts and references in, operations and figures out; the reward's own scorer decides what a text states.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from core.domain.library import EXAMPLE, ProposedOp, examples
from core.domain.rewards import parse_facts, required_phrases, score_or_error
from core.domain.selection import Selection, select_entries
from core.errors import InvalidInput

FACT_METHODS = ("facts", "contains_all")  # the reward methods whose references are lists of facts
# A code a customer quotes back ("PC-48213"): its letters are the need, its digits differ per message.
_CODE = re.compile(r"([A-Z]{1,6})([-_/]?)\d[A-Z0-9-]*")
FULL = "the library is full"  # starts a refusal for space (Review and the run's summary count them)


@dataclass(frozen=True)
class Need:
    """One fact a reference requires, as examples share it: `key` names it for people ("return window: 45
    days", "ticket reference: PC-…"); `wordings` are the reward's accepted wordings, or for a code its prefix."""

    key: str
    wordings: tuple[str, ...]
    code_prefix: str | None = None


def _need(label: str, wordings: tuple[str, ...]) -> Need:
    label = " ".join(re.sub(r"\s*\([^()]*\)", "", label).split()).rstrip(":")
    code = _CODE.fullmatch(wordings[0]) if wordings else None
    if code:
        prefix = code.group(1)
        return Need(f"{label + ': ' if label else ''}{prefix}{code.group(2)}…", (), prefix)
    return Need(f"{label + ': ' if label else ''}{wordings[0]}", wordings)


def needs_of(method: str, reference: str | None, settings: dict | None = None) -> frozenset[Need]:
    """The needs of a reference under the task's reward method: its facts (codes masked), or none for a method
    that counts no facts, or a reference that method cannot read."""
    reference = (reference or "").strip()
    if not reference or method not in FACT_METHODS:
        return frozenset()
    try:
        if method == "facts":
            return frozenset(_need(fact.label, fact.wordings) for fact in parse_facts(reference))
        return frozenset(_need("", (phrase,)) for phrase in required_phrases(reference, settings or {}))
    except InvalidInput:
        return frozenset()


def states(text: str, need: Need) -> bool:
    """Whether a text states a need: one of its wordings as whole words (the `contains` reward's rule, which the
    `facts` reward applies per fact), or for a code any code of the same letters."""
    if need.code_prefix is not None:
        return any(m.group(1) == need.code_prefix for m in _CODE.finditer(text or ""))
    return any(score_or_error("contains", text or "", wording, {}).value >= 1.0 for wording in need.wordings)


def needs_stated(text: str, universe: frozenset[Need] | set[Need]) -> frozenset[Need]:
    """The needs of `universe` (every need of the task's references) that an example teaches: stated in its
    steps and answer, not in its problem (a customer's "10 days ago" teaches nothing)."""
    taught = _taught(text)
    return frozenset(need for need in universe if states(taught, need))


def states_all(text: str, needs: frozenset[Need]) -> bool:
    """Whether one example teaches every need of `needs`: the rule `coverage`, `covering` and `stating_all` share
    (two examples that teach them between them do not count)."""
    return needs <= needs_stated(text, needs)


def _taught(text: str) -> str:
    """An example's steps and answer: what follows its first "Steps:", else its first "Answer:", else all of it."""
    for mark in ("Steps:", "Answer:"):
        if mark in (text or ""):
            return text.split(mark, 1)[1]
    return text or ""


def describe(needs: frozenset[Need] | set[Need]) -> str:
    return ", ".join(sorted(need.key for need in needs)) or "no fact"


@dataclass
class Planned:
    """A new example as an operation: an ADD, a MODIFY or MERGE of the examples it replaces, or refused (`error`)."""

    op: ProposedOp
    error: str | None = None
    covered_by: int | None = None  # the new example of the same step that covers this one (its index)


def plan_examples(library: Sequence[dict], new: Sequence[tuple[str, str, frozenset[Need]]],
                  universe: frozenset[Need] | set[Need], cap: int | None,
                  shown: Sequence[frozenset[str]] | None = None) -> list[Planned]:
    """One operation per new example (text, rationale, need), in order, against the library's examples.

    - covered: another new example of this step, or an example of the library, states its need and more (or
      the same, for an earlier new one): refused, naming it;
    - a replacement: its need includes every fact of one or more examples of the library: MODIFY (one) or MERGE
      (several) with its text, so the library keeps one example per need;
    - a new need: ADD; at the cap it replaces the most redundant example (every fact of it stated by another
      example, the one whose facts are stated most often; an example that states no fact first), and where every
      example is the only one of some need it is refused for space.
    Where the task counts no facts (an empty `universe`) every new example is an ADD, refused for space at the cap
    as before: nothing tells which example is redundant. `shown` (one per new example: the ids of the library's
    examples retrieval shows its query) limits "covered" to what the query is shown: an example of the library that
    states the need but that retrieval never shows this query serves it nothing (a shop message about returning a
    jacket was refused three times as covered by the return example it was never shown)."""
    universe = frozenset(universe) | frozenset(n for _t, _r, need in new for n in need)
    current = {e["id"]: needs_stated(e["text"], universe) for e in examples(library)}  # the library as planned
    order = list(current)
    accepted: list[tuple[int, frozenset[Need]]] = []  # index of a new example kept, and its need
    out: list[Planned] = []
    for index, (text, rationale, need) in enumerate(new):
        def planned(op: str, targets: list[str], why: str = "", text: str = text, rationale: str = rationale
                    ) -> Planned:
            return Planned(ProposedOp(op, targets, text, f"{rationale} {why}".strip(), EXAMPLE))

        if need:
            earlier = next((i for i, other in accepted if need <= other), None)
            if earlier is not None:
                out.append(Planned(planned("ADD", []).op, f"covered: new example {earlier + 1} of this step states "
                                                          f"the same facts ({describe(need)})", earlier))
                continue
            for i, other in list(accepted):  # an earlier ADD of this step that this one states and more: it goes
                if other < need and out[i].op.op == "ADD" and out[i].error is None:
                    for plan in out:  # what it covered, this one covers now
                        if plan.covered_by == i:
                            plan.covered_by = index
                            plan.error = re.sub(r"new example \d+ ", f"new example {index + 1} ", plan.error)
                    out[i].error = (f"covered: new example {index + 1} of this step states these facts "
                                    f"({describe(other)}) and more")
                    out[i].covered_by = index
                    accepted.remove((i, other))
                    order.remove(f"new:{i}")
                    del current[f"new:{i}"]
            replaced = [i for i in order if not i.startswith("new:") and current[i] and current[i] <= need]
            if replaced:
                for i in replaced:
                    order.remove(i)
                    del current[i]
                key = f"new:{index}"
                order.append(key)
                current[key] = need
                accepted.append((index, need))
                out.append(planned("MODIFY" if len(replaced) == 1 else "MERGE", replaced,
                                   f"It replaces {', '.join(replaced)}: the same need ({describe(need)}), one "
                                   "example per need."))
                continue
            wider = next((i for i in order if need < current[i]
                          and (shown is None or i.startswith("new:") or i in shown[index])), None)
            if wider is not None:
                out.append(Planned(planned("ADD", []).op, f"covered: {wider} already states these facts "
                                                          f"({describe(need)}) and more"))
                continue
        if cap is not None and len(order) >= cap:
            victim = _most_redundant(order, current) if universe else None
            if victim is None:
                out.append(Planned(planned("ADD", []).op,
                                   f"{FULL} ({cap} worked examples), each the only example of its need"))
                continue
            facts = describe(current[victim])
            order.remove(victim)
            del current[victim]
            key = f"new:{index}"
            order.append(key)
            current[key] = need
            if need:
                accepted.append((index, need))
            out.append(planned("MODIFY", [victim], f"The library is full ({cap} worked examples): it takes the "
                                                   f"place of {victim}, whose facts ({facts}) other examples state "
                                                   "too."))
            continue
        key = f"new:{index}"
        order.append(key)
        current[key] = need
        if need:
            accepted.append((index, need))
        out.append(planned("ADD", []))
    return out


def _most_redundant(order: list[str], current: dict[str, frozenset[Need]]) -> str | None:
    """The library example (not one of this step's, keyed new:<i>) to give up: one that states no fact, else the one
    whose every fact the most other examples state too; None when each is the only example of some fact."""
    best, best_score = None, 0
    for i in order:
        if i.startswith("new:"):
            continue
        if not current[i]:
            return i
        others = [current[j] for j in order if j != i]
        score = min(sum(1 for other in others if need in other) for need in current[i])
        if score > best_score:
            best, best_score = i, score
    return best


@dataclass
class Coverage:
    """Which train references an example retrieval would show them states in full (`covered`), by name."""

    total: int = 0
    covered: list[str] = field(default_factory=list)
    uncovered: list[str] = field(default_factory=list)
    counted: bool = True  # False: the task's reward counts no facts, so coverage is not measured

    def line(self) -> str:
        if not self.counted:
            return "coverage: not measured (the task's reward counts no facts, so examples have no needs to cover)"
        if not self.total:
            return "coverage: the task has no train references"
        missing = f"; uncovered: {', '.join(self.uncovered)}" if self.uncovered else ""
        return (f"coverage: {len(self.covered)} of {self.total} train references have an example that retrieval "
                f"shows them and that states their facts{missing}")


def coverage(entries: Sequence[dict], references: Sequence[tuple[str, str, str | None]], method: str,
             settings: dict | None, selection: Selection) -> Coverage:
    """For each train reference (name, query, reference): is an example among the entries the selection shows
    its query that states every need of its reference (as `covering` asks)? A reference with no need counts as
    covered when its query is shown any example."""
    if method not in FACT_METHODS:
        return Coverage(counted=False)
    result = Coverage(total=len(references))
    for name, query, reference in references:
        needs = needs_of(method, reference, settings)
        ok = any(states_all(e["text"], needs) for e in _shown_examples(entries, query, selection))
        (result.covered if ok else result.uncovered).append(name)
    return result


def covering(entries: Sequence[dict], query: str, reference: str | None, method: str, settings: dict | None,
             selection: Selection) -> list[str]:
    """The ids of the worked examples shown to `query` each of which states every need of its reference, or []
    when none does (or the reference has no need: a task whose reward counts no facts is never covered here).
    A run that learns examples only need not roll such a query out again (RunSettings.skip_covered): an example
    from its group would be refused as covered by plan_examples, or would only replace one of the same facts.
    Two examples that state the needs between them do not cover it: the agent copies the one answer nearest its
    message (a shop's price-match question with an order number got the price-match example's reply, without
    the ticket reference that another example showed)."""
    needs = needs_of(method, reference, settings)
    if not needs:
        return []
    return [str(e["id"]) for e in _shown_examples(entries, query, selection) if states_all(e["text"], needs)]


def stating_all(texts: Sequence[str], reference: str | None, method: str, settings: dict | None) -> int | None:
    """The position of the first text that states every need of the reference (an example refused earlier that
    would have covered it), or None; a reference with no need is stated by none."""
    needs = needs_of(method, reference, settings)
    if not needs:
        return None
    return next((i for i, text in enumerate(texts) if states_all(text, needs)), None)


def _shown_examples(entries: Sequence[dict], query: str, selection: Selection) -> list[dict]:
    """The worked examples among the entries the selection shows `query`."""
    return [e for e in select_entries(list(entries), query, selection) if e.get("kind") == EXAMPLE]
