"""The Production page's figures come from the database (core/records/production/trace_views.py), and they are the
figures the traces themselves give: the SQL score is trace_score on every combination of sources, and the totals,
the day rows with their intervals, a page of rows, the lowest scored and the oldest waiting trace match what the
Python rules compute from all the traces loaded."""

from __future__ import annotations

import itertools
import statistics
from datetime import UTC, datetime, timedelta

from sqlmodel import Session, select

from core.domain.metrics import mean_interval
from core.records.library.versions import import_library
from core.records.production.scores import score_column, trace_score
from core.records.production.trace_views import (
    daily_rows,
    lowest_traces,
    oldest_waiting,
    totals,
)
from core.records.production.traces import TraceFilter, task_traces
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.statuses import LabelStatus, TraceJudgeStatus
from storage.tables import Trace, as_utc

SOURCES = list(itertools.product([None, 0.25], [None, 0.75], [None, 1, -1],
                                 [(None, None), (TraceJudgeStatus.SCORED, 0.5), (TraceJudgeStatus.UNSURE, 0.4)]))


def store(engine, task_id: int, version) -> None:
    """One trace per combination of label, sent score, thumbs and judge verdict, spread over three days (from noon
    UTC, so no minute offset crosses midnight)."""
    now = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    with Session(engine) as session:
        for number, (label, score, thumbs, (status, judged)) in enumerate(SOURCES):
            session.add(Trace(task_id=task_id, library_id=version.library_id, version_id=version.id, client_id=f"t{number}", input=f"q{number}",
                              output="a", label_value=label, score=score, thumbs=thumbs, judge_status=status,
                              judge_score=judged, created_at=now - timedelta(days=number % 3, minutes=number),
                              label_status=LabelStatus.NEEDED if number % 5 == 0 else None))
        session.commit()


def test_the_sql_score_is_trace_score_on_every_combination_of_sources(engine, demo_task):
    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    store(engine, demo_task.id, version)
    with Session(engine) as session:
        found = dict(session.exec(select(Trace.client_id, score_column()).where(Trace.task_id == demo_task.id)).all())
        traces = task_traces(session, DEMO_TASK)
    assert len(traces) == len(SOURCES) and {t.client_id: trace_score(t) for t in traces} == found


def test_the_page_figures_are_the_figures_of_all_the_traces(engine, demo_task):
    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    store(engine, demo_task.id, version)
    window = TraceFilter(max_score=0.9)
    with Session(engine) as session:
        everything = task_traces(session, DEMO_TASK, max_score=0.9)
        numbers = queries.version_numbers(session, [version.id])
        counted = totals(session, DEMO_TASK, window)
        rows = daily_rows(session, DEMO_TASK, window, numbers)
        first_page = task_traces(session, DEMO_TASK, limit=7, offset=0, max_score=0.9)
        second_page = task_traces(session, DEMO_TASK, limit=7, offset=7, max_score=0.9)
        lowest = lowest_traces(session, DEMO_TASK, window, 4)
        waiting = oldest_waiting(session, DEMO_TASK, window)
    scores = [trace_score(t) for t in everything]
    assert all(score is not None and score <= 0.9 for score in scores)  # max_score leaves out the unscored too
    assert (counted.traces, counted.scored) == (len(everything), len(everything))
    assert counted.waiting == sum(t.label_status == LabelStatus.NEEDED for t in everything)
    assert [t.id for t in first_page + second_page] == [t.id for t in everything[:14]]
    assert [t.id for t in lowest] == [t.id for t in sorted(everything, key=trace_score)[:4]]
    assert waiting.id == [t for t in everything if t.label_status == LabelStatus.NEEDED][-1].id
    assert sum(row["traces"] for row in rows) == len(everything) and len(rows) == 3
    for row in rows:
        day = [trace_score(t) for t in everything if as_utc(t.created_at).date() == row["day"]]
        low, high = mean_interval(day)
        assert (row["traces"], row["mean score"]) == (len(day), round(statistics.mean(day), 3))
        assert (row["low"], row["high"]) == (round(low, 3), round(high, 3))
