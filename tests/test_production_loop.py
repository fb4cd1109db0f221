"""The production loop end to end: a live agent (the client package) fetches the promoted library from a
real API process and logs its traces; the failures are harvested into train samples; an update from
production trains from the production version on them (scripted replies), and the studio's page and CLI
read the traces. Bad input on the way loses nothing."""

from __future__ import annotations

import sys

import pytest
from sqlmodel import Session, select

from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.grpo.training import create_run, execute_run
from core.models.gateway import Gateway
from core.records.evaluation.comparison import compare_evaluations
from core.records.keys.api_keys import create_key
from core.records.library.versions import import_library, set_label
from core.records.production.traces import harvest
from core.records.runs.settings import RunSettings
from core.records.tasks.demos import DEMO_TASK
from storage.tables import LibraryVersion, Rollout, Run, Sample, Trace
from tests.api_support import api_server
from tests.conftest import ScriptedModel, default_replies, mixed_rollouts, per_query
from tests.ui_support import ROOT

sys.path.insert(0, str(ROOT / "client"))
from tfgrpo_client import Client  # noqa: E402

QUESTIONS = [("How many wheels do 3 bikes have?", 0.0), ("What is 12 times 3?", 1.0),
             ("Tom has 5 apples and eats 2. How many are left?", 0.0), ("What is 7 + 8?", 1.0),
             ("A train leaves at 3 pm and takes 2 hours. When does it arrive?", 0.2)]


def majority_replies():
    """Three attempts per query: two say 7, one says 8, so without ground truth every group is mixed."""
    return per_query(lambda _query, n: f"so the answer is \\boxed{{{7 if n % 3 else 8}}}")


def test_fetch_log_harvest_and_update_from_production(engine, demo_task):
    production = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(production.number), "production", "system")
    import_library(engine, DEMO_TASK, "- A later draft nobody promoted.", "b.md", actor="system")
    secret = create_key(engine, "bike-shop agent", "ingest", "cli", any_task=True).secret

    with api_server(engine) as base:
        agent = Client(base_url=base, api_key=secret, ttl_s=60, flush_interval_s=0.05)
        try:
            library = agent.get_library(DEMO_TASK, fallback="Be careful.")
            assert (library.source, library.version_id) == ("server", production.id)
            assert "Re-read the question." in library.prompt
            ids = [agent.log_trace(task=DEMO_TASK, input=question, output="7", score=score, segment="web",
                                   user_id=f"user-{i}", version_id=library.version_id)
                   for i, (question, score) in enumerate(QUESTIONS)]
            with pytest.raises(ValueError):
                agent.log_trace(task=DEMO_TASK, input="x", score=1.5, version_id=library.version_id)
            assert agent.flush(timeout_s=30)
            for trace_id, (question, score) in zip(ids[:2], QUESTIONS, strict=False):  # a retry stores nothing
                agent.log_trace(id=trace_id, task=DEMO_TASK, input=question, output="7", score=score,
                                version_id=library.version_id)
            assert agent.flush(timeout_s=30)
            assert agent.get_library(DEMO_TASK).source == "cache"  # within the TTL: no request
        finally:
            agent.close()

    with Session(engine) as session:
        traces = list(session.exec(select(Trace).order_by(Trace.id)))
    assert [t.client_id for t in traces] == ids and {t.version_id for t in traces} == {production.id}

    assert harvest(engine, DEMO_TASK, "cli", max_score=0.5) == (3, 0)
    settings = RunSettings(start_label="production", old_share=0.05, ground_truth=False, epochs=1, batch_size=4,
                           group_size=3, gate="off", review_mode="auto", seed=1)
    run_id = create_run(engine, DEMO_TASK, settings)
    model = ScriptedModel({**default_replies(), "rollout": majority_replies()})
    finished = execute_run(engine, run_id, gateway=Gateway(engine, concurrency=4, mock=model, backoff_s=0.001))
    assert finished.status == "completed", finished.error

    with Session(engine) as session:
        run = session.get(Run, run_id)
        harvested = {s.id: s.query for s in session.exec(select(Sample).where(Sample.external_id.like("trace-%")))}
        trained_on = {r.sample_id for r in session.exec(select(Rollout).where(Rollout.step_id.is_not(None)))}
    assert run.start_version_id == production.id
    assert set(harvested) <= trained_on  # every harvested failure was trained on
    system = next(messages for stage, messages in model.calls if stage == "rollout")[0]["content"]
    assert "Re-read the question." in system and "later draft" not in system  # started from production
    assert run.current_version_id != production.id  # the update made a new version

    # Before anyone promotes it: the new version against production, paired on the same held-out queries.
    scored = Gateway(engine, concurrency=4, mock=ScriptedModel({**default_replies(), "rollout": mixed_rollouts()}),
                     backoff_s=0.001)
    a = create_evaluation(engine, DEMO_TASK, str(production.number), split="test", limit=6)
    with Session(engine) as session:
        learned = session.get(LibraryVersion, run.current_version_id).number
    b = create_evaluation(engine, DEMO_TASK, str(learned), split="test", limit=6)
    for evaluation_id in (a, b):
        assert execute_evaluation(engine, evaluation_id, gateway=scored).status == "completed"
    comparison = compare_evaluations(engine, a, b)
    assert comparison.stats.n == 6 and not comparison.note  # the same six queries under both
    assert comparison.stats.ci_low <= comparison.stats.delta <= comparison.stats.ci_high
    assert comparison.stats.verdict  # said in words, as the Evaluate page and `compare` show it


def test_feedback_that_comes_later_reaches_the_trace_whether_it_was_sent_or_not(engine, demo_task):
    """A thumbs-down a minute after the answer: still queued, the trace takes it before it leaves; already
    stored, the client asks the real API to update it. A trace the studio does not have is reported, not
    raised."""
    production = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    secret = create_key(engine, "bike-shop agent", "ingest", "cli", any_task=True).secret
    with api_server(engine) as base:
        agent = Client(base_url=base, api_key=secret, flush_interval_s=60)  # nothing leaves before a flush
        try:
            queued = agent.log_trace(task=DEMO_TASK, input="What is 7 + 8?", output="15", version_id=production.id)
            assert agent.update_trace(queued, task=DEMO_TASK, thumbs="up")  # amended in the queue
            assert agent.flush(timeout_s=30)
            sent = agent.log_trace(task=DEMO_TASK, input="What is 12 times 3?", output="34", version_id=production.id)
            assert agent.flush(timeout_s=30)
            assert agent.update_trace(sent, task=DEMO_TASK, thumbs="down", comment="12 x 3 is 36.")
            assert agent.update_trace(sent, task=DEMO_TASK, thumbs="down", comment="12 x 3 is 36.")  # idempotent
            assert not agent.update_trace("never-sent", task=DEMO_TASK, score=0.0)
            with pytest.raises(ValueError, match="at least one"):
                agent.update_trace(sent, task=DEMO_TASK)
        finally:
            agent.close()
    with Session(engine) as session:
        rows = {row.client_id: row for row in session.exec(select(Trace))}
    assert rows[queued].thumbs == 1
    assert (rows[sent].thumbs, rows[sent].comment) == (-1, "12 x 3 is 36.")
