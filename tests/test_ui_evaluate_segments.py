"""The Evaluate page on a conversation task: scores per segment, persona and criterion, B − A per segment,
and the choice of a library per segment (AppTest)."""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session

from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.records.library.segments import bind_library
from core.records.library.versions import import_library
from core.records.tasks.demos import CONVERSATION_TASK, ensure_conversation_task
from core.records.tasks.lookup import get_task
from storage import queries
from storage.tables import Evaluation
from tests.test_conversation_engine import conversation_replies
from tests.test_segments import AT_RISK_LESSON, agent_following_lessons, segment_judge
from tests.ui_support import run_app, scripted_gateway, table_with

PAGE = "pages/evaluate.py"


@pytest.fixture
def engine(app_engine):
    ensure_conversation_task(app_engine)
    with Session(app_engine) as session:
        task = get_task(session, CONVERSATION_TASK)
        task.reward_settings = {**task.reward_settings, "spot_check_share": 0.0}
        session.add(task)
        session.commit()
    return app_engine


def evaluated(engine, *, routed: bool = False) -> Evaluation:
    _, gateway = scripted_gateway(engine, **conversation_replies(judge=segment_judge, rollout=agent_following_lessons))
    ev = execute_evaluation(engine, create_evaluation(engine, CONVERSATION_TASK, "latest", split="test",
                                                      route_segments=routed, created_by="test"), gateway=gateway)
    assert ev.status == "completed", ev.error
    return ev


def open_page(engine):
    at = run_app(session_state={"ctx_reviewer": "alice"})
    at.sidebar.selectbox(key="task").set_value(CONVERSATION_TASK).run()
    at.switch_page(PAGE).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_segments_personas_and_criteria_tables(engine):
    ev = evaluated(engine)
    at = open_page(engine)
    segments = next(df.value for df in at.dataframe if {"segment", "Pass@k"} <= set(df.value.columns))
    assert set(segments["segment"]) == set(ev.metrics["segments"])
    at_risk = segments[segments["segment"] == "at_risk"].iloc[0]
    assert at_risk["Mean@k"] == pytest.approx(ev.metrics["segments"]["at_risk"]["mean_at_k"])
    criteria = table_with(at, "criterion")
    assert set(criteria["criterion"]) == {"empathy", "discovery", "resolution"}


def test_a_library_per_segment_is_offered_queued_and_compared_per_segment(engine):
    bind_library(engine, CONVERSATION_TASK, "at risk", "at_risk", actor="system")
    import_library(engine, CONVERSATION_TASK, json.dumps([AT_RISK_LESSON]), "r.json", library_name="at risk",
                   actor="system")
    one = evaluated(engine)
    at = open_page(engine)
    with Session(engine) as session:
        task = get_task(session, CONVERSATION_TASK)
        library = queries.library_by_name(session, task.id, "default")
    routed_key = f"eval_routed_{task.id}_{library.id}"
    at.checkbox(key=routed_key).check()
    at.number_input(key=f"eval_k_{task.id}_{library.id}").set_value(1)
    at.button(key="eval_submit").click().run()
    with Session(engine) as session:
        queued = queries.evaluations(session, task.id)[0]
    assert queued.id != one.id and queued.routes and "at_risk" in queued.routes
    assert any("with a library per segment" in s.value for s in at.success)

    _, gateway = scripted_gateway(engine, **conversation_replies(judge=segment_judge, rollout=agent_following_lessons))
    assert execute_evaluation(engine, queued.id, gateway=gateway).status == "completed"
    at = run_app(session_state={"ctx_reviewer": "alice"})
    at.sidebar.selectbox(key="task").set_value(CONVERSATION_TASK).run()
    at.switch_page(PAGE).run()
    at.selectbox(key="eval_compare_a").set_value(one.id).run()
    at.selectbox(key="eval_compare_b").set_value(queued.id).run()
    assert not at.exception, [e.value for e in at.exception]
    per_segment = table_with(at, "B − A")
    at_risk = per_segment[per_segment["segment"] == "at_risk"].iloc[0]
    assert at_risk["B − A"] > 0
    other = per_segment[per_segment["segment"] != "at_risk"]
    assert (other["B − A"] == 0).all()
