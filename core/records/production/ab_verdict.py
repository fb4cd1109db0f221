"""What an A/B experiment shows, and the guard that acts on it.

`ab_status` is the one set of figures the Production page and `python -m core ab --status` print: each arm's version
(#N), its users and their scored traces, the mean of its users' mean scores, the candidate's difference from
production with its anytime-valid interval (core/domain/sequential.py: it may be read at any time, as often as anyone
likes), `decided` only when that interval excludes zero, how many more users a difference of a given size needs at
the current rate, and the traces left out of the comparison by reason (core/records/production/ab_experiments.py). Only traces
the experiment stamped as counting are read: served after its start, by the version their user's arm serves.

The unit is the user, not the trace: the split randomises users, so each user is one observation (the mean of their
scored traces), and a heavy user's many traces weigh as one user, never as many independent ones.

The guard (`guard_experiments`) runs in the worker, every GUARD_EVERY_S seconds beside its webhook deliveries: scores
arrive from the API, from people labelling and from the judge the worker runs itself (core/records/production/scoring.py),
so one periodic pass sees them all, and ingest stays as fast as it was. A candidate significantly worse ends the
experiment and the split (audited, webhook `ab.stopped`): every user gets production again. A candidate significantly
better raises `ab.decided` once, with the figure and a link to the Production page's Promote; promoting then carries
the verdict into the promotion's audit record (core/records/production/ab_changes.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime

from sqlalchemy import func, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import defer
from sqlmodel import Session, col, select

from core.domain import webhooks as wh
from core.domain.sequential import MIN_PER_ARM, POWER, ArmScores, Verdict, users_needed, verdict_in_order
from core.errors import InvalidInput, NotFound
from core.records.library.promotion import PRODUCTION
from core.records.notifications.events import raise_event
from core.records.production.ab_experiments import (
    CANDIDATE,
    arm_versions,
    end,
    experiments,
    open_experiment,
)
from core.records.production.scores import PRECEDENCE, scored_by
from core.records.tasks.lookup import get_library, get_task
from core.settings import get_settings
from storage import queries
from storage.db import session_scope
from storage.fencing import holding
from storage.tables import AbExperiment, AuditEvent, Library, Task, Trace, as_utc, utcnow

GUARD_EVERY_S = 30.0
GUARD = "A/B guard"  # the actor of what the guard does
EFFECT = 0.05  # the difference `users_needed` is asked about unless a person names another
MIN_DAYS = 1 / 24  # an experiment younger than an hour is rated as an hour old


@dataclass(frozen=True)
class AbStatus:
    """An experiment's figures (see the module's note); `experiment` is None when the library has had none."""

    task: str
    library: str
    experiment: int | None
    candidate_label: str | None = None
    share: float | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    end_reason: str | None = None
    arms: list[dict] = field(default_factory=list)
    verdict: Verdict = field(default_factory=lambda: Verdict(None, None, None, False))
    excluded: dict[str, int] = field(default_factory=dict)
    effect: float = EFFECT
    needed: int | None = None
    days: float | None = None
    words: str = ""
    live: Verdict | None = None  # the interval now, when `verdict` is a decision stored earlier
    decided_at: datetime | None = None
    earlier: int = 0  # earlier experiments of this library that tested the same candidate version

    @property
    def running(self) -> bool:
        return self.experiment is not None and self.ended_at is None

    def as_dict(self) -> dict:
        """The JSON `core ab --status --json` prints (and the webhook events and the audit records carry)."""
        figures = asdict(self.verdict)
        return {"task": self.task, "library": self.library, "experiment": self.experiment,
                "candidate_label": self.candidate_label, "share": self.share,
                "started_at": _iso(self.started_at), "ended_at": _iso(self.ended_at), "end_reason": self.end_reason,
                "arms": self.arms, "difference": _rounded(figures["difference"]), "low": _rounded(figures["low"]),
                "high": _rounded(figures["high"]), "decided": self.verdict.decided,
                "better": self.verdict.better, "worse": self.verdict.worse, "alpha": self.verdict.alpha,
                "decided_at": _iso(self.decided_at), "now": None if self.live is None else {
                    key: _rounded(value) for key, value in asdict(self.live).items() if key in ("difference", "low",
                                                                                               "high")},
                "earlier_experiments_of_this_candidate": self.earlier,
                "interval": "anytime-valid (asymptotic confidence sequence, running intersection)", "unit": "user",
                "excluded": self.excluded, "effect": self.effect, "more_users_needed": self.needed,
                "days_at_current_rate": None if self.days is None else round(self.days, 1), "words": self.words}


def _iso(moment: datetime | None) -> str | None:
    return as_utc(moment).isoformat() if moment is not None else None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def ab_status(session: Session, task_name: str, library_name: str = "default", *, effect: float = EFFECT,
              experiment_id: int | None = None, now: datetime | None = None) -> AbStatus:
    """The figures of the library's running experiment, else its newest (or of `experiment_id`)."""
    if not 0 < effect < 1:
        raise InvalidInput("the difference to plan for is a score difference between 0 and 1, e.g. 0.05")
    task = get_task(session, task_name)
    library = get_library(session, task, library_name)
    if experiment_id is not None:
        experiment = session.get(AbExperiment, experiment_id)
        if experiment is None or experiment.library_id != library.id:
            raise NotFound(f"library {library_name!r} of task {task.name!r} has no A/B experiment {experiment_id}")
    else:
        experiment = open_experiment(session, library.id) or next(iter(experiments(session, library.id, 1)), None)
    if experiment is None:
        words = ("No A/B experiment yet: split traffic with `python -m core ab --task T LABEL --share 0.1` (an "
                 "admin), and give each trace the user id the library was fetched with.")
        return AbStatus(task.name, library.name, None, words=words, effect=effect)
    return _status(session, task, library, experiment, effect, now or utcnow())


def running_experiment_note(session: Session, task_name: str, library_name: str, version_id: int) -> str | None:
    """What moving production to `version_id` does to the library's running A/B experiment, in a sentence (the
    Promote dialog shows it before Confirm), or None when none runs."""
    task = queries.task_by_name(session, task_name) if task_name else None
    library = queries.library_by_name(session, task.id, library_name) if task is not None else None
    experiment = open_experiment(session, library.id) if library is not None else None
    if experiment is None:
        return None
    status = _status(session, task, library, experiment, EFFECT, utcnow())
    promoted = version_id == experiment.candidate_version_id
    return (f"A/B experiment {experiment.id} is running: {status.words} Moving production "
            + ("to its candidate ends it, and its verdict goes into the promotion's audit record."
               if promoted else "to another version ends it before its candidate is promoted or stopped."))


def experiment_figures(session: Session, experiment: AbExperiment) -> dict:
    """`ab_status(...).as_dict()` of one experiment, as the audit records of its end and of a promotion keep it."""
    library = session.get(Library, experiment.library_id)
    return _status(session, session.get(Task, library.task_id), library, experiment, EFFECT, utcnow()).as_dict()




@dataclass(frozen=True)
class ExperimentScores:
    """The scores of the traces that count, per arm and per user (the unit the split randomises); the count of those
    left out, per reason; the users as (arm, user id) in the order of their first scored trace (the order the
    confidence sequence reads them in); and per arm how many scores came from each source (person, user, judge)."""

    by_user: dict[str, dict[str, list[float]]]
    excluded: dict[str, int]
    order: list[tuple[str, str]]
    sources: dict[str, dict[str, int]]


def experiment_scores(session: Session, experiment: AbExperiment) -> ExperimentScores:
    """An experiment's `ExperimentScores`. A trace without a user never counts (ab_experiments.excluded: NO_USER)."""
    rows = session.exec(select(Trace).where(Trace.ab_experiment_id == experiment.id).order_by(col(Trace.id))
                        .options(defer(Trace.input), defer(Trace.output), defer(Trace.turns), defer(Trace.meta),
                                 defer(Trace.comment)))
    scores: dict[str, dict[str, list[float]]] = {PRODUCTION: {}, CANDIDATE: {}}
    excluded: dict[str, int] = {}
    order: list[tuple[str, str]] = []
    sources: dict[str, dict[str, int]] = {PRODUCTION: {}, CANDIDATE: {}}
    for trace in rows:
        if trace.ab_excluded is not None:
            excluded[trace.ab_excluded] = excluded.get(trace.ab_excluded, 0) + 1
            continue
        source, score = scored_by(trace)
        if score is not None and trace.ab_arm in scores and trace.user_id:
            if trace.user_id not in scores[trace.ab_arm]:
                order.append((trace.ab_arm, trace.user_id))
            scores[trace.ab_arm].setdefault(trace.user_id, []).append(score)
            sources[trace.ab_arm][source] = sources[trace.ab_arm].get(source, 0) + 1
    return ExperimentScores(scores, excluded, order, sources)


def _stored(decision: dict) -> Verdict:
    """The verdict the guard stored when the experiment was first decided."""
    return Verdict(decision.get("difference"), decision.get("low"), decision.get("high"), True,
                   decision.get("alpha", 0.05))


def _status(session: Session, task: Task, library: Library, experiment: AbExperiment, effect: float,
            now: datetime) -> AbStatus:
    counted = experiment_scores(session, experiment)
    scores, excluded, order = counted.by_user, counted.excluded, counted.order
    production, candidate = ArmScores.of_users(scores[PRODUCTION]), ArmScores.of_users(scores[CANDIDATE])
    live = verdict_in_order([(arm == CANDIDATE, sum(scores[arm][user]) / len(scores[arm][user]))
                             for arm, user in order])
    found, decided_at = live, None
    if experiment.decided:  # the first decision stays made: later data shows beside it, never undoes it
        found, decided_at = _stored(experiment.decided), _parsed(experiment.decided.get("decided_at"))
    versions = arm_versions(experiment)
    numbers = queries.version_numbers(session, list(versions.values()))
    arms = [{"arm": arm, "label": PRODUCTION if arm == PRODUCTION else experiment.candidate_label,
             "version": f"#{numbers.get(versions[arm], '?')}", "version_id": versions[arm],
             "users": figures.n, "scored traces": figures.traces,
             "mean per user": None if figures.mean is None else round(figures.mean, 4),
             "scored by": {source: counted.sources[arm].get(source, 0) for source, _read in PRECEDENCE}}
            for arm, figures in ((PRODUCTION, production), (CANDIDATE, candidate))]
    elapsed = ((as_utc(experiment.ended_at) if experiment.ended_at else now) - as_utc(experiment.started_at))
    per_day = (production.n + candidate.n) / max(elapsed.total_seconds() / 86400, MIN_DAYS)  # users with a score
    needed = users_needed(production, candidate, effect, candidate_share=experiment.share)
    days = needed / per_day if needed is not None and per_day > 0 else None
    earlier = session.exec(select(func.count()).where(
        AbExperiment.library_id == library.id, AbExperiment.candidate_version_id == experiment.candidate_version_id,
        col(AbExperiment.id) < experiment.id)).one()
    status = AbStatus(task.name, library.name, experiment.id, experiment.candidate_label, experiment.share,
                      experiment.started_at, experiment.ended_at, experiment.end_reason, arms, found, excluded,
                      effect, needed, days, live=live if experiment.decided else None,
                      decided_at=decided_at, earlier=earlier)
    return replace(status, words=_words(status))


def _parsed(moment: str | None) -> datetime | None:
    return datetime.fromisoformat(moment) if moment else None


def _words(status: AbStatus) -> str:
    """The verdict as the page and the command line say it."""
    found = status.verdict
    arms = {arm["arm"]: arm for arm in status.arms}
    name = f"{status.candidate_label} {arms[CANDIDATE]['version']} − production {arms[PRODUCTION]['version']}"
    counted = (f"{arms[CANDIDATE]['users']} and {arms[PRODUCTION]['users']} users, from "
               f"{arms[CANDIDATE]['scored traces']} and {arms[PRODUCTION]['scored traces']} scored traces")
    if found.low is None:
        figures = f"not enough users yet ({counted}; each arm needs {MIN_PER_ARM} users with a scored trace)"
    elif status.decided_at is not None:
        figures = (f"{found.difference:+.3f} [{found.low:+.3f}, {found.high:+.3f}] when it was decided, "
                   f"{as_utc(status.decided_at):%Y-%m-%d %H:%M} UTC ({1 - found.alpha:.0%} anytime-valid; a "
                   f"decision stays made)")
        if status.live is not None and status.live.low is not None:
            figures += (f"; now {status.live.difference:+.3f} [{status.live.low:+.3f}, {status.live.high:+.3f}] "
                        f"from {counted}")
    else:
        figures = (f"{found.difference:+.3f} [{found.low:+.3f}, {found.high:+.3f}] ({1 - found.alpha:.0%} "
                   f"anytime-valid: it may be read at any time; each user counts once, {counted})")
    if found.better:
        outcome = f"{status.candidate_label} is better: the interval excludes 0" + (". Promote it" if status.running
                                                                                    else "")
    elif found.worse:
        outcome = (f"{status.candidate_label} is worse: the interval excludes 0"
                   + (". The guard ends the split at the worker's next check" if status.running
                      else ". The split was ended: every user gets production"))
    elif found.low is not None:
        outcome = "No difference shown yet: the interval includes 0"
    else:
        outcome = ""
    more = ""
    if status.running and not found.decided and status.needed is not None:
        days = f" ({_days(status.days)} at the current rate)" if status.days is not None else ""
        more = (f" A true difference of {status.effect:.2f} would be found with {POWER:.0%} chance after about "
                f"{status.needed:,} more users with a scored trace{days}, if new users keep arriving at the rate of "
                "the experiment so far.")
    elif status.running and not found.decided:
        more = f" A difference of {status.effect:.2f} is too small to find at this rate of new users."
    if status.earlier:
        more += (f" {status.earlier} earlier experiment{'s' if status.earlier != 1 else ''} tested this candidate "
                 "version; each restart gives it a fresh 5% chance of a false verdict.")
    return f"{name}: {figures}." + (f" {outcome}." if outcome else "") + more


def _days(days: float | None) -> str:
    if days is None or not math.isfinite(days):
        return "an unknown time"
    return "less than a day" if days < 1 else f"about {days:,.0f} day{'s' if round(days) != 1 else ''}"


# --- the guard: stop a worse candidate, announce a better one -------------------------------------------------


def guard_experiments(engine: Engine, now: datetime | None = None) -> list[str]:
    """One pass over every running experiment (the worker calls it every GUARD_EVERY_S): a candidate significantly
    worse ends the experiment and the split (`ab.stopped`); one significantly better raises `ab.decided` once.
    Returns what it did, in words (for the worker's log)."""
    with holding(None), session_scope(engine) as session:
        running = list(session.exec(select(AbExperiment.id).where(col(AbExperiment.ended_at).is_(None))))
    done = []
    for experiment_id in running:
        with holding(None), session_scope(engine) as session:
            experiment = session.get(AbExperiment, experiment_id)
            if experiment is None or experiment.ended_at is not None:
                continue
            library = session.get(Library, experiment.library_id)
            task = session.get(Task, library.task_id)
            status = _status(session, task, library, experiment, EFFECT, now or utcnow())
            if experiment.decided is None and status.verdict.decided:
                if not _decide(session, experiment, status, now or utcnow()):
                    continue
                status = replace(status, decided_at=as_utc(now or utcnow()), live=status.verdict)
                status = replace(status, words=_words(status))  # as a later read shows it, without reading again
                if status.verdict.better:
                    done.append(f"A/B experiment {experiment.id} of {task.name} decided: {status.words}")
            if status.verdict.worse and _stop(session, library, experiment, status, now or utcnow()):
                done.append(f"stopped A/B experiment {experiment.id} of {task.name}: {status.words}")
    return done


def _stop(session: Session, library: Library, experiment: AbExperiment, status: AbStatus, now: datetime) -> bool:
    """End the experiment and the split; what it says is said of the ended experiment."""
    ended = replace(status, ended_at=now)
    ended = replace(ended, words=_words(ended))
    figures = ended.as_dict()
    if not end(session, experiment, f"stopped by the guard: {ended.words}", GUARD, final=figures,
               action="ab.stopped"):
        return False
    before = {"label": library.ab_label, "share": library.ab_share}
    library.ab_label, library.ab_share = None, None
    session.add(library)
    session.add(AuditEvent(actor=GUARD, action="library.ab_split", object_type="library", object_id=library.id,
                           before=before, after={"label": None, "share": None,
                                                 "reason": f"A/B experiment {experiment.id}: the candidate is worse"}))
    raise_event(session, "ab.stopped", f"A/B split of {status.task} / {status.library} stopped: {ended.words}",
                _event_data(ended))
    return True


def _decide(session: Session, experiment: AbExperiment, status: AbStatus, now: datetime) -> bool:
    """Store the first decision (better or worse) once, with its figures and time; every reader shows it from then
    on. A better candidate raises `ab.decided`; a worse one is stopped by the caller."""
    figures = {**status.as_dict(), "decided_at": as_utc(now).isoformat()}
    marked = session.exec(update(AbExperiment).where(AbExperiment.id == experiment.id,
                                                     col(AbExperiment.decided).is_(None))
                          .values(decided=figures)).rowcount
    if marked != 1:
        return False
    session.refresh(experiment)
    if status.verdict.better:  # a worse one's record is its stop's (`ab.stopped`, audited with the figures)
        session.add(AuditEvent(actor=GUARD, action="ab.decided", object_type="abexperiment", object_id=experiment.id,
                               after={"verdict": figures}))
        raise_event(session, "ab.decided", f"A/B experiment of {status.task} / {status.library} decided: "
                    f"{status.words}", _event_data(status))
    return True


def _event_data(status: AbStatus) -> dict:
    figures = status.as_dict()
    arms = {arm["arm"]: arm for arm in status.arms}
    return {"task": status.task, "library": status.library, "experiment": status.experiment,
            "candidate_label": status.candidate_label, "candidate_version": arms[CANDIDATE]["version"],
            "production_version": arms[PRODUCTION]["version"], "difference": figures["difference"],
            "low": figures["low"], "high": figures["high"], "decided": figures["decided"],
            "users": {arm: row["users"] for arm, row in arms.items()},
            "scored": {arm: row["scored traces"] for arm, row in arms.items()},
            "link": wh.link(get_settings().app_url, "production", task=status.task, library=status.library)}
