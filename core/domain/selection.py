"""Which library entries an agent is shown for one query: all of them, or the k most similar to the query.

The paper puts the whole library into every prompt (`all`, the default). A small agent does better with a
few worked examples that resemble the problem in front of it than with a long list (issue 26; DESIGN.md
section 8, "A small agent learns knowledge, not reasoning"), so a library may instead show each query only
its `top_k` entries, ranked by BM25 over the entry texts (the `bm25s` library, not a ranker of our own).

This module is the one place that choice is made: training, evaluation, the validation gate, attribution
and the HTTP API's selection route all call `select_entries`, so what an agent saw while the studio measured
a library is exactly what a live agent gets for the same query. It is pure: the same entries, query and
selection always give the same entries in the same order (ties keep the library's order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from core.domain.library import EXAMPLE, kind_of
from core.errors import InvalidInput

DEFAULT_K = 2  # a few worked examples, not the whole library: 2 beat 3 on the shop's development messages
MAX_K = 30  # no more than a library may hold (core.domain.library.MAX_EXPERIENCES)
STOPWORDS = "en"  # words such as "the" and "how" say nothing about which entry fits a query
_TAUGHT = (" Steps: ", " Answer: ")  # where a worked example's problem ends and what it teaches begins


class SelectionMode(StrEnum):
    ALL = "all"  # every entry, in the library's order: the paper's behaviour
    TOP_K = "top_k"  # the k entries with the highest BM25 score for the query, the most similar last


@dataclass(frozen=True)
class Selection:
    """How a library chooses the entries of one prompt. `k` is kept while the mode is `all`, so switching
    back to `top_k` restores it."""

    mode: SelectionMode = SelectionMode.ALL
    k: int = DEFAULT_K

    @classmethod
    def build(cls, mode: str | None = None, k: int | None = None) -> Selection:
        """A checked selection from a form, the command line or a stored row; InvalidInput says what is wrong."""
        mode = SelectionMode.ALL if mode in (None, "") else mode
        if mode not in set(SelectionMode):
            raise InvalidInput(f"selection must be one of {', '.join(SelectionMode)}, not {mode!r}")
        k = DEFAULT_K if k is None else k
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise InvalidInput(f"k must be a whole number from 1 to {MAX_K}, not {k!r}")
        return cls(SelectionMode(mode), k)

    @classmethod
    def from_dict(cls, data: dict | None) -> Selection:
        """A selection stored as JSON (an evaluation's, a run's); None, from before selections existed, is `all`."""
        if not data:
            return cls()
        return cls.build(data.get("mode"), data.get("k"))

    def as_dict(self) -> dict:
        return {"mode": str(self.mode), "k": self.k}

    def shows_same(self, other: Selection) -> bool:
        """True when both show the same entries for every query (both `all` whatever their k, or the same k):
        an evaluation made under one can stand for the other."""
        return (self.mode, self.k if self.chooses else None) == (other.mode, other.k if other.chooses else None)

    @property
    def chooses(self) -> bool:
        """True when the query decides what is shown (only then is a ranking computed)."""
        return self.mode == SelectionMode.TOP_K

    def describe(self) -> str:
        """The selection in words, as the pages and the CLI say it."""
        if not self.chooses:
            return "all entries, in the library's order"
        if self.k == 1:
            return "the entry most similar to the query (BM25 over the entries' text)"
        return (f"the {self.k} entries most similar to the query (BM25 over their text), the most similar last, "
                "next to the query")


def ranked_entries(entries: Sequence[dict], query: str, selection: Selection) -> list[tuple[dict, float | None]]:
    """The entries chosen for `query`, each with its BM25 score (None under `all`, where nothing is ranked), in rank
    order: the most similar first (what a ranking measure reads; the prompt's order is `scored_entries`').

    `top_k` keeps exactly min(k, entries) entries: when fewer than k share a word with the query, the rest
    are the library's first entries with score 0, so every prompt of a library holds the same number."""
    entries = list(entries or [])
    if not selection.chooses or not entries:
        return [(entry, None) for entry in entries]
    scores = bm25_scores([ranking_text(entry) for entry in entries], query)
    order = sorted(range(len(entries)), key=lambda i: (-scores[i], i))  # ties: the library's order
    return [(entries[i], scores[i]) for i in order[:selection.k]]


def ranking_text(entry: dict) -> str:
    """What a query is matched against: a lesson's text; for a worked example, what it teaches (its steps and
    answer) twice and its problem once. An example's problem is another person's message, and its details (their
    product, their story) outranked the example that answers the same question: a return question was shown the
    repair example last and the agent stated the repair time (issue 52). Weighting the answer ranks examples by
    what they answer; on the shop's development messages (one template example per need, 18 messages) the most
    similar example stated the message's policy for 14 against 13 (bench/example_choice.py)."""
    text = str(entry.get("text") or "")
    if kind_of(entry) != EXAMPLE:
        return text
    cut = min((i for i in (text.find(mark) for mark in _TAUGHT) if i >= 0), default=-1)
    if cut < 0:
        return text
    problem, taught = text[:cut].removeprefix("Problem: "), text[cut:]
    return f"{taught} {taught} {problem}"


def scored_entries(entries: Sequence[dict], query: str, selection: Selection) -> list[tuple[dict, float | None]]:
    """The entries shown for `query` with their scores, in the prompt's order: under `top_k` the ranking reversed,
    so the most similar entry is the last one the agent reads before the query. The embedded 0.5B agent follows
    the example next to the question: with the same 5 worked examples it scored 0.316 Mean@2 on 19 held-out
    shop messages with the most similar last (twice) against 0.158 and 0.237 with it first (two draws; issue 44,
    bench/README.md, bench/example_order.py)."""
    ranked = ranked_entries(entries, query, selection)
    return ranked[::-1] if selection.chooses else ranked


def select_entries(entries: Sequence[dict], query: str, selection: Selection) -> list[dict]:
    """The entries an agent is shown for `query` under `selection` (see `scored_entries`)."""
    return [entry for entry, _score in scored_entries(entries, query, selection)]


def entry_ids(entries: Sequence[dict]) -> list[str]:
    """What a rollout stores of the entries it was shown: their stable ids, in the prompt's order."""
    return [str(entry.get("id")) for entry in entries]


def bm25_scores(texts: list[str], query: str) -> list[float]:
    """BM25 (bm25s' Lucene variant, English stop words removed, no stemming) of each text for the query.

    bm25s is imported here, not at the top: the default selection (`all`) never ranks anything, and numpy and
    scipy need not be loaded for it. A query that shares no word with any text scores 0 everywhere."""
    import bm25s

    tokenizer = bm25s.tokenization.Tokenizer(stopwords=STOPWORDS)
    corpus = tokenizer.tokenize(texts, return_as="string", show_progress=False)
    retriever = bm25s.BM25()
    retriever.index(corpus, show_progress=False)
    # update_vocab=False: words of the query that no entry has are dropped (they cannot score).
    # bm25s stands in "" for a text without words; it is no term of the query.
    [terms] = tokenizer.tokenize([query or ""], return_as="string", update_vocab=False, show_progress=False)
    terms = [term for term in terms if term]
    if not terms:
        return [0.0] * len(texts)
    return [float(score) for score in retriever.get_scores(terms)]
