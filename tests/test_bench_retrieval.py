"""bench/retrieval.py (issue 36, item 3) on BM25 alone, with no model: the labels it measures by and its figures."""

from __future__ import annotations

import json

from bench import retrieval


def test_one_example_per_policy_and_each_test_message_labelled_by_its_references_facts():
    data = retrieval.policy_dataset()
    labels = [label for label, _text in data.examples]
    assert len(labels) == len(set(labels)) == 8 and "return window" in labels
    assert all(text.startswith("Problem: ") and text.endswith(".") and ";" not in text for _label, text in data.examples)
    assert len(data.cases) == 16 and all(case.labels <= set(labels) for case in data.cases)


def test_an_arithmetic_problems_method_is_the_simplest_expression_of_its_numbers():
    assert retrieval.method_of("Katie had 85 files. She deleted 40 and put the rest into folders of 5.", "9") == (
        "(a-b)/c")
    assert retrieval.method_of("Luke won 2 tickets and 13 tickets.", "15") == "a+b"
    assert retrieval.method_of("No numbers here.", "3") is None


def test_the_figures_are_the_share_of_queries_whose_own_example_ranks_first_and_all_in_the_top_3(tmp_path):
    data = retrieval.Dataset("toy", [("a", "apples and pears"), ("b", "boats and rivers"), ("c", "cars")],
                             [retrieval.Case("pears please", frozenset({"a"})),
                              retrieval.Case("a boat on a river", frozenset({"a", "b"}))])
    figures = retrieval.measure(data, retrieval.bm25_rankings)
    assert (figures["first"], figures["top_k"], figures["queries"]) == (2, 2, 2)
    assert retrieval.main(["--json", str(tmp_path / "r.json")]) == 0
    rows = json.loads((tmp_path / "r.json").read_text())["results"]
    assert {(row["dataset"], row["method"]) for row in rows} >= {("shop policies", "BM25 (default)"),
                                                                 ("arithmetic", "BM25 (default)")}
