"""The third frozen development task (issue 59, item 4): Alderbank's permits desk, two items per answer.

Each reference is a form code and a time with no field names ("BX-14;8 weeks"), scored by `contains_all`. These
tests check offline that the file keeps its shape (6 needs, 3/2/3 messages per need, one reference per need), that
the agent's instructions give none of the answers away, that test messages are worded far from the training
messages of their need (bench/wording_distance.py), and that the studio's reward needs both items.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from bench.wording_distance import check_far, closest, content_words, instruction_words, read_rows
from core.domain.rewards import required_phrases, score_or_error

ROOT = Path(__file__).resolve().parent.parent
TASK = json.loads((ROOT / "bench" / "alderbank_task.json").read_text(encoding="utf-8"))
ROWS = read_rows(ROOT / "bench" / "alderbank_permits.jsonl")


def references() -> dict[str, set[str]]:
    by_need: dict[str, set[str]] = defaultdict(set)
    for row in ROWS:
        by_need[row["need"]].add(row["reference"])
    return by_need


def test_rows_parse_with_the_fields_and_unique_ids():
    assert len(ROWS) == 48
    assert all(set(row) == {"id", "query", "reference", "need", "split"} for row in ROWS)
    assert len({row["id"] for row in ROWS}) == 48
    assert TASK["reward_method"] == "contains_all" and TASK["reward_settings"] == {}
    assert {"name", "description", "instructions", "answer_format"} <= set(TASK)


def test_six_needs_split_3_2_3_each():
    counts = Counter((row["need"], row["split"]) for row in ROWS)
    assert len({row["need"] for row in ROWS}) == 6
    for need in {row["need"] for row in ROWS}:
        assert (counts[need, "train"], counts[need, "validation"], counts[need, "test"]) == (3, 2, 3)


def test_one_reference_per_need_two_phrases_each_all_different():
    by_need = references()
    assert all(len(refs) == 1 for refs in by_need.values())
    phrases = [required_phrases(ref, {}) for refs in by_need.values() for ref in refs]
    assert all(len(p) == 2 for p in phrases)
    flat = [p.lower() for pair in phrases for p in pair]
    assert len(set(flat)) == 12
    # no phrase is inside another, so a reply stating one need's time never passes for another's
    assert not [(a, b) for a in flat for b in flat if a != b and a in b]
    assert all(":" not in ref for refs in by_need.values() for ref in refs)  # no field names


def test_neither_instructions_nor_messages_give_the_answers_away():
    given = " ".join([TASK["instructions"], TASK["answer_format"], TASK["description"]]).lower()
    for row in ROWS:
        for phrase in required_phrases(row["reference"], {}):
            assert phrase.lower() not in given
            assert phrase.lower() not in row["query"].lower(), row["id"]


def test_test_messages_are_worded_far_from_the_training_ones_of_their_need():
    assert check_far(ROWS, max_shared=2, instructions=TASK["instructions"]) == []
    found = closest(ROWS, "test", instruction_words(TASK["instructions"]))
    assert len(found) == 18 and all(c.train_id is not None for c in found)


def test_check_far_reports_a_test_message_that_repeats_a_training_one():
    train = {"id": "x1", "query": "Which form for a loft conversion with a dormer window?", "need": "n", "split": "train"}
    near = {**train, "id": "x2", "split": "test"}
    assert check_far([train, near], max_shared=2) == ["x2 ~ x1: conversion, dormer, form, loft, window"]
    assert check_far([train, near], max_shared=2, instructions="Name the form.") == [
        "x2 ~ x1: conversion, dormer, loft, window"]
    assert content_words("The Permits desk's forms", instruction_words("permit desk")) == {"form"}


@pytest.mark.parametrize("need", sorted({row["need"] for row in ROWS}))
def test_the_reward_needs_both_items(need):
    reference = next(iter(references()[need]))
    code, time = required_phrases(reference, {})
    both = f"Hello, for that please use form {code}; we decide within {time.upper()} of receiving it."
    assert score_or_error(TASK["reward_method"], both, reference, TASK["reward_settings"]).value == 1.0
    only_code = f"Please fill in form {code} and we will be in touch."
    only_time = f"Please fill in our application form; you will hear back within {time}."
    for reply in (only_code, only_time):
        assert score_or_error(TASK["reward_method"], reply, reference, TASK["reward_settings"]).value < 1.0
