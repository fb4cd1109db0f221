"""The Review card of a worked example (Streamlit AppTest): the example beside the rollout it was compressed from."""

from __future__ import annotations

import json
import re

import pytest
from sqlmodel import Session

from core.records.review.decisions import example_sources
from core.records.tasks.demo_data import demo_rows
from storage import queries
from storage.tables import Rollout
from tests.conftest import mixed_rollouts
from tests.ui_support import markdown_texts, run_app, seeded_run
from ui.common import REVIEWER_KEY

REFERENCES = {row.query: row.reference for row in demo_rows()}


@pytest.fixture
def engine(app_engine):
    return app_engine


def right_example(messages: list[dict]) -> str:
    query = re.search(r"Problem:\n(.*?)\n\nThe agent's solution", messages[-1]["content"], re.S).group(1)
    return json.dumps({"problem": query, "steps": ["Add the two amounts"], "answer": REFERENCES[query]})


def test_the_card_of_a_worked_example_shows_the_rollout_it_came_from(engine):
    run_id = seeded_run(engine, "manual", settings={"examples": True, "gate": "off"}, rollout=mixed_rollouts(),
                        example=right_example)
    with Session(engine) as session:
        step = queries.steps(session, run_id)[0]
        sources = example_sources(step)
        ops = {op.position: op for op in queries.step_operations(session, step.id)}
        rollouts = [session.get(Rollout, source["rollout_id"]) for source in sources.values()]
    assert len(sources) == 2 and all(ops[position].op == "ADD" for position in sources)
    at = run_app(page="pages/review.py", session_state={REVIEWER_KEY: "alice"})
    captions = markdown_texts(at)
    for rollout in rollouts:
        assert f"Compressed from output {rollout.group_index} · reward 1" in captions
    code = [block.value for block in at.code]
    assert all(rollout.final_answer in code for rollout in rollouts)
    assert any(text.startswith("ADD · worked example") for text in code)


def test_the_card_of_an_example_made_from_the_reference_says_so(engine):
    """Every attempt answers 0 (all wrong): with the reference option the group's example is its reference
    answer, and the card says where it came from instead of pointing at a rollout."""
    run_id = seeded_run(engine, "manual", settings={"examples": True, "lessons": False, "gate": "off",
                                                    "reference_when_all_fail": True},
                        rollout="I add the numbers. \\boxed{0}")
    with Session(engine) as session:
        step = queries.steps(session, run_id)[0]
        sources = example_sources(step)
    assert sources and all(source["rollout_id"] is None for source in sources.values())
    at = run_app(page="pages/review.py", session_state={REVIEWER_KEY: "alice"})
    captions = markdown_texts(at)
    assert "Made from the sample's reference answer: every attempt of its group failed." in captions
    assert not any(text.startswith("Compressed from") for text in captions)
