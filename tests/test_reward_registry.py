"""The reward-method registry (core.domain.rewards.METHODS): one object per method, read by every part of the studio.

A method added to (a test copy of) the registry shows up on the Tasks page, in task validation, in the
scorer and in the engine's decisions, with no other table to edit.
"""

from __future__ import annotations

import asyncio
import math
import re
import subprocess
import sys
from typing import get_args

import pytest
from pydantic import Field
from sqlmodel import Session

from core.domain import datasets, rewards
from core.domain.rewards import (
    METHODS,
    Method,
    MethodSettings,
    RewardMethod,
    RewardResult,
    check_settings,
    get_method,
    score,
    setting_keys,
)
from core.errors import InvalidInput
from core.grpo.rollouts import _assign_reward
from core.models import judge
from core.records.review.labeling import is_person_method, needs_person
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.task_io import TaskSettings
from storage import queries
from storage.tables import Rollout, Sample, Task
from tests.ui_support import run_app
from ui.common import REVIEWER_KEY


class LengthSettings(MethodSettings):
    max_words: int = Field(50, ge=1, description="a whole number of 1 or more")


def _length(response: str, reference: str, settings: dict) -> RewardResult:
    limit = settings.get("max_words", 50)
    ok = len(response.split()) <= limit
    return RewardResult(float(ok), "verifier", f"{len(response.split())} words, limit {limit}")


LENGTH = Method("length", "at most max_words words", LengthSettings, scorer=_length)


@pytest.fixture
def with_length(monkeypatch):
    """The registry with one more method, as a newer studio or a plugin would add it."""
    monkeypatch.setitem(METHODS, "length", LENGTH)
    return LENGTH


def task_settings(**overrides) -> TaskSettings:
    base = dict(name="t", instructions="Answer.", policy_model="p", learner_model="l", judge_model="j")
    return TaskSettings(**{**base, **overrides})


# ---- every method is described completely -------------------------------------------------------------


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_has_a_name_a_description_and_a_settings_model(name):
    method = METHODS[name]
    assert isinstance(method, RewardMethod)
    assert method.name == name and get_method(name) is method
    assert method.description.strip()
    assert issubclass(method.settings_model, MethodSettings)
    for key, field in method.settings_model.model_fields.items():
        assert field.description, f"{name}.{key} has no rule to show when a value breaks it"
    if method.reference_setting is not None:
        assert method.needs_reference and method.reference_setting in setting_keys(name)
    if method.scored_by_function:
        assert method.needs_reference
    else:
        with pytest.raises(InvalidInput, match=f"reward method '{name}' is scored by"):
            method.score("x", "y", {})


def test_the_flags_say_who_scores():
    who = {name: (m.scored_by_function, m.uses_judge, m.uses_people) for name, m in METHODS.items()}
    assert who == {"math": (True, False, False), "exact": (True, False, False), "contains": (True, False, False),
                   "numeric": (True, False, False), "regex": (True, False, False), "contains_all": (True, False, False),
                   "facts": (True, False, False), "judge": (False, True, False), "human": (False, False, True),
                   "judge_human": (False, True, True), "rubric": (False, True, True)}


def test_the_methods_that_run_patterns_or_parsers_are_isolated():
    assert {name for name, m in METHODS.items() if m.isolated} == {"math", "regex"}
    assert all(m.scored_by_function for m in METHODS.values() if m.isolated)


def test_rewards_starts_no_scoring_process_on_import():
    code = ("import core.domain.rewards, core.domain.scoring as s; import sys; "
            "sys.exit(s._pool is not None and bool(s._pool._idle or s._pool._busy))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_unknown_name_is_refused_naming_the_known_methods():
    with pytest.raises(InvalidInput, match="unknown reward method 'vibes'; use one of math, exact, .*judge_human"):
        get_method("vibes")
    with pytest.raises(InvalidInput, match="unknown reward method 'vibes'.*contains_all, exact, facts, math"):
        score("vibes", "x", "y")
    with pytest.raises(InvalidInput, match="'judge' is scored by the judge model, not by a function"):
        score("judge", "x", "y")


def test_the_scales_and_limits_match_the_judge_and_the_datasets():
    assert set(get_args(rewards.Scale)) == set(judge.SCALES)
    assert rewards.JudgeSettings.model_fields["scale"].default == judge.DEFAULT_SCALE
    assert rewards.MAX_CRITERIA_CHARS == datasets.MAX_FIELD_CHARS


def test_rewards_stays_a_pure_module():
    code = ("import sys, core.domain.rewards; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('storage', 'sqlalchemy', 'sqlmodel', 'streamlit', 'openai', 'httpx') or m in ('core.models.gateway', "
            "'core.models.judge', 'core.settings')); print(bad); sys.exit(bool(bad))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# ---- each constraint is refused with a message naming the setting ---------------------------------------


@pytest.mark.parametrize(("method", "settings", "message"), [
    ("numeric", {"rel_tol": -1}, "rel_tol must be a number of 0 or more, got -1"),
    ("numeric", {"abs_tol": "0.1"}, "abs_tol must be a number of 0 or more, got '0.1'"),
    ("numeric", {"abs_tol": True}, "abs_tol must be a number of 0 or more, got True"),
    ("numeric", {"rel_tol": math.nan}, "rel_tol must be a number of 0 or more"),
    ("numeric", {"rel_tol": math.inf}, "rel_tol must be a number of 0 or more"),
    ("regex", {"pattern": "(unclosed"}, "pattern is not a valid regular expression"),
    ("regex", {"pattern": 5}, "pattern must be text"),
    ("regex", {"ignore_case": "yes"}, "ignore_case must be true or false, got 'yes'"),
    ("regex", {"full_match": 1}, "full_match must be true or false, got 1"),
    ("contains_all", {"phrases": ["a", 1]}, "phrases must be a list of text phrases"),
    ("contains_all", {"phrases": {"a": 1}}, "phrases must be a list of text phrases"),
    ("contains_all", {"partial": "no"}, "partial must be true or false"),
    ("contains_all", {"ignore_case": 0}, "ignore_case must be true or false"),
    ("judge", {"criteria": ["a"]}, "criteria must be text"),
    ("judge", {"criteria": "x" * 20_001}, "criteria is longer than 20,000 characters"),
    ("judge", {"scale": "1-10"}, "scale must be one of binary, 1-5, got '1-10'"),
    ("human", {"scale": 5}, "scale must be one of binary, 1-5"),
    ("human", {"labels_per_rollout": 0}, "labels_per_rollout must be a whole number from 1 to 5, got 0"),
    ("human", {"labels_per_rollout": 6}, "labels_per_rollout must be a whole number from 1 to 5"),
    ("human", {"labels_per_rollout": 2.0}, "labels_per_rollout must be a whole number"),
    ("human", {"labels_per_rollout": True}, "labels_per_rollout must be a whole number"),
    ("judge_human", {"spot_check_share": 1.5}, "spot_check_share must be a number from 0 to 1, got 1.5"),
    ("judge_human", {"spot_check_share": -0.1}, "spot_check_share must be a number from 0 to 1"),
    ("judge_human", {"spot_check_share": math.nan}, "spot_check_share must be a number from 0 to 1"),
    ("judge_human", {"labels_per_rollout": 9}, "labels_per_rollout must be"),
])
def test_each_constraint_is_refused_naming_the_setting(method, settings, message):
    with pytest.raises(InvalidInput, match=message):
        check_settings(method, settings)
    with pytest.raises(InvalidInput, match=message):
        task_settings(reward_method=method, reward_settings=settings)


COSTLY = "pattern can take exponential time: a repeated group can match the same text in more than one way"


@pytest.mark.parametrize("pattern", [r"(a+)+", r"(a+)+$", r"^(\w+\s?)*$", r"(a|aa)*", r"(?:\d+)+", r"(.*,)+",
                                     r"(\w*\.\w*)+", r"(x\w+)+", r"(a{1,2})+", r"((a+)b?)+", r"(abc|a\wc)+"])
def test_a_pattern_that_can_take_exponential_time_is_refused(pattern):
    with pytest.raises(InvalidInput, match=re.escape(COSTLY)):
        check_settings("regex", {"pattern": pattern})
    with pytest.raises(InvalidInput, match=re.escape(COSTLY)):
        task_settings(reward_method="regex", reward_settings={"pattern": pattern})
    assert rewards.pattern_problem(pattern).startswith(COSTLY)


@pytest.mark.parametrize("pattern", [r"^\d+$", r"(ab)+", r"\w+\s\w+", r"\bsorry\b", r"#[A-Z]-\d{4}",
                                     r"[\w.+-]+@[\w-]+(\.[\w-]+)+", r"\d+(,\s*\d+)*", r"(\w+\s)*\w+",
                                     r"(\d{1,3},)*\d+", r"(cat|car)+", r"(\d|\w)*", r"(?i)(sorry|apolog\w*)",
                                     r"(https?://)?[\w.-]+", r"(a++)+", ""])
def test_an_ordinary_pattern_is_accepted(pattern):
    check_settings("regex", {"pattern": pattern})
    assert task_settings(reward_method="regex", reward_settings={"pattern": pattern}).reward_settings == {
        "pattern": pattern}
    assert rewards.pattern_problem(pattern) is None


def test_keys_a_method_does_not_read_are_kept_unchecked_and_null_means_the_default():
    odd = {"scale": "nonsense", "future_key": {"nested": [1]}, "labels_per_rollout": "many"}
    check_settings("numeric", odd)
    assert task_settings(reward_method="numeric", reward_settings=odd).reward_settings == odd
    check_settings("judge_human", {"criteria": None, "scale": None, "spot_check_share": None})
    assert score("regex", "I am SORRY", r"\bsorry\b", {"ignore_case": None}).value == 1.0
    with pytest.raises(InvalidInput, match="reward settings must be a JSON object"):
        check_settings("math", [])


def test_valid_settings_of_every_method_pass():
    for method, settings in [("math", {}), ("exact", {}), ("contains", {}), ("numeric", {"rel_tol": 0, "abs_tol": 1e-3}),
                             ("regex", {"pattern": r"\d+", "ignore_case": False, "full_match": True}),
                             ("contains_all", {"phrases": "sorry", "partial": True}),
                             ("contains_all", {"phrases": ["a", "b"], "ignore_case": False}),
                             ("judge", {"criteria": "kind", "scale": "1-5"}),
                             ("human", {"labels_per_rollout": 5}),
                             ("judge_human", {"spot_check_share": 0, "labels_per_rollout": 1})]:
        check_settings(method, settings)
        assert task_settings(reward_method=method, reward_settings=settings).reward_settings == settings


# ---- validation, the scorer and the engine read the registry --------------------------------------------


def test_a_method_added_to_the_registry_is_validated_and_scored(with_length):
    assert setting_keys("length") == ("max_words",)
    assert task_settings(reward_method="length", reward_settings={"max_words": 3}).reward_method == "length"
    with pytest.raises(InvalidInput, match="max_words must be a whole number of 1 or more, got 0"):
        task_settings(reward_method="length", reward_settings={"max_words": 0})
    assert TaskSettings.from_dict({"name": "t", "instructions": "A.", "reward_method": "length"}).reward_method == \
        "length"
    assert score("length", "one two three", None, {"max_words": 3}).value == 1.0
    assert score("length", "one two three four", None, {"max_words": 3}).value == 0.0


def test_a_method_removed_from_the_registry_is_refused(monkeypatch):
    monkeypatch.delitem(METHODS, "exact")
    with pytest.raises(InvalidInput, match="unknown reward method 'exact'"):
        task_settings(reward_method="exact")
    with pytest.raises(InvalidInput, match="unknown reward method 'exact'"):
        score("exact", "x", "x")


def test_the_engine_scores_a_registered_verifier_without_the_judge(with_length):
    task = Task(id=1, name="t", reward_method="length", reward_settings={"max_words": 2})
    row = Rollout(sample_id=1, group_index=0, response="two words")
    asyncio.run(_assign_reward(None, task, Sample(id=1, task_id=1, query="q"), row, None, 0))  # no gateway used
    assert (row.reward, row.reward_source, row.reward_detail) == (1.0, "verifier", "2 words, limit 2")


def test_who_labels_follows_the_flags(monkeypatch):
    panel = Method("panel", "people decide", rewards.HumanSettings, uses_people=True)
    monkeypatch.setitem(METHODS, "panel", panel)
    assert is_person_method(Task(id=1, reward_method="panel")) and needs_person(Task(id=1, reward_method="panel"),
                                                                               False, "k")
    spot = {"spot_check_share": 1.0}
    assert needs_person(Task(id=1, reward_method="judge_human", reward_settings=spot), False, "k")
    assert not needs_person(Task(id=1, reward_method="judge_human", reward_settings={"spot_check_share": 0}),
                            False, "k")
    assert needs_person(Task(id=1, reward_method="judge_human", reward_settings={"spot_check_share": 0}), True, "k")
    for name in ("judge", "math", "no such method"):
        assert not is_person_method(Task(id=1, reward_method=name))
        assert not needs_person(Task(id=1, reward_method=name, reward_settings=spot), True, "k")


# ---- the Tasks page lists the registry ------------------------------------------------------------------


def test_the_tasks_page_offers_every_registered_method_and_saves_one_added(app_engine, with_length):
    with Session(app_engine) as session:
        task = queries.task_by_name(session, DEMO_TASK)
        task.reward_settings = {"max_words": 7, "future_key": 1}
        session.add(task)
        session.commit()
        prefix = f"task_{task.id}_"
    at = run_app(page="pages/tasks.py", session_state={REVIEWER_KEY: "ann"})
    select = at.selectbox(key=f"{prefix}reward_method")
    assert list(select.options) == list(METHODS) and "length" in select.options
    select.set_value("length")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert "at most max\\_words words" in [c.value for c in at.caption]  # our Markdown, its _ escaped (plain)
    at.button(key="tasks_save").click()
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    with Session(app_engine) as session:
        stored = queries.task_by_name(session, DEMO_TASK)
    assert stored.reward_method == "length"
    assert stored.reward_settings == {"max_words": 7, "future_key": 1}


def test_a_method_added_to_the_registry_can_be_tried_on_the_tasks_page(app_engine, with_length):
    with Session(app_engine) as session:
        task = queries.task_by_name(session, DEMO_TASK)
        task.reward_method, task.reward_settings = "length", {"max_words": 2}
        session.add(task)
        session.commit()
    at = run_app(page="pages/tasks.py", session_state={REVIEWER_KEY: "ann"})
    assert "What it reads: The whole response." in [c.value for c in at.caption]
    at.text_area(key="tasks_try_answer").set_value("three short words")
    at.button(key="tasks_try_score").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [m.value for m in at.metric if m.label in ("Reward", "Source")] == ["0", "verifier"]
    assert "3 words, limit 2" in [c.value for c in at.code]
