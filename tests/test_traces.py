"""Production traces in core: the task's labelling rules, the daily summary with intervals, a person's
label counting first, and harvest turning failures into train samples once (deduplicated, source kept)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlmodel import Session, select

from core.errors import InvalidInput
from core.records.library.versions import import_library, set_label
from core.records.production.scores import trace_score
from core.records.production.trace_views import daily_rows
from core.records.production.traces import (
    TraceFilter,
    TraceIn,
    harvest,
    ingest_traces,
    label_trace,
    set_rules,
    task_traces,
)
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.tables import Sample, Trace


@pytest.fixture
def production(engine, demo_task):
    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(version.number), "production", "system")
    return version


def post(engine, version_id: int, items: list[tuple[str, float | None]], **extra) -> None:
    ingest_traces(engine, [TraceIn(id=str(i), task=DEMO_TASK, version_id=version_id, input=text, output="42", score=score,
                                   **extra) for i, (text, score) in enumerate(items)])


def rows(engine) -> list[Trace]:
    with Session(engine) as session:
        return list(session.exec(select(Trace).order_by(Trace.id)))


def test_rules_send_low_scores_and_a_stable_share_to_people(engine, production):
    set_rules(engine, DEMO_TASK, {"below": 0.5, "share": 0.2}, "cli")
    post(engine, production.id, [(f"question {i}", 0.9) for i in range(200)] + [("a failure", 0.1)])
    traces = rows(engine)
    assert traces[-1].label_status == "needed"  # under the threshold: always
    sampled = [t for t in traces[:-1] if t.label_status == "needed"]
    assert 20 < len(sampled) < 60  # about 20% of the rest
    with pytest.raises(InvalidInput):
        set_rules(engine, DEMO_TASK, {"below": 2}, "cli")
    with pytest.raises(InvalidInput):
        set_rules(engine, DEMO_TASK, {"threshold": 0.5}, "cli")


def test_daily_summary_per_version_with_an_interval_and_a_label_counting_first(engine, production):
    post(engine, production.id, [("q1", 1.0), ("q2", 0.0), ("q3", None), ("q4", 1.0)])
    first = rows(engine)[1]
    label_trace(engine, first.id, 1.0, "cli")
    with Session(engine) as session:
        traces = task_traces(session, DEMO_TASK)
        [row] = daily_rows(session, DEMO_TASK, TraceFilter(), queries.version_numbers(session, [t.version_id for t in traces]))
    assert (row["traces"], row["scored"], row["scored share"]) == (4, 3, 0.75)
    assert row["mean score"] == 1.0 and row["low"] <= row["mean score"] <= row["high"]
    assert trace_score(rows(engine)[1]) == 1.0 and rows(engine)[1].score == 0.0


def test_harvest_adds_failures_once_and_keeps_their_source(engine, production):
    old = datetime.now(UTC) - timedelta(days=10)
    with Session(engine) as session:
        known = queries.samples(session, queries.task_by_name(session, DEMO_TASK).id, "train")[0].query
    ingest_traces(engine, [
        TraceIn(id="old", task=DEMO_TASK, version_id=production.id, input="an old failure", score=0.0, created_at=old),
        TraceIn(id="a", task=DEMO_TASK, version_id=production.id, input="How many  apples?", score=0.0),
        TraceIn(id="b", task=DEMO_TASK, version_id=production.id, input="how many apples?", score=0.2),
        TraceIn(id="c", task=DEMO_TASK, version_id=production.id, input=known, score=0.0),
        TraceIn(id="d", task=DEMO_TASK, version_id=production.id, input="a success", score=1.0),
    ])
    since = datetime.now(UTC) - timedelta(days=1)
    assert harvest(engine, DEMO_TASK, "cli", since=since, max_score=0.5) == (1, 2)  # b repeats a; c is a sample
    assert harvest(engine, DEMO_TASK, "cli", since=since, max_score=0.5) == (0, 2)  # a is done; b and c still repeat
    with Session(engine) as session:
        [sample] = session.exec(select(Sample).where(Sample.external_id.like("trace-%"))).all()
        trace = session.exec(select(Trace).where(Trace.client_id == "a")).one()
    assert (sample.query, sample.split, sample.reference) == ("How many  apples?", "train", None)
    assert sample.meta["source_trace"] == trace.id and trace.sample_id == sample.id
    assert harvest(engine, DEMO_TASK, "cli", labelled_only=True) == (0, 0)


def test_an_update_from_production_starts_at_production_on_the_harvest_and_a_share_of_the_old(engine, production):
    from core.grpo.training import _train_sample_ids, create_run
    from core.records.runs.settings import RunSettings
    from storage.tables import Run

    later = import_library(engine, DEMO_TASK, "- A later draft.", "b.md", actor="system")  # latest, not production
    post(engine, production.id, [("a production failure", 0.0), ("another one", 0.1)])
    assert harvest(engine, DEMO_TASK, "cli", max_score=0.5) == (2, 0)
    settings = RunSettings(start_label="production", old_share=0.25, review_mode="manual")
    run_id = create_run(engine, DEMO_TASK, settings)
    with Session(engine) as session:
        run = session.get(Run, run_id)
        task = queries.task_by_name(session, DEMO_TASK)
        chosen = _train_sample_ids(session, task, None, [], None, 0.25, 0)
        everything = _train_sample_ids(session, task, None, [])
        harvested = {s.id for s in session.exec(select(Sample).where(Sample.external_id.like("trace-%")))}
    assert run.start_version_id == production.id != later.id
    assert harvested <= set(chosen)
    old = len(everything) - len(harvested)
    assert 0.1 * old < len(set(chosen) - harvested) < 0.4 * old
    with pytest.raises(InvalidInput, match="no label 'candidate'"):
        create_run(engine, DEMO_TASK, RunSettings(start_label="candidate"))


def test_two_posts_of_the_same_ids_at_once_store_each_once(engine, production):
    from concurrent.futures import ThreadPoolExecutor

    batch = [TraceIn(id=f"race-{i}", task=DEMO_TASK, version_id=production.id, input=f"q {i}") for i in range(50)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: ingest_traces(engine, batch), range(4)))
    assert sum(result.stored for result in results) == 50 and len(rows(engine)) == 50
    assert all(result.stored + result.duplicates == 50 for result in results)


def test_harvest_takes_exactly_the_traces_the_filters_show(engine, production):
    """Issue 62: with Thumbs = down showing 6 traces, "Harvest these traces" considered 51 others as well. Harvest
    now takes every filter the page has (here thumbs and a comment), not only the days and the score."""
    from core.records.production.traces import TraceIn, ingest_traces

    ingest_traces(engine, [TraceIn(id=f"t{i}", task=DEMO_TASK, version_id=production.id, input=f"question {i}",
                                   output="a", thumbs="down" if i < 3 else "up",
                                   comment="wrong total" if i == 0 else None) for i in range(8)])
    assert harvest(engine, DEMO_TASK, "cli", thumbs="down", comment="total") == (1, 0)
    assert harvest(engine, DEMO_TASK, "cli", thumbs="down") == (2, 0)
    with Session(engine) as session:
        harvested = sorted(trace.client_id for trace in session.exec(select(Trace)) if trace.sample_id is not None)
    assert harvested == ["t0", "t1", "t2"]
    with Session(engine) as session:  # named by the sender's id, as the Production page opens a trace by
        names = sorted(sample.external_id for sample in session.exec(select(Sample)) if sample.meta.get("source_trace"))
    assert names == ["trace-t0", "trace-t1", "trace-t2"]
