import threading

import pytest

from core.domain.rewards import (
    METHODS,
    RewardResult,
    cannot_try,
    majority_rewards,
    score,
    score_or_error,
    try_reward,
)
from core.errors import InvalidInput
from core.records.tasks.task_io import TaskSettings
from storage.tables import Task


def test_registry_lists_methods():
    assert {name for name, m in METHODS.items() if m.scored_by_function} == {"math", "exact", "contains", "numeric",
                                                                           "regex", "contains_all", "facts"}


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        (r"so the probability is \boxed{\frac{3}{4}}", "3/4"),
        (r"\boxed{0.75}", "3/4"),
        (r"\boxed{12.0}", "12"),
        (r"\boxed{12}", "12.0"),
        (r"\boxed{12}", "$12$"),
        (r"\boxed{\sqrt{8}}", r"2\sqrt{2}"),
        (r"Answer: \boxed{12}. Check: 3*4 = 12.", "12"),
        (r"\boxed{1 + x^2}", "x^2+1"),
        ("Final answer: 1234", "1,234"),
        ("After simplifying we get 12", "12"),
    ],
)
def test_math_correct(response, reference):
    result = score("math", response, reference)
    assert result == RewardResult(1.0, "verifier", result.detail)
    assert result.detail.startswith("correct: expected")


def test_math_wrong_answer_scores_zero_with_detail():
    result = score("math", r"\boxed{13}", "12")
    assert result.value == 0.0
    assert result.source == "verifier"
    assert result.detail == "wrong: expected 12, got 13"


def test_math_joins_all_boxes_like_math_verify():
    # math-verify reads every \boxed{} as one multi-part answer: hedging is wrong, multi-part answers work.
    hedged = score("math", r"\boxed{12} no wait \boxed{13}", "12")
    assert hedged.value == 0.0
    assert hedged.detail == "wrong: expected 12, got 12,13"
    assert score("math", r"x=\boxed{2}, y=\boxed{3}", "(2,3)").value == 1.0


def test_math_no_answer_scores_zero():
    result = score("math", "I am not sure how to solve this.", "12")
    assert result.value == 0.0
    assert "no answer found" in result.detail


def test_math_unparseable_word_answer_scores_zero():
    result = score("math", "Answer: twelve", "12")
    assert result.value == 0.0
    assert "twelve" in result.detail


def test_math_never_raises_on_garbage():
    result = score("math", r"\boxed{\frac{" * 50 + "}}}", "12")
    assert result.value == 0.0


def test_math_error_inside_verifier_is_reported(monkeypatch):
    import math_verify

    def boom(*args, **kwargs):
        raise RuntimeError("parser exploded")

    monkeypatch.setattr(math_verify, "verify", boom)
    result = METHODS["math"].score(r"\boxed{12}", "12", {})  # the scorer itself, as the scoring process runs it
    assert result.value == 0.0
    assert "RuntimeError: parser exploded" in result.detail


def test_math_leaves_running_out_of_memory_to_the_scoring_process(monkeypatch):
    import math_verify

    def greedy(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(math_verify, "verify", greedy)
    with pytest.raises(MemoryError):
        METHODS["math"].score(r"\boxed{12}", "12", {})


def test_regex_and_math_scores_read_the_last_20000_characters():
    long = "START " + "a" * 30_000 + " END"
    capped = score("regex", long, None, {"pattern": "^START"})
    assert (capped.value, capped.source) == (0.0, "verifier")
    assert capped.detail.endswith("(scored the last 20,000 of 30,010 characters)")
    assert score("regex", long, None, {"pattern": "END$"}).value == 1.0
    assert score("math", "x" * 25_000 + r" so \boxed{12}", "12").value == 1.0
    assert "scored the last" not in score("regex", "START", None, {"pattern": "^START"}).detail


def test_math_works_off_main_thread():
    results: list[RewardResult] = []
    errors: list[BaseException] = []

    def work():
        try:
            results.append(score("math", r"\boxed{\frac{3}{4}}", "3/4"))
            results.append(score("math", r"\boxed{5}", "3/4"))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=30)
    assert not errors
    assert [r.value for r in results] == [1.0, 0.0]


def test_long_strings_are_truncated_in_detail():
    result = score("exact", "Final answer: " + "a" * 1000, "b")
    assert result.value == 0.0
    assert len(result.detail) < 450


def test_exact():
    assert score("exact", "Final answer: $12.0$.", "12").value == 1.0
    assert score("exact", r"The capital is \boxed{\text{Paris}}", "paris").value == 1.0
    wrong = score("exact", r"\boxed{Lyon}", "Paris")
    assert wrong.value == 0.0
    assert wrong.detail == "wrong: expected Paris, got Lyon"
    assert score("exact", "no idea", "Paris").value == 0.0


def test_exact_says_where_it_looked_for_the_final_answer():
    sentence = score("exact", "The capital of France is Paris.", "Paris")
    assert sentence.value == 0.0
    assert sentence.detail == ('expected Paris, no answer found in response (read: the last \\boxed{}, else the line '
                               'after the last "Answer:", else the last number)')
    assert score("exact", "Answer: the capital is PARIS.", "the capital is paris").value == 1.0


@pytest.mark.parametrize(("response", "reference"), [
    ("The capital of France is Paris.", "Paris"),
    ("the capital of france is PARIS!", "paris"),
    ("It is  New\nYork, of course.", "new york"),
    ("It is the Eiffel Tower.", "Eiffel Tower"),  # articles are ignored on both sides
    ("Eiffel tower", "The Eiffel Tower"),
    ("They paid 1,234 dollars.", "1234"),
    ("Roughly 3.5 metres", "3.5"),
    ("Café au lait", "CAFÉ"),
])
def test_contains_finds_the_reference_as_whole_words(response, reference):
    result = score("contains", response, reference)
    assert (result.value, result.source) == (1.0, "verifier"), result.detail
    assert result.detail.startswith("found ")


@pytest.mark.parametrize(("response", "reference", "detail"), [
    ("The Parisian skyline", "Paris", "'paris' not found as whole words (it occurs only inside other words)"),
    ("Paris, Texas", "Paris France", "'paris france' not found as whole words"),
    ("York New", "New York", "'new york' not found as whole words"),
    ("It is 35 metres", "3.5", "'3.5' not found as whole words"),
    ("It is 12345", "1234", "'1234' not found as whole words (it occurs only inside other words)"),
])
def test_contains_refuses_parts_of_words_and_other_orders(response, reference, detail):
    result = score("contains", response, reference)
    assert (result.value, result.detail) == (0.0, detail)


def test_contains_needs_a_reference_with_words():
    with pytest.raises(ValueError, match="needs a reference answer"):
        score("contains", "Paris", "  ")
    with pytest.raises(ValueError, match="needs a reference with words, got '\\?!'"):
        score("contains", "Paris", "?!")
    assert score_or_error("contains", "Paris", "the").source == "error"


def test_every_method_says_what_it_compares_and_what_it_reads():
    for method in METHODS.values():
        assert method.description.endswith(".") and method.description.count(". ") == 0, method.name
        assert method.reads.strip(), method.name
    assert "whole words" in METHODS["contains"].description
    assert '"Answer:"' in METHODS["exact"].reads and "\\boxed{}" in METHODS["exact"].reads


# ---- try_reward: the engine's scoring for one pasted answer ---------------------------------------------


def test_try_reward_scores_as_a_run_does_with_the_tasks_settings():
    task = Task(id=1, name="t", reward_method="contains", reward_settings={})
    assert try_reward(task, "The capital of France is Paris.", "Paris") == RewardResult(
        1.0, "verifier", "found 'paris' as whole words")
    regex = TaskSettings.draft(name="t", instructions="x", reward_method="regex",
                               reward_settings={"pattern": r"#\d{4}", "full_match": True})
    assert try_reward(regex, "#1234", None).value == 1.0
    assert try_reward(regex, "order #1234", None).value == 0.0  # full_match read from the settings
    assert try_reward(Task(reward_method="math"), r"so \boxed{\frac{1}{2}}", "0.5").value == 1.0


def test_try_reward_turns_a_missing_reference_into_an_error_reward_as_a_run_does():
    result = try_reward(Task(reward_method="exact"), "Answer: 4", None)
    assert result == RewardResult(0.0, "error", "reward method 'exact' needs a reference answer")


@pytest.mark.parametrize(("method", "who"), [
    ("judge", "the judge model"),
    ("human", "people, in the labeling queue"),
    ("judge_human", "the judge model, with people confirming some of its verdicts"),
])
def test_a_reward_a_judge_or_people_give_cannot_be_tried(method, who):
    reason = f"This reward is given by {who}; it cannot be tried here."
    assert cannot_try(method) == reason
    with pytest.raises(InvalidInput, match=reason):
        try_reward(Task(reward_method=method, reward_settings={}), "Sorry about that.", "kind")


def test_every_verifier_can_be_tried_and_an_unknown_method_is_refused():
    assert all(cannot_try(name) is None for name, m in METHODS.items() if m.scored_by_function)
    with pytest.raises(InvalidInput, match="unknown reward method 'vibes'"):
        try_reward(Task(reward_method="vibes"), "x", "y")


def test_numeric_tolerance():
    assert score("numeric", r"\boxed{3.14159}", "3.14159").value == 1.0
    assert score("numeric", r"\boxed{3.14}", "3.14159").value == 0.0
    assert score("numeric", r"\boxed{3.14}", "3.14159", {"rel_tol": 0.01}).value == 1.0
    assert score("numeric", r"\boxed{0.001}", "0", {"abs_tol": 0.01}).value == 1.0
    assert score("numeric", r"\boxed{0.001}", "0").value == 0.0
    assert score("numeric", "Answer: 1,000", "1000").value == 1.0
    assert score("numeric", r"\boxed{0.75}", "3/4").value == 1.0


def test_numeric_non_numeric_answer():
    result = score("numeric", r"\boxed{\frac{3}{4}}", "0.75")
    assert result.value == 0.0
    assert "non-numeric" in result.detail
    ref = score("numeric", r"\boxed{1}", "Paris")
    assert ref.value == 0.0
    assert "not numeric" in ref.detail


def test_unknown_method_names_known_methods():
    with pytest.raises(ValueError, match="unknown reward method 'llm'.*exact, facts, math, numeric"):
        score("llm", "x", "y")


@pytest.mark.parametrize("method", ["math", "exact", "numeric", "contains"])
@pytest.mark.parametrize("reference", [None, "", "   "])
def test_missing_reference_raises(method, reference):
    with pytest.raises(ValueError, match="needs a reference answer"):
        score(method, r"\boxed{1}", reference)


def test_majority_basic():
    responses = [r"\boxed{12}", r"\boxed{13}", "Final answer: 12.0", "no idea", r"\boxed{12}"]
    results = majority_rewards(responses)
    assert [r.value for r in results] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert {r.source for r in results} == {"majority"}
    assert results[0].detail == "agrees with majority answer 12 (3 of 5)"
    assert "13" in results[1].detail and "disagrees" in results[1].detail
    assert "no answer" in results[3].detail


def test_majority_tie_goes_to_first_seen():
    results = majority_rewards([r"\boxed{7}", r"\boxed{9}", r"\boxed{9}", r"\boxed{7}"])
    assert [r.value for r in results] == [1.0, 0.0, 0.0, 1.0]
    assert "majority answer 7 (2 of 4)" in results[0].detail


def test_majority_ignores_none_even_when_most_common():
    results = majority_rewards(["hmm", "no clue", r"\boxed{4}"])
    assert [r.value for r in results] == [0.0, 0.0, 1.0]


def test_majority_all_none_and_empty():
    results = majority_rewards(["hmm", "no clue"])
    assert [r.value for r in results] == [0.0, 0.0]
    assert majority_rewards([]) == []


def test_regex_from_the_reference_or_the_task_setting():
    assert score("regex", "Order #A-1234 has shipped.", r"#[A-Z]-\d{4}").value == 1.0
    assert score("regex", "Your order has shipped.", r"#[A-Z]-\d{4}").value == 0.0
    # the task's pattern serves every sample, with or without a reference
    hit = score("regex", "I am SORRY for the delay", None, {"pattern": r"\bsorry\b"})
    assert (hit.value, hit.source) == (1.0, "verifier") and "SORRY" in hit.detail
    assert score("regex", "I am SORRY", None, {"pattern": r"\bsorry\b", "ignore_case": False}).value == 0.0
    assert score("regex", "42 apples", r"\d+", {"full_match": True}).value == 0.0
    assert score("regex", "42", r"\d+", {"full_match": True}).value == 1.0


def test_regex_configuration_mistakes_raise():
    with pytest.raises(ValueError, match="invalid regular expression"):
        score("regex", "text", "([unclosed")
    with pytest.raises(ValueError, match="needs a reference"):
        score("regex", "text", None)


def test_contains_all_phrases():
    reply = "I'm sorry about the delay. Your refund was issued today; next, check your bank in 3 days."
    assert score("contains_all", reply, "sorry; refund; next").value == 1.0
    missing = score("contains_all", reply, "sorry\nrefund\ndiscount code")
    assert missing.value == 0.0 and missing.detail == "2 of 3 phrases found; missing: discount code"
    partial = score("contains_all", reply, None, {"phrases": ["SORRY", "discount code"], "partial": True})
    assert partial.value == 0.5
    assert score("contains_all", reply, None, {"phrases": "Sorry", "ignore_case": False}).value == 0.0
    assert score("contains_all", "a  refund\nwas issued", "refund was issued").value == 1.0


def test_contains_all_without_phrases_is_a_configuration_error():
    with pytest.raises(ValueError, match="needs"):
        score("contains_all", "text", " ; ")
