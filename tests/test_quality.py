"""Quality flags on proposed experiences (core.domain.quality): each flag fires on its sign and stays quiet without it."""

from __future__ import annotations

import pytest

from core.domain.library import EXAMPLE, MAX_CHARS, MAX_WORDS
from core.domain.quality import NEAR_DUPLICATE, numbers_in, quality_flags, similarity

CLEAN = "Re-read the question to find which quantity it asks for."
LIBRARY = [{"id": "E1", "text": "Write each quantity with its unit before computing."},
           {"id": "E2", "text": "Check the final answer against the question."}]
QUERY = "Tom has 48 apples and gives away 12.5 kilograms of them to 1,250 friends. How many are left?"


def codes(text, kind="ADD", ids=(), library=(), others=None, queries=()) -> list[str]:
    return [f.code for f in quality_flags(text, kind, list(ids), list(library), others or {}, query_texts=queries)]


def test_a_clean_general_sentence_has_no_flag():
    assert codes(CLEAN, library=LIBRARY, others={"operation 2": "Estimate the answer before computing it."},
                 queries=[QUERY]) == []


@pytest.mark.parametrize("text", [
    "Re-read the question to find which quantity it asks for and the",  # dangling word, no full stop
    "Re-read the question to find which quantity it",                    # no full stop
    "Re-read the question (the part after the comma to find the quantity.",  # unbalanced bracket
    'Re-read the question for the word "total to find the quantity.',    # unbalanced quote
])
def test_text_cut_off_mid_sentence_is_flagged(text):
    assert codes(text) == ["cut_off"]


def test_the_cut_off_sentence_names_the_dangling_word():
    [flag] = quality_flags("Check which quantity the question asks for and the", "ADD", [], [], {})
    assert '"the"' in flag.message and "cut off" in flag.message


@pytest.mark.parametrize("text", [
    CLEAN, "Does the answer use the unit the question asks for?", 'Look for words like "total" or "left".',
    "Estimate first (roughly) and compare with the exact result!",
])
def test_whole_sentences_are_not_cut_off(text):
    assert "cut_off" not in codes(text)


def test_near_duplicate_of_an_existing_experience_is_flagged_with_its_id():
    text = "Write every quantity with its unit before computing."
    assert similarity(text, LIBRARY[0]["text"]) >= NEAR_DUPLICATE
    [flag] = quality_flags(text, "ADD", [], LIBRARY, {})
    assert flag.code == "near_duplicate" and "experience E1" in flag.message


def test_a_modify_is_not_a_duplicate_of_its_own_target_but_of_another_experience_it_is():
    text = "Write every quantity with its unit before computing."
    assert codes(text, "MODIFY", ["E1"], LIBRARY) == []
    assert codes(text, "MODIFY", ["E2"], LIBRARY) == ["near_duplicate"]
    assert codes(text, "MERGE", ["E1", "E2"], LIBRARY) == []


def test_near_duplicate_of_another_operation_of_the_step_is_flagged():
    [flag] = quality_flags(CLEAN, "ADD", [], [], {"operation 2": "Re-read the question to find what quantity it asks for."})
    assert flag.code == "near_duplicate" and "operation 2" in flag.message


def test_a_different_lesson_on_the_same_topic_is_not_a_duplicate():
    assert similarity(CLEAN, LIBRARY[1]["text"]) < NEAR_DUPLICATE
    assert codes(CLEAN, library=LIBRARY, others={"operation 2": "Check the units of the final answer."}) == []


def test_numbers_of_the_steps_queries_are_flagged():
    text = "When someone gives away 12.5 kilograms of 48 apples, subtract before dividing."
    [flag] = quality_flags(text, "ADD", [], [], {}, query_texts=[QUERY])
    assert flag.code == "query_numbers" and "48" in flag.message and "12.5" in flag.message
    assert codes("Divide the total among the 1250 friends before rounding.", queries=[QUERY]) == ["query_numbers"]


def test_small_or_unrelated_numbers_are_not_flagged():
    assert codes("Split the problem into 2 or 3 smaller steps first.", queries=[QUERY]) == []  # one digit
    assert codes("Percentages above 100 usually mean a mistake in the setup.", queries=[QUERY]) == []
    assert codes("Re-check experience E12 when the question mentions apples.", queries=["E12 apples"]) == []


def test_numbers_in_reads_commas_decimals_and_skips_ids():
    assert numbers_in("1,250 and 12.50 and 7 and E12 and 48.") == {"1250", "12.5", "48"}


def test_over_the_length_limit_is_flagged_and_at_the_limit_is_not():
    words = ["word"] * MAX_WORDS
    assert "too_long" not in codes(" ".join(words) + ".")
    assert "too_long" in codes(" ".join([*words, "more"]) + ".")
    assert "too_long" in codes("a" * MAX_CHARS + ".")


def test_delete_and_keep_have_no_text_to_flag():
    assert codes("", "DELETE", ["E1"], LIBRARY) == []
    assert codes(None, "KEEP") == []
    assert codes("cut off and the", "DELETE", ["E1"], LIBRARY) == []


def test_source_groups_are_ranked_by_how_closely_their_lessons_read_like_the_operation():
    from core.domain.quality import rank_sources

    lessons = {7: ["Write each quantity with its unit."], 3: ["Re-read the question to find what it asks for."],
               9: []}
    ranked = rank_sources("Re-read the question to find which quantity it asks for.", lessons)
    assert [gid for gid, _ in ranked] == [3, 7, 9]
    assert ranked[0][1] > 0.8 > ranked[1][1] and ranked[2][1] == 0.0


# --- each kind by its own rules (issue 36) -------------------------------------------------------------------------

REFERENCE_EXAMPLE = "Problem: My bike frame cracked, is it covered? Answer: 0800 410 2277;LK-50786"


@pytest.mark.parametrize("text", [
    REFERENCE_EXAMPLE,                                                  # a code: the held example
    "Problem: How long is a bike frame guaranteed? Answer: 7 years",    # a quantity
    "Problem: Tom has 48 apples and gives away 12. How many are left? Answer: 36",  # a number, the query's numbers
])
def test_a_worked_example_ending_with_its_answer_is_not_cut_off(text):
    assert quality_flags(text, "ADD", [], [], {}, query_texts=[text], entry_kind=EXAMPLE) == []


def test_a_lesson_keeps_the_sentence_rule_and_an_example_still_may_not_end_on_a_dangling_word():
    assert codes(REFERENCE_EXAMPLE) == ["cut_off"]  # the same text as a lesson: no stop
    [flag] = quality_flags("Problem: How long do refunds take? Answer: within 7 business days and", "ADD", [], [],
                           {}, entry_kind=EXAMPLE)
    assert flag.code == "cut_off" and 'it ends on "and" with no full stop' in flag.message


def test_an_example_is_judged_against_its_own_length_limit():
    text = "Problem: " + " ".join(["word"] * (MAX_WORDS + 10)) + " Answer: 10."
    assert codes(text) == ["too_long"]
    assert quality_flags(text, "ADD", [], [], {}, entry_kind=EXAMPLE) == []
