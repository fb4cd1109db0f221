"""An evaluation's figures as people and programs read them: no number where nothing was answered, and the
count of answered rollouts beside the figures of an incomplete evaluation.

One place for the pages (tables, the chart, Compare's list), the HTTP API (`GET /v1/evaluations/{id}`) and the
command line (`eval --json` and its figures line). Mean@k and Pass@k exist only where a rollout was answered:
otherwise they are None (JSON null, NO_FIGURE as text), also for rows stored before that rule (which hold 0.0
beside "answered": 0). The figures of an incomplete evaluation count its answered rollouts only, and say so:
"of N answered". A queued, running, failed or cancelled evaluation has no figures at all.
"""

from __future__ import annotations

import math

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.errors import NotFound
from storage.statuses import EVALUATION_HAS_FIGURES
from storage.tables import Evaluation, Library, LibraryVersion

NO_FIGURE = "—"
SCORES = ("mean_at_k", "pass_at_k")


def answered_rollouts(ev: Evaluation) -> int | None:
    """How many of the evaluation's rollouts were answered (None: not counted yet)."""
    return (ev.metrics or {}).get("answered")


def score(ev: Evaluation, key: str) -> float | None:
    """Mean@k or Pass@k (`mean_at_k`, `pass_at_k`) where the evaluation has it, else None."""
    if ev.status not in EVALUATION_HAS_FIGURES or answered_rollouts(ev) == 0:
        return None
    return getattr(ev, key)


def interval(ev: Evaluation, key: str) -> list[float] | None:
    """The 95% interval of Mean@k or Pass@k where the evaluation has that figure, else None."""
    return (ev.metrics or {}).get(f"{key}_ci") if score(ev, key) is not None else None


def answered_words(ev: Evaluation) -> str:
    """'of N answered' when the figures count only some rollouts (the others have no reward), else ''."""
    metrics = ev.metrics or {}
    return f"of {metrics['answered']} answered" if metrics.get("errors") and "answered" in metrics else ""


def figure(value: float | None, spec: str = ".3f") -> str:
    """A figure as text, NO_FIGURE where there is none (None, or not finite)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return NO_FIGURE
    return format(value, spec)


def score_text(ev: Evaluation, key: str) -> str:
    """Mean@k or Pass@k as a table cell or a list entry: `0.412`, `0.412 (of 12 answered)`, or NO_FIGURE."""
    value = score(ev, key)
    if value is None:
        return NO_FIGURE
    words = answered_words(ev)
    return f"{value:.3f} ({words})" if words else f"{value:.3f}"


def interval_text(ev: Evaluation, key: str) -> str:
    """A figure's 95% interval as `0.300 – 0.500`, or NO_FIGURE."""
    ci = interval(ev, key)
    return f"{ci[0]:.3f} – {ci[1]:.3f}" if ci and len(ci) == 2 else NO_FIGURE


def figures_line(ev: Evaluation) -> str:
    """Mean@k and Pass@k with their intervals and, beside them, the rollouts they count and those without a
    reward: the command line's summary of an evaluation."""
    errors = (ev.metrics or {}).get("errors", 0)
    parts = []
    for name, key in (("Mean", "mean_at_k"), ("Pass", "pass_at_k")):
        ci = interval(ev, key)
        parts.append(f"{name}@{ev.k} {figure(score(ev, key))}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""))
    answered = answered_rollouts(ev)
    counted = (" (no rollout was answered)" if answered == 0
               else f" (of {answered} answered rollouts)" if errors and answered is not None else "")
    return f"{'  '.join(parts)}{counted}  rollout errors {errors}"


def evaluation_report(ev: Evaluation, version: LibraryVersion | None = None,
                      library: str | None = None) -> dict:
    """An evaluation as JSON: what `eval --json` prints and the HTTP API answers. Mean@k, Pass@k and their
    intervals are null where nothing was answered, and for an evaluation that is not finished. The version is
    named as people name it, by its number in its library (`version_number`, `library`: null for the empty
    library), beside its `version_id`."""
    m = ev.metrics or {}
    return {"evaluation_id": ev.id, "status": ev.status, "version_id": ev.version_id,
            "version_number": version.number if version is not None else None, "library": library,
            "split": ev.split, "k": ev.k,
            "n": ev.n, **{key: score(ev, key) for key in SCORES},
            **{f"{key}_ci": interval(ev, key) for key in SCORES},
            "errors": m.get("errors"), "answered": m.get("answered"), "rollouts": m.get("rollouts"),
            "unanswered_queries": m.get("unanswered_queries"), "cost": ev.cost, "model": ev.model, "error": ev.error,
            "progress": dict(ev.progress or {}), **({"routes": ev.routes} if ev.routes else {}),
            **{key: m[key] for key in ("segments", "personas", "criteria") if key in m}}


def read_evaluation_report(engine: Engine, evaluation_id: int) -> dict:
    """evaluation_report of a stored evaluation, its version named by number and library; NotFound when there is
    none."""
    with Session(engine) as session:
        ev = session.get(Evaluation, evaluation_id)
        if ev is None:
            raise NotFound(f"no evaluation {evaluation_id}")
        version = session.get(LibraryVersion, ev.version_id) if ev.version_id is not None else None
        library = session.get(Library, version.library_id) if version is not None else None
        return evaluation_report(ev, version, library.name if library is not None else None)
