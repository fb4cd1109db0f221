"""Production traces scored by the task's own reward in the worker, without waiting for people (issue 50).

A task's production rules may choose traces without the user's feedback for its reward (its judge, for a judged
task): `judge_share`, a stable share of them (by a hash of the sender's id), and `judge_ab`, every trace without feedback (no
score, no thumbs) that counts in a running A/B experiment (stamped with its user's arm and not excluded:
core/records/production/ab_experiments.py), so the experiment's verdict gets a figure without waiting for people. Only traces received after the rules turned
this on (`judge_since`, set by `set_rules`) are considered, so turning it on never bills a backlog; and a trace
is left SETTLE_S seconds for feedback that comes a minute later before anything is spent on it.

Each trace is scored at most once: a pass claims it with one conditional UPDATE (`judging`, by this worker, at
this time), and its verdict lands only while that claim holds; only the claim of a worker no longer alive (its
heartbeat older than the stall window) is taken over, and a call it finished comes back from the ledger's cache.
A sure verdict becomes the trace's judge score (`scored`); an unsure one, or one without a value, waits for a
person as the labelling rules' traces do (`unsure`, label status `needed`), its value only a suggestion. A call that
failed (a provider error, a timeout, a refused connection) is no verdict and no doubt: the trace is tried again after
a back-off (`retry`, RETRY_FIRST_S doubling up to RETRY_MAX_S, each failure counted) and never sent to people for
it, so an outage does not flood their queue; the page says "judge unavailable since ..." while calls fail. A trace's score is a person's label
first, then what its user sent, then the judge's (core.records.production.scores.trace_score); `score_source` names which.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, or_, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from core.domain.draws import stable_fraction
from core.domain.rewards import METHODS
from core.errors import InvalidInput
from core.records.production.scores import has_feedback
from core.records.runs.workers import alive_workers, stall_after
from storage.db import session_scope
from storage.fencing import holding
from storage.statuses import LabelStatus, TraceJudgeStatus
from storage.tables import LLMCall, Task, Trace, as_utc, utcnow

JUDGE_RULES = ("judge_share", "judge_ab")
STAGE = "production_judge"  # the ledger's stage of these calls
SETTLE_S = 60.0
PASS_LIMIT = 20  # traces one pass scores at most, so queued runs and evaluations do not wait long
SOURCES = {"person": "a person's label", "user": "what the user sent", "judge": "the task's judge"}
RETRY_FIRST_S = 60.0  # the wait after a trace's first failed judge call; doubled after each further one
RETRY_MAX_S = 3600.0


def retry_after(attempts: int) -> float:
    """Seconds before the next judge call of a trace whose last `attempts` calls failed."""
    return min(RETRY_FIRST_S * 2 ** max(attempts - 1, 0), RETRY_MAX_S)




def judging_on(rules: dict) -> bool:
    return bool(rules.get("judge_share") or rules.get("judge_ab"))


def with_start(before: dict, after: dict, now: datetime | None = None) -> dict:
    """`after` with `judge_since`: kept while judging stays on, now when it is turned on, gone when off."""
    after = {name: value for name, value in after.items() if name != "judge_since"}
    if not judging_on(after):
        return {name: value for name, value in after.items() if name != "judge_ab" or value}
    if judging_on(before) and before.get("judge_since"):
        return {**after, "judge_since": before["judge_since"]}
    return {**after, "judge_since": (now or utcnow()).isoformat()}


def cannot_score(task: Task) -> str | None:
    """Why the task's reward cannot score a production trace, or None. A trace has no reference answer, so a
    verifier that compares with one cannot, unless a setting stands in for it (regex's pattern); people's
    method has no model to ask."""
    method = METHODS.get(task.reward_method)
    if method is None:
        return f"the task's reward method {task.reward_method!r} is unknown"
    if method.uses_judge:
        return None if task.judge_model else "the task has no judge model"
    if method.uses_people:
        return "the task's reward is people's labels: the labelling rules send traces to people instead"
    if method.needs_reference and not (method.reference_setting
                                       and (task.reward_settings or {}).get(method.reference_setting)):
        return (f"the task's reward ({method.name}) compares with each sample's reference answer, and a production "
                "trace has none; use a judge reward to score production")
    return None


def require_scorable(task: Task, rules: dict) -> None:
    """Refuse judge rules the task's reward cannot follow, saying why (set_rules calls this)."""
    if judging_on(rules) and (reason := cannot_score(task)):
        raise InvalidInput(f"production traces of {task.name!r} cannot be scored by its reward: {reason}")


# --- which traces --------------------------------------------------------------------------------------




def in_experiment(trace: Trace) -> bool:
    """Whether the trace counts in an A/B experiment: its user's arm served it after the start."""
    return trace.ab_experiment_id is not None and trace.ab_arm is not None and trace.ab_excluded is None


def judge_suggestion_shown(trace: Trace) -> bool:
    """Whether a labeller sees an unsure judge's suggestion: not on a trace that counts in an A/B experiment, where
    the person's label is the evidence and the judge's figure seen first would anchor it."""
    return trace.judge_status == TraceJudgeStatus.UNSURE and not in_experiment(trace)


def chosen(rules: dict, trace: Trace) -> bool:
    """Whether the rules choose this trace for the judge: one without the user's feedback (a score or thumbs counts
    before the judge's, so a call on it would be paid for nothing), in the share or in an A/B arm."""
    if has_feedback(trace):
        return False
    share = rules.get("judge_share") or 0.0
    if share > 0 and stable_fraction(f"judge:{trace.client_id}") < share:
        return True
    return bool(rules.get("judge_ab")) and in_experiment(trace) and not has_feedback(trace)


def due_traces(engine: Engine, now: datetime | None = None, limit: int = PASS_LIMIT) -> list[int]:
    """Up to `limit` trace ids the judge should score now. The traces the rules do not choose are marked
    `skipped` on the way, so a later pass reads only new ones; a person's label already settles a trace."""
    now = as_utc(now or utcnow())
    due: list[int] = []
    with holding(None), session_scope(engine) as session:
        tasks = [task for task in session.exec(select(Task)) if judging_on(task.production_rules or {})
                 and cannot_score(task) is None]
        for task in tasks:
            rules = task.production_rules or {}
            since = _since(rules)
            rows = session.exec(select(Trace).where(
                Trace.task_id == task.id, col(Trace.judge_status).is_(None),
                Trace.received_at <= now - timedelta(seconds=SETTLE_S),
                *([Trace.received_at >= since] if since is not None else []))
                .order_by(Trace.id).limit(max(limit - len(due), 0) * 20 + 20))
            skipped = []
            for trace in rows:
                if trace.label_value is None and chosen(rules, trace):
                    if len(due) < limit:
                        due.append(trace.id)
                else:
                    skipped.append(trace.id)
            if skipped:
                session.exec(update(Trace).where(col(Trace.id).in_(skipped), col(Trace.judge_status).is_(None))
                             .values(judge_status=TraceJudgeStatus.SKIPPED))
            if len(due) >= limit:
                break
        if len(due) < limit:  # a failed call whose back-off is over (its task still judging), oldest first
            due += list(session.exec(select(Trace.id).where(_retry_due(now), col(Trace.task_id).in_(
                [task.id for task in tasks])).order_by(Trace.judge_retry_at).limit(limit - len(due))))
        if len(due) < limit:  # a claim whose worker died mid-call: taken over, the call back from the cache
            due += list(session.exec(select(Trace.id).where(_orphaned(session, now))
                                     .order_by(Trace.id).limit(limit - len(due))))
    return due


def _orphaned(session: Session, now: datetime):
    """Claims older than the stall window held by no live worker (killed or stopped mid-call). A live worker's
    claim is never taken, however slow its judge: the call may take up to its deadline, and must not be made twice."""
    alive = [worker.id for worker in alive_workers(session)]
    return ((col(Trace.judge_status) == TraceJudgeStatus.JUDGING)
            & (col(Trace.judged_at).is_(None) | (Trace.judged_at < now - timedelta(seconds=stall_after())))
            & (col(Trace.judge_claim).is_(None) | col(Trace.judge_claim).not_in(alive)))


def _retry_due(now: datetime):
    return ((col(Trace.judge_status) == TraceJudgeStatus.RETRY) & col(Trace.label_value).is_(None)
            & (Trace.judge_retry_at <= now))


def _since(rules: dict) -> datetime | None:
    since = rules.get("judge_since")
    if not since:
        return None
    moment = datetime.fromisoformat(str(since))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# --- one trace: claimed, then its verdict --------------------------------------------------------------


def claim(engine: Engine, trace_id: int, owner: str, now: datetime | None = None) -> bool:
    """Take the trace for this worker's judge call: one conditional UPDATE, so two workers (or two passes)
    never both score it. A claim is taken over only from a worker no longer alive (_orphaned)."""
    now = as_utc(now or utcnow())
    with holding(None), session_scope(engine) as session:
        result = session.exec(update(Trace).where(Trace.id == trace_id, col(Trace.label_value).is_(None),
                                                  or_(col(Trace.judge_status).is_(None), _retry_due(now),
                                                      _orphaned(session, now)))
                              .values(judge_status=TraceJudgeStatus.JUDGING, judge_claim=owner, judged_at=now))
        return result.rowcount == 1


def store_verdict(engine: Engine, trace_id: int, owner: str, value: float | None, detail: str, unsure: bool, *,
                  failed: bool = False, now: datetime | None = None) -> bool:
    """The verdict of the claimed trace, only while this worker's claim holds; True when it landed. An unsure
    verdict (or none) puts the trace in the people's queue, unless a person labelled it meanwhile; a `failed` call
    puts it back for a later pass, after a back-off, and leaves the people's queue alone."""
    doubt = unsure or value is None
    now = as_utc(now or utcnow())
    with holding(None), session_scope(engine) as session:
        trace = session.exec(select(Trace).where(Trace.id == trace_id, Trace.judge_claim == owner,
                                                 Trace.judge_status == TraceJudgeStatus.JUDGING)).first()
        if trace is None:
            return False
        if failed:
            trace.judge_status, trace.judge_detail = TraceJudgeStatus.RETRY, detail[:2000]
            trace.judge_attempts += 1
            trace.judge_failed_at = trace.judge_failed_at or now
            trace.judge_retry_at = now + timedelta(seconds=retry_after(trace.judge_attempts))
            session.add(trace)
            return True
        trace.judge_attempts, trace.judge_retry_at, trace.judge_failed_at = 0, None, None
        trace.judge_status = TraceJudgeStatus.UNSURE if doubt else TraceJudgeStatus.SCORED
        trace.judge_score, trace.judge_detail, trace.judged_at = value, detail[:2000], utcnow()
        if doubt and trace.label_status != LabelStatus.DONE:
            trace.label_status = LabelStatus.NEEDED
        session.add(trace)
        return True


# --- what the page, the API and the CLI say ------------------------------------------------------------






@dataclass(frozen=True)
class JudgeSummary:
    """A task's production judge so far: traces scored, unsure (sent to people), waiting, and the ledger's cost."""

    scored: int
    unsure: int
    waiting: int
    calls: int
    cost: float
    retrying: int = 0  # traces whose last judge call failed, waiting for their next try
    failing_since: datetime | None = None  # the oldest of their failures still unresolved
    last_failure: str = ""

    @property
    def unavailable(self) -> str | None:
        """"judge unavailable since ..." while calls fail, else None."""
        if not self.retrying:
            return None
        since = f"{as_utc(self.failing_since):%Y-%m-%d %H:%M} UTC" if self.failing_since else "a moment ago"
        return (f"Judge unavailable since {since}: {self.retrying} trace(s) wait for their next try (back-off up to "
                f"{RETRY_MAX_S / 60:.0f} min); none is sent to people for it. Last failure: {self.last_failure}")

    def words(self) -> str:
        return (f"The task's judge scored {self.scored} trace(s); {self.unsure} unsure verdict(s) went to people"
                + (f"; {self.waiting} being scored" if self.waiting else "")
                + (f"; {self.retrying} wait for a retry after a failed call" if self.retrying else "")
                + f". {self.calls} judge call(s) in the ledger (stage {STAGE}), ${self.cost:.4f}.")


def judge_summary(session: Session, task_id: int) -> JudgeSummary:
    counts = dict(session.exec(select(Trace.judge_status, func.count()).where(Trace.task_id == task_id)
                               .group_by(Trace.judge_status)).all())
    calls, cost = session.exec(select(func.count(), func.coalesce(func.sum(LLMCall.cost), 0.0))
                               .join(Trace, Trace.id == LLMCall.trace_id)
                               .where(Trace.task_id == task_id, LLMCall.stage == STAGE)).one()
    failing = session.exec(select(func.min(Trace.judge_failed_at)).where(
        Trace.task_id == task_id, Trace.judge_status == TraceJudgeStatus.RETRY)).one()
    last = session.exec(select(Trace.judge_detail).where(Trace.task_id == task_id,
                                                         Trace.judge_status == TraceJudgeStatus.RETRY)
                        .order_by(col(Trace.judge_failed_at).desc()).limit(1)).first()
    return JudgeSummary(counts.get(TraceJudgeStatus.SCORED, 0), counts.get(TraceJudgeStatus.UNSURE, 0),
                        counts.get(TraceJudgeStatus.JUDGING, 0), int(calls), float(cost),
                        counts.get(TraceJudgeStatus.RETRY, 0), failing, (last or "")[:300])


def rules_words(rules: dict) -> str:
    """The judge rules in a sentence, as the Production page and `production-rules` say them."""
    if not judging_on(rules):
        return "The task's judge scores no production trace (only people and users do)."
    parts = []
    if rules.get("judge_share"):
        parts.append(f"{rules['judge_share']:.0%} of traces")
    if rules.get("judge_ab"):
        parts.append("every A/B arm's trace without feedback")
    return (f"The task's judge scores {' and '.join(parts)}, received since {rules.get('judge_since', '-')}, a "
            f"minute after each arrives (the worker does it, each trace once).")

