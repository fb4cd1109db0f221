"""Whose score a production trace's score is, in one order: a person's label, then what its user sent (a score,
else thumbs: up 1, down 0), then the task's judge's sure verdict. `trace_score` and `score_source` both read
PRECEDENCE, so the figure and the name of its source can never disagree."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import case, func
from sqlalchemy.sql.elements import ColumnElement

from storage.statuses import TraceJudgeStatus
from storage.tables import Trace


def sent_score(trace: Trace) -> float | None:
    """What the agent's side said: its score, else its thumbs (up 1, down 0)."""
    if trace.score is not None:
        return trace.score
    return None if trace.thumbs is None else (1.0 if trace.thumbs > 0 else 0.0)


def judge_counted(trace: Trace) -> float | None:
    """The judge's score where it counts (a sure verdict), else None."""
    return trace.judge_score if trace.judge_status == TraceJudgeStatus.SCORED else None


def has_feedback(trace: Trace) -> bool:
    return trace.score is not None or trace.thumbs is not None


PRECEDENCE: tuple[tuple[str, Callable[[Trace], float | None]], ...] = (
    ("person", lambda trace: trace.label_value),
    ("user", sent_score),
    ("judge", judge_counted),
)


def scored_by(trace: Trace) -> tuple[str | None, float | None]:
    """The first source in PRECEDENCE that has a score, and that score; (None, None) when none has."""
    for source, read in PRECEDENCE:
        value = read(trace)
        if value is not None:
            return source, value
    return None, None


def trace_score(trace: Trace) -> float | None:
    """A person's label first, then what the agent sent, then the task's judge's sure verdict."""
    return scored_by(trace)[1]


def score_source(trace: Trace) -> str | None:
    """Whose score the trace's score is: "person" (a label), "user" (the score or thumbs sent), "judge", or None."""
    return scored_by(trace)[0]


def score_column() -> ColumnElement:
    """PRECEDENCE as one SQL expression, for what a page counts, filters and sorts by in the database (the
    Production page's figures, `score at most`): COALESCE(label, sent score, thumbs as 1 or 0, sure judge score).
    tests/test_trace_views.py checks it against trace_score on every combination of sources."""
    sent = case((Trace.score.is_not(None), Trace.score), (Trace.thumbs > 0, 1.0), (Trace.thumbs.is_not(None), 0.0))
    judge = case((Trace.judge_status == TraceJudgeStatus.SCORED, Trace.judge_score))
    return func.coalesce(Trace.label_value, sent, judge)


def thumbs_word(trace: Trace) -> str | None:
    return None if trace.thumbs is None else ("up" if trace.thumbs > 0 else "down")
