"""The block the agent reads fits the task (issue 36, item 3): the header above the library and the line that
introduces its worked examples are task settings (Task.library_header, Task.examples_intro; None is a neutral
default), used wherever a library becomes a prompt (rollouts, evaluations, the gate, conversations, the prompt
export, the HTTP API) and carried by the task's export and import."""

from __future__ import annotations

import importlib.util
import json

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from api.app import create_app
from core.domain.library import EXAMPLE, kind_of
from core.domain.library_io import parse_library_entries
from core.domain.prompts import (
    EXAMPLES_INTRO,
    LIBRARY_HEADER,
    PAPER_WORDING,
    LibraryWording,
    agent_system_prompt,
    library_block,
)
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.grpo.training import RunSettings, create_run, execute_run
from core.records.keys.api_keys import create_key
from core.records.library.segments import routed_export
from core.records.library.versions import export_version, import_library
from core.records.production.serving import served_library, served_selection
from core.records.tasks.demos import (
    DEMO_TASK,
    POLICY_TASK,
    ensure_conversation_task,
    ensure_demo_task,
    ensure_policy_task,
)
from core.records.tasks.lookup import get_task
from core.records.tasks.task_io import TaskSettings, export_task, export_task_json, import_task, save_task
from storage import queries
from storage.db import MIGRATIONS_DIR, make_engine, url_with_password
from storage.tables import Task
from tests.test_conversation_engine import conversation_replies, first_train_samples, play_one
from tests.test_migrations import upgrade_to

HEADER = "Pinecrest's policies, learned from earlier replies: state the one that applies, with its numbers:"
INTRO = "Replies our team sent to similar messages (reuse their facts and numbers):"
LESSON = "State the policy's number of days and the ticket reference in the reply."
EXAMPLE_TEXT = ("Problem: Can I return boots after three weeks? Answer: Yes: our return window is 45 days. "
                "Your ticket reference is PC-48213.")
LIBRARY = f"- {LESSON}\n\n## Worked examples\n\n- {EXAMPLE_TEXT}\n"


def worded_policy_task(engine) -> Task:
    """The shop-policies demo with its own header and examples' intro, and a library of a lesson and an example."""
    task = ensure_policy_task(engine)
    with Session(engine) as session:
        settings = TaskSettings.from_task(get_task(session, task.name))
    save_task(engine, settings.model_copy(update={"library_header": HEADER, "examples_intro": INTRO}), "cli",
              original_name=task.name)
    import_library(engine, POLICY_TASK, LIBRARY, "library.md", actor="cli")
    with Session(engine) as session:
        return get_task(session, POLICY_TASK)


def system_prompts(model, stage: str) -> list[str]:
    return [messages[0]["content"] for called, messages in model.calls if called == stage]


def test_the_neutral_default_solves_no_problems_and_keeps_the_numbers():
    for line in (LIBRARY_HEADER, EXAMPLES_INTRO):
        assert "solving problems" not in line and "not the numbers" not in line and "problem" not in line.lower()
    assert EXAMPLES_INTRO.startswith("Worked examples")  # what a pasted prompt block is read back by
    block = library_block([{"id": "E1", "text": LESSON}, {"id": "E2", "text": EXAMPLE_TEXT, "kind": EXAMPLE}])
    assert block == f"{LIBRARY_HEADER}\n[E1] {LESSON}\n\n{EXAMPLES_INTRO}\n[E2] {EXAMPLE_TEXT}"
    assert LibraryWording.of(None) == LibraryWording.of(Task(name="t", instructions="i")) == LibraryWording()
    assert LibraryWording.of(Task(name="t", instructions="i", library_header="  ", examples_intro=" A\n B ")) == (
        LibraryWording(LIBRARY_HEADER, "A B"))


def test_the_arithmetic_demo_keeps_the_papers_wording_and_the_others_the_neutral_one(engine):
    demo, policy = ensure_demo_task(engine), ensure_policy_task(engine)
    assert LibraryWording.of(demo) == PAPER_WORDING and PAPER_WORDING.header.startswith("When solving problems")
    assert LibraryWording.of(policy) == LibraryWording() and policy.library_header is None


def test_a_tasks_wording_reaches_the_agents_prompt_in_training_the_gate_and_evaluation(engine, scripted):
    worded_policy_task(engine)
    model, gateway = scripted(engine, rollout="Thank you, I will look into it.")
    settings = RunSettings(epochs=1, batch_size=1, group_size=2, limit=1, gate="no_worse", gate_k=1,
                           validation_size=4, review_mode="auto", examples=True, reference_when_all_fail=True)
    execute_run(engine, create_run(engine, POLICY_TASK, settings), gateway=gateway)
    evaluation_id = create_evaluation(engine, POLICY_TASK, "latest", limit=1)
    execute_evaluation(engine, evaluation_id, gateway=gateway)
    for stage in ("rollout", "gate"):
        prompts = system_prompts(model, stage)
        assert prompts, stage
        for prompt in prompts:
            assert f"{HEADER}\n[E1] {LESSON}" in prompt and f"{INTRO}\n[E2] {EXAMPLE_TEXT}" in prompt, stage
            assert LIBRARY_HEADER not in prompt and EXAMPLES_INTRO not in prompt


def test_a_conversation_reads_its_tasks_wording(engine, scripted):
    task = ensure_conversation_task(engine)
    save_task(engine, TaskSettings.from_task(task).model_copy(update={"library_header": HEADER}), "cli",
              original_name=task.name)
    model, gateway = scripted(engine, **conversation_replies())
    row = play_one(engine, gateway, first_train_samples(engine, 1)[0], experiences=[LESSON])
    assert row.messages[0]["content"].endswith(f"{HEADER}\n[G0] {LESSON}")
    assert all(prompt.endswith(f"{HEADER}\n[G0] {LESSON}") for prompt in system_prompts(model, "rollout"))


def test_the_exports_and_the_api_serve_the_tasks_wording_and_a_pasted_block_reads_back(engine, tmp_path):
    task = worded_policy_task(engine)
    with Session(engine) as session:
        version = queries.latest_version(session, queries.library_by_name(session, task.id, "default").id)
        served = served_library(session, POLICY_TASK, version=str(version.number))
        selected = served_selection(session, POLICY_TASK, query="Can I return my boots?", version=str(version.number))
        routed = json.loads(routed_export(session, task, version, "prompt"))
    block = export_version(version.experiences, "prompt", task=task)
    expected = agent_system_prompt("i", "", version.experiences, python_tool=False,
                                   wording=LibraryWording(HEADER, INTRO)).removeprefix("i\n\n")
    assert block == f"{expected}\n" and block.startswith(f"{HEADER}\n") and f"\n{INTRO}\n" in block
    assert served.prompt == block and routed["default"]["text"] == block
    assert selected.prompt.startswith(f"{HEADER}\n")
    # the system prompt pasted back: the task's own intro marks the examples, as "Worked examples" does
    assert [kind_of(e) for e in parse_library_entries(block, examples_intro=INTRO)] == ["lesson", EXAMPLE]
    again = import_library(engine, POLICY_TASK, block, "prompt.txt", actor="cli")
    assert [(e["text"], kind_of(e)) for e in again.experiences] == [(LESSON, "lesson"), (EXAMPLE_TEXT, EXAMPLE)]

    secret = create_key(engine, "agent", "read", "cli").secret
    body = TestClient(create_app(engine), headers={"Authorization": f"Bearer {secret}"}).get(
        f"/v1/tasks/{POLICY_TASK}/libraries/default", params={"version": version.id}).json()
    assert body["prompt"].startswith(f"{HEADER}\n[E")

    from core.cli import main  # the command line's export is the same block

    assert main(["--db", url_with_password(engine), "export", "--task", POLICY_TASK, "--version", str(version.number),
                 "--format", "prompt", "--output", str(tmp_path / "prompt.txt")]) == 0
    assert (tmp_path / "prompt.txt").read_text() == block


def test_the_wording_travels_with_the_task_file(engine):
    worded_policy_task(engine)
    with Session(engine) as session:
        data = export_task(session, get_task(session, POLICY_TASK))
        text = export_task_json(session, get_task(session, POLICY_TASK))
    assert (data["task"]["library_header"], data["task"]["examples_intro"]) == (HEADER, INTRO)
    copy = import_task(engine, text, "cli", rename="policy copy")
    assert (copy.library_header, copy.examples_intro) == (HEADER, INTRO)
    older = json.loads(text)  # a file from before the settings existed: the neutral default
    del older["task"]["library_header"], older["task"]["examples_intro"]
    plain = import_task(engine, json.dumps(older), "cli", rename="older copy")
    assert (plain.library_header, plain.examples_intro) == (None, None)


def test_the_wording_is_checked_as_one_line_within_its_limit():
    base = dict(name="t", instructions="i", policy_model="p", learner_model="p", judge_model="p")
    assert TaskSettings(**base, library_header="Read\n these:  ").library_header == "Read these:"
    assert TaskSettings(**base, examples_intro="   ").examples_intro is None
    with pytest.raises(Exception, match="the library header must be at most 500 characters"):
        TaskSettings(**base, library_header="x" * 501)
    with pytest.raises(Exception, match="the worked examples' intro must be text"):
        TaskSettings(**base, examples_intro=3)


def test_the_migration_gives_an_existing_arithmetic_demo_the_papers_wording(tmp_path):
    spec = importlib.util.spec_from_file_location("m0015", MIGRATIONS_DIR / "versions" / "0015_library_wording.py")
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    assert (migration.DEMO_TASK, migration.PAPER_LIBRARY_HEADER, migration.PAPER_EXAMPLES_INTRO) == (
        DEMO_TASK, PAPER_WORDING.header, PAPER_WORDING.examples_intro)
    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}", migrate=False)
    upgrade_to(engine, "0014")
    with engine.begin() as connection:
        for number, name in enumerate((DEMO_TASK, POLICY_TASK), start=1):
            connection.exec_driver_sql(
                "INSERT INTO task (id, name, description, instructions, answer_format, reward_method, reward_settings,"
                " policy_model, learner_model, judge_model, agent_mode, kind, simulator_model, max_turns,"
                f" production_rules, created_at) VALUES ({number}, '{name}', '', 'i', '', 'math', '{{}}', 'm', 'm',"
                " 'm', 'direct', 'single', '', 4, '{}', '2026-01-01')")
    upgrade_to(engine, "head")
    with Session(engine) as session:
        tasks = {task.name: LibraryWording.of(task) for task in session.exec(select(Task))}
    assert tasks == {DEMO_TASK: PAPER_WORDING, POLICY_TASK: LibraryWording()}
