"""A/B experiments: a split of a library's production traffic has a start, arms that serve fixed versions, and an end.

Turning a split on (core.records.production.serving.set_ab_split) starts an experiment that records the version each arm serves
(production's and the candidate label's) and when. Moving either label, changing the split's label or share, or
turning it off ends the experiment (audited; the Production page says so); while the split stays on, a new one starts
at once with the versions the labels point at now. The guard (core/records/production/ab_verdict.py) ends one whose candidate is
significantly worse, and the split with it.

A trace's arm is the one the studio serves its user: `served_arm`, the hash of the user id that serving itself uses,
recomputed from the experiment's own share, never read from what the trace claims. Each trace is stamped when it
arrives (`stamp`) with the experiment then running, its user's arm, and why it does not count there, if it does not:
no user id (the split assigns arms by user id, so such a trace was not randomised, and the verdict's unit is the
user: core/records/production/ab_verdict.py), sent from before the experiment
started, or naming a version other than the one its user's arm serves (a copy cached across a label move, or a claim
about the other arm). Such a trace is flagged, not refused: it is stored as usual (labelling, harvest and the daily
figures read it) and only left out of the comparison. Refusing it would throw away the rest of its batch, or of an
OTLP export, which exporters do not retry, for one stale copy of the library; the page and `core ab --status` count
the flagged ones by reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import update
from sqlmodel import Session, col, select

from core.domain.draws import stable_fraction
from core.records.library.promotion import PRODUCTION
from storage import queries
from storage.tables import AbExperiment, AuditEvent, Library, Trace, as_utc, utcnow

CANDIDATE = "candidate"  # the arm served the split's label (whatever that label is called)
MIN_SHARE = 0.05  # the smallest candidate share a split may have (1 - MIN_SHARE the largest): bench/ab_peeking.py's edge
NO_USER = "no user id: the split assigns arms by user id"
BEFORE_START = "sent from before the experiment started"
NO_VERSION = "names no version the studio recognised"


def served_arm(library_id: int, share: float | None, user_id: str | None) -> str | None:
    """The arm a split of `share` serves this user (PRODUCTION or CANDIDATE), or None without a user or a split.
    Serving (core.records.production.serving.ab_arm) and the stamp of every trace call this one function."""
    if not user_id or not share:
        return None
    return CANDIDATE if stable_fraction(f"{library_id}:{user_id}") < share else PRODUCTION


def open_experiment(session: Session, library_id: int) -> AbExperiment | None:
    """The library's running experiment, if its split is on."""
    return session.exec(select(AbExperiment).where(AbExperiment.library_id == library_id,
                                                   col(AbExperiment.ended_at).is_(None))
                        .order_by(col(AbExperiment.id).desc())).first()


def experiments(session: Session, library_id: int, limit: int = 5) -> list[AbExperiment]:
    """The library's newest experiments, newest first (the running one, then those that ended)."""
    return list(session.exec(select(AbExperiment).where(AbExperiment.library_id == library_id)
                             .order_by(col(AbExperiment.id).desc()).limit(limit)))


def arm_versions(experiment: AbExperiment) -> dict[str, int]:
    return {PRODUCTION: experiment.production_version_id, CANDIDATE: experiment.candidate_version_id}


def start(session: Session, library: Library, actor: str) -> AbExperiment | None:
    """Start an experiment for the library's split as it is now; None when the split is off, a label is missing, or
    both labels point at one version (after the candidate was promoted: nothing to compare, and a planning figure
    for #3 against #3 would be noise)."""
    if not library.ab_label or not library.ab_share:
        return None
    production = queries.label_by_name(session, library.id, PRODUCTION)
    candidate = queries.label_by_name(session, library.id, library.ab_label)
    if production is None or candidate is None or production.version_id == candidate.version_id:
        return None
    experiment = AbExperiment(task_id=library.task_id, library_id=library.id, candidate_label=library.ab_label,
                              share=library.ab_share, production_version_id=production.version_id,
                              candidate_version_id=candidate.version_id, started_by=actor)
    session.add(experiment)
    session.flush()
    numbers = queries.version_numbers(session, [production.version_id, candidate.version_id])
    session.add(AuditEvent(actor=actor, action="ab.start", object_type="abexperiment", object_id=experiment.id,
                           after={"library_id": library.id, "candidate_label": library.ab_label,
                                  "share": library.ab_share,
                                  "production": numbers.get(production.version_id),
                                  "candidate": numbers.get(candidate.version_id)}))
    return experiment


def end(session: Session, experiment: AbExperiment, reason: str, actor: str, *, final: dict | None = None,
        action: str = "ab.end") -> bool:
    """End a running experiment (once: of two that try at the same moment, one does it); audited with its reason."""
    now = utcnow()
    ended = session.exec(update(AbExperiment).where(AbExperiment.id == experiment.id,
                                                    col(AbExperiment.ended_at).is_(None))
                         .values(ended_at=now, ended_by=actor, end_reason=reason, final=final)).rowcount
    if ended != 1:
        return False
    session.refresh(experiment)
    session.add(AuditEvent(actor=actor, action=action, object_type="abexperiment", object_id=experiment.id,
                           after={"reason": reason, "verdict": final}))
    return True






@dataclass
class Stamps:
    """Each library's running experiment, looked up once per batch of traces."""

    by_library: dict[int, AbExperiment | None]

    @classmethod
    def new(cls) -> Stamps:
        return cls({})

    def experiment(self, session: Session, library_id: int) -> AbExperiment | None:
        if library_id not in self.by_library:
            self.by_library[library_id] = open_experiment(session, library_id)
        return self.by_library[library_id]


def stamp(session: Session, row: Trace | dict, stamps: Stamps) -> Trace | dict:
    """Set the trace's experiment, its user's arm and why it does not count (see the module's note), on a Trace or
    on the column values of one (OTLP inserts dicts); every key is set, so a batch's dicts stay alike."""
    value = row.get if isinstance(row, dict) else lambda name: getattr(row, name)
    experiment = stamps.experiment(session, value("library_id"))
    columns = {"ab_experiment_id": None, "ab_arm": None, "ab_excluded": None}
    if experiment is not None:
        arm = served_arm(experiment.library_id, experiment.share, value("user_id"))
        columns = {"ab_experiment_id": experiment.id, "ab_arm": arm,
                   "ab_excluded": excluded(experiment, arm, value("version_id"), value("created_at"))}
    if isinstance(row, dict):
        row.update(columns)
    else:
        for name, column in columns.items():
            setattr(row, name, column)
    return row


def excluded(experiment: AbExperiment, arm: str | None, version_id: int | None,
             sent_at: datetime | None) -> str | None:
    """Why a trace of this user's `arm` does not count in the experiment, or None when it does."""
    if arm is None:
        return NO_USER
    if sent_at is not None and as_utc(sent_at) < as_utc(experiment.started_at):
        return BEFORE_START
    if version_id is None:
        return NO_VERSION
    served = arm_versions(experiment)[arm]
    if version_id != served:
        return f"names another version than the {arm} arm serves its user"
    return None


def stamp_rows(session: Session, rows: list[dict]) -> list[dict]:
    """`stamp` each of a batch's column values (the OTLP spans of one request, or the held ones landing)."""
    stamps = Stamps.new()
    return [stamp(session, row, stamps) for row in rows]
