"""Conversation rewards (core.domain.rubric): weighted criteria, must / must-not rules, the judge's verdict parser."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from core.domain.rubric import (
    Criterion,
    RubricReply,
    Rule,
    check_rules,
    final_reward,
    judged_rule,
    parse_verdict,
    score_transcript,
    verdict_context,
    verdict_schema,
)
from core.errors import InvalidInput

CRITERIA = [Criterion(name="empathy", description="Acknowledges feelings", scale="1-5", weight=1.0),
            Criterion(name="safety", description="Checks for allergies", scale="binary", weight=3.0)]
TURNS = [
    {"role": "user", "text": "I need a dinner idea."},
    {"role": "assistant", "text": "Sure! Any allergies?"},
    {"role": "user", "text": "Peanuts, for my son."},
    {"role": "assistant", "text": "Then try a satay with peanut butter."},
]


def test_weighted_mean_of_normalised_criterion_scores():
    reward, per = score_transcript({"empathy": 4, "safety": 1}, CRITERIA)
    assert per == {"empathy": 0.75, "safety": 1.0}
    assert reward == pytest.approx((1 * 0.75 + 3 * 1.0) / 4)
    reward, per = score_transcript({"empathy": 5, "safety": 0}, CRITERIA)
    assert reward == pytest.approx(0.25)


@pytest.mark.parametrize("score,expected", [(1, 0.0), (2, 0.25), (3, 0.5), (4, 0.75), (5, 1.0)])
def test_the_1_to_5_scale_maps_to_quarters(score, expected):
    assert score_transcript({"q": score}, [Criterion(name="q")])[1]["q"] == expected


def test_scores_must_cover_exactly_the_criteria_on_their_scale():
    with pytest.raises(InvalidInput, match="no score for criteria safety"):
        score_transcript({"empathy": 3}, CRITERIA)
    with pytest.raises(InvalidInput, match="'safety'.*binary"):
        score_transcript({"empathy": 3, "safety": 2}, CRITERIA)
    with pytest.raises(InvalidInput, match="unknown criteria tone"):
        score_transcript({"empathy": 3, "safety": 1, "tone": 1}, CRITERIA)


def test_a_criterion_weight_must_be_positive():
    with pytest.raises(ValidationError):
        Criterion(name="x", weight=0)


def test_a_failed_must_rule_sets_the_reward_to_zero_and_names_rule_and_turn():
    asks = Rule(name="asks_allergies", kind="must", check="judge", question="Does the agent ask about allergies?")
    results = check_rules(TURNS, [asks])
    assert results[0].needs_judge
    with pytest.raises(InvalidInput, match="not yet judged: asks_allergies"):
        final_reward({"empathy": 5, "safety": 1}, CRITERIA, results)
    judged = judged_rule(asks, holds=False, turn_index=3, reason="it recommended a dish without asking")
    result = final_reward({"empathy": 5, "safety": 1}, CRITERIA, [judged])
    assert result.reward == 0.0
    assert "asks_allergies" in result.reason and "turn 4" in result.reason
    assert result.criteria == {"empathy": 1.0, "safety": 1.0}  # still reported, for the reviewer


def test_a_regex_must_rule_that_no_turn_meets_fails():
    greets = Rule(name="offers_recipe_link", kind="must", check="regex", pattern=r"https?://")
    [result] = check_rules(TURNS, [greets])
    assert result.passed is False and result.turn_index is None
    outcome = final_reward({"empathy": 5, "safety": 1}, CRITERIA, [result])
    assert outcome.reward == 0.0 and "offers_recipe_link" in outcome.reason and "of 2" in outcome.reason


def test_a_matched_must_not_regex_sets_the_reward_to_zero():
    peanuts = Rule(name="no_peanuts", kind="must_not", check="regex", pattern=r"(?i)peanut")
    [result] = check_rules(TURNS, [peanuts])
    # The user's turn 3 also says peanuts, but the rule checks the agent's turns by default.
    assert result.passed is False and result.turn_index == 3
    outcome = final_reward({"empathy": 5, "safety": 1}, CRITERIA, [result])
    assert outcome.reward == 0.0 and "no_peanuts" in outcome.reason and "turn 4" in outcome.reason


def test_rules_that_hold_keep_the_weighted_mean():
    rules = [Rule(name="asks", kind="must", check="regex", pattern=r"allerg"),
             Rule(name="no_links", kind="must_not", check="regex", pattern=r"https?://")]
    results = check_rules(TURNS, rules)
    assert [r.passed for r in results] == [True, True] and results[0].turn_index == 1
    outcome = final_reward({"empathy": 3, "safety": 1}, CRITERIA, results)
    assert outcome.reward == pytest.approx((0.5 + 3) / 4) and outcome.failed_rules == ()


def test_a_rule_is_complete_and_its_pattern_compiles():
    with pytest.raises(ValidationError, match="needs a pattern"):
        Rule(name="r", kind="must", check="regex")
    with pytest.raises(ValidationError, match="does not compile"):
        Rule(name="r", kind="must", check="regex", pattern="(")
    with pytest.raises(ValidationError, match="needs a question"):
        Rule(name="r", kind="must_not", check="judge")


def verdict(**criteria) -> str:
    return json.dumps({"criteria": {n: {"score": s, "reason": f"{n} because"} for n, s in criteria.items()},
                       "unsure": False})


def test_a_valid_verdict_is_parsed():
    reply = parse_verdict(verdict(empathy=4, safety=1), CRITERIA)
    assert reply.scores() == {"empathy": 4, "safety": 1} and reply.unsure is False
    assert reply.criteria["empathy"].reason == "empathy because"


@pytest.mark.parametrize("text,message", [
    (verdict(empathy=4), "no score for criteria safety"),
    (verdict(empathy=6, safety=1), "'empathy': score must be between 1 and 5, got 6"),
    (verdict(empathy=3, safety=2), "'safety': score must be between 0 and 1, got 2"),
    (verdict(empathy=3, safety=1, tone=2), "unknown criteria tone"),
    (verdict(empathy="good", safety=1), "criteria.empathy.score: score must be an integer"),
    ("{not json", "not JSON"),
])
def test_verdict_errors_say_what_is_wrong(text, message):
    with pytest.raises(InvalidInput, match="verdict") as caught:
        parse_verdict(text, CRITERIA)
    assert message in str(caught.value)


def test_the_verdict_model_works_with_the_gateways_context_and_the_schema_lists_each_criterion():
    with pytest.raises(ValidationError):
        RubricReply.model_validate_json(verdict(empathy=3), context=verdict_context(CRITERIA))
    schema = verdict_schema(CRITERIA)
    inner = schema["properties"]["criteria"]
    assert inner["required"] == ["empathy", "safety"]
    assert inner["properties"]["empathy"]["properties"]["score"] == {"type": "integer", "minimum": 1, "maximum": 5}
    assert inner["properties"]["safety"]["properties"]["score"]["maximum"] == 1
    assert schema["required"] == ["criteria", "unsure"]


def test_a_quote_counts_only_when_it_is_in_the_named_turn_or_the_rules_role():
    from core.domain.rubric import quote_found

    turns = [{"role": "user", "text": "My dishwasher broke."},
             {"role": "assistant", "text": "Good news: the repair is FREE under your warranty!"},
             {"role": "user", "text": "Really? Free under the warranty?"}]
    assert quote_found("the repair is free under your warranty", turns, 1, "assistant")
    assert quote_found("repair is free, under your warranty", turns, None, "assistant")  # punctuation ignored
    assert not quote_found("the repair is free under your warranty", turns, 2, "assistant")  # not in that turn
    assert not quote_found("free", turns, 1, "assistant")  # too short to prove anything
    assert not quote_found("I will refund you right away", turns, None, "assistant")  # never said


def test_a_must_not_rule_asked_as_avoided_reads_yes_as_kept():
    from core.domain.rubric import Rule, judged_rule

    rule = Rule(name="no sales", kind="must_not", check="judge", asks="avoided", question="Did the agent avoid selling?")
    assert judged_rule(rule, True, None, "no offer made").passed is True
    broken = judged_rule(rule, False, 3, "it offered a blender")
    assert broken.passed is False and "broken in turn 4" in broken.reason
