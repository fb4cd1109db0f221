"""bench/example_choice.py's `clear` presentation (stop 58), on BM25 alone, with no model."""

from __future__ import annotations

from bench.example_choice import clear_or
from core.domain.selection import Selection, SelectionMode, select_entries

EXAMPLES = [{"id": "E1", "kind": "example", "text": "Problem: my tent tore. Answer: Our tent warranty is 3 years."},
            {"id": "E2", "kind": "example", "text": "Problem: a late parcel. Answer: Your ticket reference is PC-1."},
            {"id": "E3", "kind": "example", "text": "Problem: boots pinch. Answer: Our return window is 45 days."}]
TWO = Selection(SelectionMode.TOP_K, 2)


def ids(entries: list[dict]) -> list[str]:
    return [entry["id"] for entry in entries]


def test_a_top_example_that_stands_clear_of_the_second_is_shown_alone_and_otherwise_the_selection_stands():
    clear = clear_or(select_entries, 2.0)
    assert ids(clear(EXAMPLES, "How long is the tent warranty?", TWO)) == ["E1"]
    both = "Is the return window longer than the tent warranty?"
    assert ids(clear(EXAMPLES, both, TWO)) == ids(select_entries(EXAMPLES, both, TWO))
    assert len(ids(clear(EXAMPLES, both, TWO))) == 2
