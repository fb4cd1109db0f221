"""The built-in tasks: created once, with their data, and the support task judged on a 1-5 scale."""

from __future__ import annotations

import json
from collections import Counter

from sqlmodel import Session, func, select

from core.domain.datasets import formula_like
from core.domain.rewards import METHODS
from core.models.judge import scale_of
from core.records.tasks.demo_data import DEMO_DIR, support_rows
from core.records.tasks.demos import (
    CONVERSATION_TASK,
    DEMO_TASK,
    POLICY_TASK,
    SUPPORT_TASK,
    ensure_conversation_task,
    ensure_demo_task,
    ensure_demo_tasks,
    ensure_policy_task,
    ensure_support_task,
)
from core.settings import get_settings
from storage import queries
from storage.tables import AuditEvent, Library, LibraryVersion, Persona, Sample, Task


def count(engine, model) -> int:
    with Session(engine) as session:
        return session.exec(select(func.count()).select_from(model)).one()


def test_the_demo_tasks_are_created_once(engine):
    first = ensure_demo_tasks(engine)
    assert [task.name for task in first] == [DEMO_TASK, SUPPORT_TASK, CONVERSATION_TASK, POLICY_TASK]
    totals = {model: count(engine, model) for model in (Task, Sample, Library, LibraryVersion, AuditEvent, Persona)}
    assert totals[Task] == 4 and totals[Sample] == 240 + 36 + 44 and totals[Library] == 4
    assert totals[LibraryVersion] == 4
    assert totals[Persona] == 12
    again = ensure_demo_tasks(engine)
    ensure_demo_task(engine)
    ensure_support_task(engine)
    ensure_conversation_task(engine)
    ensure_policy_task(engine)
    assert [task.id for task in again] == [task.id for task in first]
    assert {model: count(engine, model) for model in totals} == totals
    with Session(engine) as session:
        creations = session.exec(select(AuditEvent).where(AuditEvent.action == "task.create")).all()
    assert sorted(event.after["name"] for event in creations) == sorted([DEMO_TASK, SUPPORT_TASK, CONVERSATION_TASK,
                                                                          POLICY_TASK])


def test_support_samples_have_a_30_10_split_and_a_rubric_each(engine):
    task = ensure_support_task(engine)
    with Session(engine) as session:
        samples = queries.samples(session, task.id)
    assert len(samples) == 40
    assert Counter(s.split for s in samples) == {"train": 30, "test": 10}
    assert len({s.external_id for s in samples}) == 40 and len({s.query for s in samples}) == 40
    for sample in samples:
        assert sample.rubric and len(sample.rubric) > 40, sample.external_id
        assert sample.reference is None and sample.meta == {}
        assert 1 <= len(sample.query.split()) <= 80


def test_support_task_settings(engine):
    task = ensure_support_task(engine)
    assert task.reward_method == "judge_human" and task.reward_method in METHODS
    assert scale_of(task) == "1-5"
    settings = task.reward_settings
    assert settings["scale"] == "1-5" and settings["spot_check_share"] == 0.25
    assert settings["labels_per_rollout"] == 1
    for part in ("Empathy:", "Accuracy:", "Next step:"):
        assert part in settings["criteria"]
    assert task.agent_mode == "direct"
    assert task.policy_model == task.learner_model == task.judge_model == get_settings().model
    assert "120 words" in task.answer_format
    facts = [line for line in task.instructions.splitlines() if line.startswith("- ")]
    assert 4 <= len(facts) <= 6
    assert "status.lumen.example" in task.instructions


def test_an_admins_change_to_the_support_task_survives_ensure(engine):
    task = ensure_support_task(engine)
    with Session(engine) as session:
        stored = session.get(Task, task.id)
        stored.reward_settings = {**stored.reward_settings, "spot_check_share": 0.5}
        session.add(stored)
        session.commit()
    assert ensure_support_task(engine).reward_settings["spot_check_share"] == 0.5


def test_support_file_is_clean_json_lines_with_no_formula_cells():
    lines = (DEMO_DIR / "support_messages.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["id"] for r in records] == [f"s{n:02d}" for n in range(1, 41)]
    assert all(set(r) == {"id", "query", "rubric", "split"} for r in records)
    assert not any(formula_like(r["query"]) or formula_like(r["rubric"]) for r in records)
    assert len(support_rows()) == 40


def test_the_arithmetic_demo_runs_in_python_mode_where_the_jail_works(engine, jail):
    task = ensure_demo_task(engine)
    assert task.agent_mode == "python"
    assert "Agent mode python" in task.description and "jail" in task.description
    with Session(engine) as session:
        [created] = session.exec(select(AuditEvent).where(AuditEvent.action == "task.create")).all()
    assert created.after == {"name": DEMO_TASK, "agent_mode": "python"}
    assert ensure_support_task(engine).agent_mode == ensure_conversation_task(engine).agent_mode == "direct"


def test_without_a_jail_the_arithmetic_demo_falls_back_to_direct_and_says_why(engine, monkeypatch, caplog):
    from core.domain.sandbox import JailStatus
    from core.records.tasks import demos as tasks

    probes: list[int] = []

    def no_jail() -> JailStatus:
        probes.append(1)
        return JailStatus(False, "python mode needs bubblewrap (apt-get install bubblewrap)")

    monkeypatch.setattr(tasks, "jail_status", no_jail)
    task = ensure_demo_task(engine)
    assert task.agent_mode == "direct"
    assert "Agent mode direct, not python" in task.description and "apt-get install bubblewrap" in task.description
    assert any("uses agent mode direct" in r.getMessage() and "bubblewrap" in r.getMessage() for r in caplog.records)
    ensure_demo_task(engine)  # an existing task keeps its mode: the jail is probed only when the task is created
    assert probes == [1]
