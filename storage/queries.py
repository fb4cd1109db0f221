"""Small read queries, each taking a session; the pages, the CLI and core share them."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import case, func, or_
from sqlmodel import Session, col, select

from storage.statuses import EvaluationPurpose, LabelStatus, OperationStatus, StepStatus
from storage.tables import (
    Advantage,
    AuditEvent,
    Evaluation,
    Library,
    LibraryLabel,
    LibraryVersion,
    LLMCall,
    Operation,
    RewardLabel,
    Rollout,
    Run,
    Sample,
    Step,
    Task,
    Trace,
    User,
)


def task_by_name(session: Session, name: str) -> Task | None:
    return session.exec(select(Task).where(Task.name == name)).first()


def list_tasks(session: Session) -> list[Task]:
    return list(session.exec(select(Task).order_by(Task.id)))


def samples(session: Session, task_id: int, split: str | None = None, limit: int | None = None) -> list[Sample]:
    query = select(Sample).where(Sample.task_id == task_id)
    if split:
        query = query.where(Sample.split == split)
    query = query.order_by(Sample.id)
    if limit:
        query = query.limit(limit)
    return list(session.exec(query))


def count_samples(session: Session, task_id: int) -> dict[str, int]:
    rows = session.exec(
        select(Sample.split, func.count()).where(Sample.task_id == task_id).group_by(Sample.split)
    ).all()
    return {split: n for split, n in rows}


def library_by_name(session: Session, task_id: int, name: str) -> Library | None:
    return session.exec(select(Library).where(Library.task_id == task_id, Library.name == name)).first()


def libraries(session: Session, task_id: int | None = None) -> list[Library]:
    query = select(Library).order_by(Library.id)
    if task_id is not None:
        query = query.where(Library.task_id == task_id)
    return list(session.exec(query))


def versions(session: Session, library_id: int) -> list[LibraryVersion]:
    return list(
        session.exec(
            select(LibraryVersion).where(LibraryVersion.library_id == library_id).order_by(LibraryVersion.number)
        )
    )


def latest_version(session: Session, library_id: int) -> LibraryVersion | None:
    return session.exec(
        select(LibraryVersion)
        .where(LibraryVersion.library_id == library_id)
        .order_by(col(LibraryVersion.number).desc())
    ).first()


def labels(session: Session, library_id: int) -> list[LibraryLabel]:
    return list(session.exec(select(LibraryLabel).where(LibraryLabel.library_id == library_id)))


def label_by_name(session: Session, library_id: int, name: str) -> LibraryLabel | None:
    return session.exec(
        select(LibraryLabel).where(LibraryLabel.library_id == library_id, LibraryLabel.name == name)
    ).first()


def trace_versions(session: Session, task_id: int) -> dict[int, int]:
    """The versions a task's production traces were served by: version id -> its number."""
    rows = session.exec(select(LibraryVersion.id, LibraryVersion.number).where(
        col(LibraryVersion.id).in_(select(Trace.version_id).where(Trace.task_id == task_id).distinct())))
    return dict(rows.all())


def trace_segments(session: Session, task_id: int) -> list[str]:
    """The user segments a task's production traces named, sorted."""
    rows = session.exec(select(Trace.segment).where(Trace.task_id == task_id, col(Trace.segment).is_not(None)).distinct())
    return sorted(rows)


def runs(session: Session, task_id: int | None = None, kinds: Iterable[str] | None = None) -> list[Run]:
    """Newest first; `kinds` keeps only runs of those kinds (e.g. training runs without attribution jobs)."""
    query = select(Run).order_by(col(Run.id).desc())
    if task_id is not None:
        query = query.where(Run.task_id == task_id)
    if kinds is not None:
        query = query.where(col(Run.kind).in_(list(kinds)))
    return list(session.exec(query))


def steps(session: Session, run_id: int) -> list[Step]:
    return list(session.exec(select(Step).where(Step.run_id == run_id).order_by(Step.epoch, Step.batch_index)))


def step_by_position(session: Session, run_id: int, epoch: int, batch_index: int) -> Step | None:
    return session.exec(
        select(Step).where(Step.run_id == run_id, Step.epoch == epoch, Step.batch_index == batch_index)
    ).first()


def step_rollouts(session: Session, step_id: int, sample_id: int | None = None) -> list[Rollout]:
    query = select(Rollout).where(Rollout.step_id == step_id)
    if sample_id is not None:
        query = query.where(Rollout.sample_id == sample_id)
    return list(session.exec(query.order_by(Rollout.sample_id, Rollout.group_index)))


def evaluation_rollouts(session: Session, evaluation_id: int) -> list[Rollout]:
    return list(
        session.exec(
            select(Rollout)
            .where(Rollout.evaluation_id == evaluation_id)
            .order_by(Rollout.sample_id, Rollout.group_index)
        )
    )


def step_advantages(session: Session, step_id: int) -> list[Advantage]:
    return list(session.exec(select(Advantage).where(Advantage.step_id == step_id).order_by(Advantage.id)))


def step_groups(session: Session, step: Step) -> tuple[list[int], dict[int, Sample], dict[int, Advantage],
                                                      dict[int, list[Rollout]]]:
    """A step's groups as Review numbers them: its sample ids in the step's order (then any other that has an
    advantage or a rollout), the samples, and the advantage and the rollouts of each, by sample id. The Review page
    and `python -m core review` read the same groups."""
    advantages = {a.sample_id: a for a in step_advantages(session, step.id)}
    rollouts: dict[int, list[Rollout]] = {}
    for rollout in step_rollouts(session, step.id):
        rollouts.setdefault(rollout.sample_id, []).append(rollout)
    sample_ids = list(dict.fromkeys([*step.sample_ids, *advantages, *rollouts]))
    return sample_ids, {s.id: s for s in samples_by_ids(session, sample_ids)}, advantages, rollouts


def step_operations(session: Session, step_id: int) -> list[Operation]:
    return list(session.exec(select(Operation).where(Operation.step_id == step_id).order_by(Operation.position)))


def evaluations(session: Session, task_id: int | None = None,
                purpose: str | None = EvaluationPurpose.EVALUATION) -> list[Evaluation]:
    """Newest first; by default only those people asked for (not a gate's or an attribution's); purpose=None: all."""
    query = select(Evaluation).order_by(col(Evaluation.id).desc())
    if purpose is not None:
        query = query.where(Evaluation.purpose == purpose)
    if task_id is not None:
        query = query.where(Evaluation.task_id == task_id)
    return list(session.exec(query))


def calls(session: Session, run_id: int | None = None, evaluation_id: int | None = None) -> list[LLMCall]:
    query = select(LLMCall).order_by(LLMCall.id)
    if run_id is not None:
        query = query.where(LLMCall.run_id == run_id)
    if evaluation_id is not None:
        query = query.where(LLMCall.evaluation_id == evaluation_id)
    return list(session.exec(query))


def call_totals(session: Session, run_id: int | None = None, evaluation_id: int | None = None) -> dict:
    """Calls, cache hits, errors, tokens and cost of a run or an evaluation, from the ledger; `repaired` and
    `malformed` count the structured replies that json-repair had to mend, and those still unusable."""
    query = select(
        func.count(),
        func.coalesce(func.sum(LLMCall.tokens_in), 0),
        func.coalesce(func.sum(LLMCall.tokens_out), 0),
        func.coalesce(func.sum(LLMCall.cost), 0.0),
        func.coalesce(func.sum(case((col(LLMCall.cache_hit), 1), else_=0)), 0),
        func.count(LLMCall.error),
        func.coalesce(func.sum(case((LLMCall.reply_status == "repaired", 1), else_=0)), 0),
        func.coalesce(func.sum(case((LLMCall.reply_status == "malformed", 1), else_=0)), 0),
    )
    if run_id is not None:
        query = query.where(LLMCall.run_id == run_id)
    if evaluation_id is not None:
        query = query.where(LLMCall.evaluation_id == evaluation_id)
    n, tin, tout, cost, hits, errors, repaired, malformed = session.exec(query).one()
    return {"calls": n, "tokens_in": tin, "tokens_out": tout, "cost": float(cost), "cache_hits": hits,
            "errors": errors, "repaired": repaired, "malformed": malformed}


def pending_operations_by_run(session: Session) -> dict[int, int]:
    """How many operations of each run wait for a reviewer."""
    rows = session.exec(
        select(Operation.run_id, func.count()).where(Operation.status == OperationStatus.PENDING).group_by(Operation.run_id)
    ).all()
    return {run_id: n for run_id, n in rows if run_id is not None}


def run_stage_counts(session: Session, run_id: int) -> dict:
    """Rollouts, rewards, summaries, advantages and operations of a run, counted in the database."""
    rollouts, errors, rewards, summaries = session.exec(
        select(func.count(Rollout.id), func.count(Rollout.error), func.count(Rollout.reward), func.count(Rollout.summary))
        .join(Step, Rollout.step_id == Step.id)
        .where(Step.run_id == run_id)
    ).one()
    advantages = dict(session.exec(
        select(Advantage.status, func.count()).join(Step, Advantage.step_id == Step.id)
        .where(Step.run_id == run_id).group_by(Advantage.status)
    ).all())
    operations = dict(session.exec(
        select(Operation.status, func.count()).where(Operation.run_id == run_id).group_by(Operation.status)
    ).all())
    steps_done = session.exec(
        select(func.count()).select_from(Step).where(Step.run_id == run_id, Step.status == StepStatus.COMPLETED)
    ).one()
    return {"rollouts": rollouts, "rollout_errors": errors, "rewards": rewards, "summaries": summaries,
            "advantages": advantages, "operations": operations, "steps_done": steps_done}


def run_by_id(session: Session, run_id: int) -> Run | None:
    return session.exec(select(Run).where(Run.id == run_id)).first()


def version_by_id(session: Session, version_id: int) -> LibraryVersion | None:
    return session.exec(select(LibraryVersion).where(LibraryVersion.id == version_id)).first()


def run_versions(session: Session, run_id: int) -> list[LibraryVersion]:
    """The versions a run created, in order (its start version is not among them)."""
    return list(
        session.exec(select(LibraryVersion).where(LibraryVersion.run_id == run_id).order_by(LibraryVersion.number))
    )


def version_number(session: Session, version_id: int | None) -> int | None:
    """One version's number in its library, or None (no id, or no such version): the name a person reads."""
    return None if version_id is None else version_numbers(session, [version_id]).get(version_id)


def version_numbers(session: Session, version_ids: list[int]) -> dict[int, int]:
    """Version id -> version number, for tables that name versions by number."""
    if not version_ids:
        return {}
    rows = session.exec(
        select(LibraryVersion.id, LibraryVersion.number).where(col(LibraryVersion.id).in_(version_ids))
    ).all()
    return {version_id: number for version_id, number in rows}


def samples_by_ids(session: Session, sample_ids: list[int]) -> list[Sample]:
    if not sample_ids:
        return []
    return list(session.exec(select(Sample).where(col(Sample.id).in_(sample_ids)).order_by(Sample.id)))


def answered():
    """The SQL test for a rollout with a reward to count: its model calls succeeded and it was scored.

    A rollout whose agent call failed (`error`) or whose reward could not be given (source `error`: the
    judge's call or the scorer failed) is not a wrong answer; figures leave it out and count it apart."""
    return (col(Rollout.error).is_(None) & col(Rollout.reward).is_not(None)
            & or_(col(Rollout.reward_source).is_(None), Rollout.reward_source != "error"))


def evaluation_query_stats(session: Session, evaluation_id: int) -> dict[int, dict]:
    """Per query of an evaluation: mean reward over its answered rollouts (None when none was), cost,
    rollouts, answered rollouts and errors (rollouts without a reward to count), in SQL."""
    is_answered = case((answered(), 1), else_=0)
    rows = session.exec(
        select(Rollout.sample_id, func.sum(case((answered(), Rollout.reward), else_=0.0)), func.sum(is_answered),
               func.coalesce(func.sum(Rollout.cost), 0.0), func.count(Rollout.id))
        .where(Rollout.evaluation_id == evaluation_id)
        .group_by(Rollout.sample_id)
    ).all()
    return {sample_id: {"mean": float(total) / int(ok) if ok else None, "cost": float(cost), "n": n,
                        "answered": int(ok), "errors": n - int(ok)}
            for sample_id, total, ok, cost, n in rows}


def evaluation_rewards(session: Session, evaluation_id: int) -> dict[int, list[float]]:
    """Per query of an evaluation: the reward of every answered sample, in sample order (errors left out:
    a failed call is not a wrong answer; a query none of whose samples was answered is absent)."""
    rows = session.exec(select(Rollout.sample_id, Rollout.group_index, Rollout.reward)
                        .where(Rollout.evaluation_id == evaluation_id, answered())
                        .order_by(Rollout.sample_id, Rollout.group_index)).all()
    rewards: dict[int, list[float]] = {}
    for sample_id, _index, reward in rows:
        rewards.setdefault(sample_id, []).append(float(reward))
    return rewards


def evaluation_queries(session: Session, evaluation_id: int) -> set[int]:
    """Every query an evaluation has a rollout for, answered or not."""
    return set(session.exec(select(Rollout.sample_id).where(Rollout.evaluation_id == evaluation_id).distinct()))


def rollout_groups(session: Session, *, step_id: int | None = None, evaluation_id: int | None = None) -> list[dict]:
    """One row per query of a step or an evaluation (G, mean/min/max reward, errors), counted in SQL.

    `mixed`: the rewards differ within the group; `failed`: a reward below 1, an unscored output or an error.
    """
    if (step_id is None) == (evaluation_id is None):
        raise ValueError("give either step_id or evaluation_id")
    query = (
        select(Rollout.sample_id, Sample.external_id, func.count(Rollout.id), func.avg(Rollout.reward),
               func.min(Rollout.reward), func.max(Rollout.reward), func.count(Rollout.reward),
               func.count(Rollout.error))
        .join(Sample, Rollout.sample_id == Sample.id)
        .where(Rollout.step_id == step_id if step_id is not None else Rollout.evaluation_id == evaluation_id)
        .group_by(Rollout.sample_id, Sample.external_id)
        .order_by(Rollout.sample_id)
    )
    rows = []
    for sample_id, external_id, n, mean, low, high, scored, errors in session.exec(query).all():
        rows.append({"sample_id": sample_id, "external_id": external_id, "n": n,
                     "mean": float(mean) if mean is not None else None, "scored": scored, "errors": errors,
                     "mixed": scored >= 2 and high > low,
                     "failed": errors > 0 or scored < n or (low is not None and low < 1)})
    return rows


def evaluation_sample_rollouts(session: Session, evaluation_id: int, sample_id: int) -> list[Rollout]:
    """The k outputs of one query in an evaluation (never the whole evaluation)."""
    return list(session.exec(
        select(Rollout).where(Rollout.evaluation_id == evaluation_id, Rollout.sample_id == sample_id)
        .order_by(Rollout.group_index)
    ))


def pending_operations_by_step(session: Session, run_id: int) -> dict[int, int]:
    """How many operations of each step of a run wait for a reviewer."""
    rows = session.exec(
        select(Operation.step_id, func.count())
        .where(Operation.run_id == run_id, Operation.status == OperationStatus.PENDING)
        .group_by(Operation.step_id)
    ).all()
    return {step_id: n for step_id, n in rows if step_id is not None}


def steps_by_ids(session: Session, step_ids: list[int]) -> dict[int, Step]:
    """Step id -> step, e.g. to name the epoch/batch that created each library version."""
    if not step_ids:
        return {}
    return {s.id: s for s in session.exec(select(Step).where(col(Step.id).in_(list(step_ids))))}


def _many(value: str | Iterable[str] | None) -> list[str]:
    """One value or several, as a list (empty means no filter)."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else [v for v in value if v]


def audit_events(session: Session, *, actor: str | Iterable[str] | None = None,
                 action_prefix: str | Iterable[str] | None = None, object_type: str | Iterable[str] | None = None,
                 object_id: int | None = None, since: datetime | None = None, until: datetime | None = None,
                 limit: int | None = 500) -> list[AuditEvent]:
    """Audit events, newest first, for the Audit page and the CLI; each filter takes one value or several.

    `action_prefix` "run" matches the group (run.create, run.paused) and "run.create" the action itself;
    `since` is inclusive and `until` exclusive, so a date range is [first day 00:00, day after the last).
    """
    query = select(AuditEvent)
    if actors := _many(actor):
        query = query.where(col(AuditEvent.actor).in_(actors))
    if prefixes := _many(action_prefix):
        query = query.where(or_(*[(AuditEvent.action == p) | col(AuditEvent.action).startswith(f"{p}.", autoescape=True)
                                  for p in prefixes]))
    if types := _many(object_type):
        query = query.where(col(AuditEvent.object_type).in_(types))
    if object_id is not None:
        query = query.where(AuditEvent.object_id == object_id)
    if since is not None:
        query = query.where(AuditEvent.created_at >= since)
    if until is not None:
        query = query.where(AuditEvent.created_at < until)
    query = query.order_by(col(AuditEvent.created_at).desc(), col(AuditEvent.id).desc())
    if limit:
        query = query.limit(limit)
    return list(session.exec(query))


def audit_facets(session: Session) -> dict[str, list[str]]:
    """The distinct actors, actions and object types in the audit log, sorted, for filter choices."""
    def distinct(column) -> list[str]:
        return sorted(v for v in session.exec(select(column).distinct()) if v is not None)

    return {"actors": distinct(AuditEvent.actor), "actions": distinct(AuditEvent.action),
            "object_types": distinct(AuditEvent.object_type)}


def rollouts_waiting_for_labels(session: Session) -> int:
    return session.exec(select(func.count()).select_from(Rollout).where(Rollout.label_status == LabelStatus.NEEDED)).one()


# ---- the labeling queue ----------------------------------------------------------------------------------


def _task_rollouts(task_id: int):
    return select(Rollout).join(Sample, Sample.id == Rollout.sample_id).where(Sample.task_id == task_id)


def queued_rollouts(session: Session, task_id: int) -> list[Rollout]:
    """Every rollout of a task that entered the labeling queue (any label status), oldest first."""
    return list(session.exec(_task_rollouts(task_id).where(col(Rollout.label_status).is_not(None))
                             .order_by(Rollout.id)))


def rollouts_to_label(session: Session, task_id: int, labeler: str) -> list[Rollout]:
    """Queued rollouts of the task this person has not labelled yet, oldest first (one query)."""
    labelled = select(RewardLabel.rollout_id).where(RewardLabel.labeler == labeler, RewardLabel.kind == "label")
    return list(session.exec(_task_rollouts(task_id).where(Rollout.label_status == LabelStatus.NEEDED,
                                                            col(Rollout.id).not_in(labelled))
                             .order_by(Rollout.id)))


def label_history(session: Session, rollout_id: int) -> list[RewardLabel]:
    """Every label and decision on a rollout, oldest first."""
    return list(session.exec(select(RewardLabel).where(RewardLabel.rollout_id == rollout_id).order_by(RewardLabel.id)))


def latest_labels(session: Session, rollout_id: int) -> dict[str, RewardLabel]:
    """Each labeller's newest label on a rollout (decisions excluded)."""
    return {row.labeler: row for row in label_history(session, rollout_id) if row.kind == "label"}


def latest_labels_of_task(session: Session, task_id: int) -> dict[int, dict[str, RewardLabel]]:
    """Rollout id -> each labeller's newest label (decisions excluded), for a whole task in one query."""
    rows = session.exec(select(RewardLabel).join(Rollout, Rollout.id == RewardLabel.rollout_id)
                        .join(Sample, Sample.id == Rollout.sample_id)
                        .where(Sample.task_id == task_id, RewardLabel.kind == "label").order_by(RewardLabel.id))
    latest: dict[int, dict[str, RewardLabel]] = {}
    for row in rows:
        latest.setdefault(row.rollout_id, {})[row.labeler] = row
    return latest


def recent_labels(session: Session, task_id: int, limit: int = 50) -> list[RewardLabel]:
    """The newest labels and decisions on a task's rollouts."""
    return list(session.exec(select(RewardLabel).join(Rollout, Rollout.id == RewardLabel.rollout_id)
                             .join(Sample, Sample.id == Rollout.sample_id).where(Sample.task_id == task_id)
                             .order_by(col(RewardLabel.id).desc()).limit(limit)))


def rollouts_by_ids(session: Session, rollout_ids: list[int]) -> dict[int, Rollout]:
    if not rollout_ids:
        return {}
    return {r.id: r for r in session.exec(select(Rollout).where(col(Rollout.id).in_(rollout_ids)))}


def has_rollouts_to_label(session: Session, *, step_id: int | None = None, evaluation_id: int | None = None) -> bool:
    """Whether a training step (or an evaluation) still has a rollout waiting for a label."""
    owner = Rollout.step_id == step_id if step_id is not None else Rollout.evaluation_id == evaluation_id
    return session.exec(select(Rollout.id).where(owner, Rollout.label_status == LabelStatus.NEEDED)).first() is not None


def user_by_name(session: Session, name: str) -> User | None:
    return session.exec(select(User).where(User.name == name)).first()


def list_users(session: Session) -> list[User]:
    return list(session.exec(select(User).order_by(User.name)))


def call_speeds_by_stage(session: Session, *, run_id: int | None = None, model: str | None = None,
                         other_than_run: int | None = None) -> dict[str, dict]:
    """Per ledger stage: how many calls really went to a model (not from the cache, no error) and their mean
    latency (ms) and tokens in and out; of one run, or of one model outside a run. Time estimates read these."""
    query = (select(LLMCall.stage, func.count(), func.avg(LLMCall.latency_ms), func.avg(LLMCall.tokens_in),
                    func.avg(LLMCall.tokens_out))
             .where(col(LLMCall.cache_hit).is_(False), col(LLMCall.error).is_(None)))
    if run_id is not None:
        query = query.where(LLMCall.run_id == run_id)
    if model is not None:
        query = query.where(LLMCall.model == model)
    if other_than_run is not None:
        query = query.where(or_(col(LLMCall.run_id).is_(None), LLMCall.run_id != other_than_run))
    rows = session.exec(query.group_by(LLMCall.stage)).all()
    return {stage: {"calls": n, "latency_ms": float(latency or 0.0), "tokens_in": float(tin or 0.0),
                    "tokens_out": float(tout or 0.0)} for stage, n, latency, tin, tout in rows}


def call_counts_by_stage(session: Session, run_id: int) -> dict[str, int]:
    """Per ledger stage: every call a run has made so far (cached and failed ones too): what is done of its plan."""
    rows = session.exec(select(LLMCall.stage, func.count()).where(LLMCall.run_id == run_id)
                        .group_by(LLMCall.stage)).all()
    return {stage: n for stage, n in rows}


def jobs_in_status(session: Session, status: str) -> list[tuple[str, Run | Evaluation]]:
    """Runs and evaluations of their own (not a run's gate or attribution) in `status`, oldest first: for
    `queued`, the order in which core.jobs.worker.claim_next takes them."""
    found: list[tuple[str, Run | Evaluation]] = [
        ("run", row) for row in session.exec(select(Run).where(Run.status == status))]
    found += [("evaluation", row) for row in session.exec(
        select(Evaluation).where(Evaluation.status == status, col(Evaluation.run_id).is_(None)))]
    return sorted(found, key=lambda item: item[1].created_at)


def steps_waiting_for_review(session: Session, task_id: int | None = None,
                             kinds: Iterable[str] | None = None) -> list[Step]:
    """Steps a reviewer has something to do in: awaiting review, or with an operation pending; of one task's
    runs (or every task's), of runs of `kinds`; newest run first, then in the run's order."""
    pending = select(Operation.step_id).where(Operation.status == OperationStatus.PENDING)
    query = (select(Step).join(Run, Run.id == Step.run_id)
             .where(or_(Step.status == StepStatus.AWAITING_REVIEW, col(Step.id).in_(pending)))
             .order_by(col(Step.run_id).desc(), Step.epoch, Step.batch_index))
    if task_id is not None:
        query = query.where(Run.task_id == task_id)
    if kinds is not None:
        query = query.where(col(Run.kind).in_(list(kinds)))
    return list(session.exec(query))
