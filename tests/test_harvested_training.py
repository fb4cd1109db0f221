"""An update from production on a task without a validation split trains on every sample harvested from
production (issue 50, item 8): its validation queries come from the old train samples, never the harvested
ones, and the run's summary says how many harvested samples it trained on and where validation came from."""

from __future__ import annotations

from sqlmodel import Session, select

from core.cli.report import report_run
from core.grpo.training import _train_sample_ids, create_run, execute_run
from core.models.gateway import Gateway
from core.records.library.versions import import_library, set_label
from core.records.production.traces import TraceIn, harvest, ingest_traces
from core.records.runs.outcome import is_harvested, production_note
from core.records.runs.settings import RunSettings
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.db import session_scope
from storage.tables import Rollout, Run, Sample, Task
from tests.conftest import ScriptedModel, default_replies, per_query

OLD = 6
HARVESTED = 10


def test_update_from_production_trains_on_every_harvested_sample_of_a_task_without_a_validation_split(
        engine, demo_task, capsys):
    with session_scope(engine) as session:  # a task with few old train samples and no validation split
        train = list(session.exec(select(Sample).where(Sample.split == "train").order_by(Sample.id)))
        for sample in train[OLD:]:
            sample.split = "test"
            session.add(sample)
        assert not list(session.exec(select(Sample).where(Sample.split == "validation")))
    production = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(production.number), "production", "system")
    ingest_traces(engine, [TraceIn(id=f"t{i}", task=DEMO_TASK, version_id=production.id, score=0.0, output="7",
                                   input=f"A shop sells {i + 2} bikes a day. How many in {i + 3} days?")
                           for i in range(HARVESTED)])
    assert harvest(engine, DEMO_TASK, "cli", max_score=0.5) == (HARVESTED, 0)

    settings = RunSettings(start_label="production", old_share=1.0, validation_size=4, ground_truth=False, epochs=1,
                           batch_size=OLD + HARVESTED, group_size=3, review_mode="auto", seed=3)
    run_id = create_run(engine, DEMO_TASK, settings)
    model = ScriptedModel({**default_replies(),
                           "rollout": per_query(lambda _query, n: f"so the answer is \\boxed{{{7 if n % 3 else 8}}}")})
    finished = execute_run(engine, run_id, gateway=Gateway(engine, concurrency=4, mock=model, backoff_s=0.001))
    assert finished.status == "completed", finished.error

    with Session(engine) as session:
        run = session.get(Run, run_id)
        harvested = {s.id for s in session.exec(select(Sample).where(Sample.split == "train")) if is_harvested(s)}
        steps = queries.steps(session, run_id)
        trained_on = {r.sample_id for r in session.exec(select(Rollout).where(Rollout.step_id.is_not(None)))}
        note = production_note(session, run, steps)
    assert len(harvested) == HARVESTED
    assert harvested <= trained_on  # every harvested failure was trained on
    assert len(run.validation_ids) == 4 and not set(run.validation_ids) & harvested  # held out: old samples only
    assert run.progress["validation_split"] == "train"
    assert note == (f"From production: trained on {HARVESTED} of the {HARVESTED} samples harvested from production "
                    "traces; 4 validation queries from the old train samples (harvested samples are never held out).")
    report_run(engine, run_id)
    assert note in capsys.readouterr().out

    with Session(engine) as session:  # a limit below the harvest still takes harvested samples first
        task = session.get(Task, run.task_id)
        limited = _train_sample_ids(session, task, 3, list(run.validation_ids), None, 1.0, 3)
    assert len(limited) == 3 and set(limited) <= harvested


def test_the_train_page_says_how_many_harvested_samples_a_run_from_production_trained_on(app_engine):
    """Said while the run waits for review (an update from production reviews every change), not only at its end."""
    from tests.ui_support import run_app, seeded_run

    run_id = seeded_run(app_engine, review_mode="manual", settings={"old_share": 1.0, "gate": "off"})
    with session_scope(app_engine) as session:
        step = queries.steps(session, run_id)[0]
        sample = session.get(Sample, step.sample_ids[0])
        sample.meta = {**sample.meta, "source_trace": 1}
        session.add(sample)
    at = run_app(page="pages/train.py")
    assert not at.exception, [e.value for e in at.exception]
    assert any(i.value == "From production: trained on 1 of the 1 samples harvested from production traces; no "
                          "validation queries (the gate had none to read)." for i in at.info), [i.value for i in at.info]
