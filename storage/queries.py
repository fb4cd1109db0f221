"""Small read queries, each taking a session; the pages, the CLI and core share them."""

from __future__ import annotations

from sqlalchemy import case, func
from sqlmodel import Session, col, select

from storage.models import (
    Advantage,
    Evaluation,
    Library,
    LibraryLabel,
    LibraryVersion,
    LLMCall,
    Operation,
    Rollout,
    Run,
    Sample,
    Step,
    Task,
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


def runs(session: Session, task_id: int | None = None) -> list[Run]:
    query = select(Run).order_by(col(Run.id).desc())
    if task_id is not None:
        query = query.where(Run.task_id == task_id)
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


def step_operations(session: Session, step_id: int) -> list[Operation]:
    return list(session.exec(select(Operation).where(Operation.step_id == step_id).order_by(Operation.position)))


def evaluations(session: Session, task_id: int | None = None) -> list[Evaluation]:
    query = select(Evaluation).order_by(col(Evaluation.id).desc())
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
    """Calls, cache hits, errors, tokens and cost of a run or an evaluation, from the ledger."""
    query = select(
        func.count(),
        func.coalesce(func.sum(LLMCall.tokens_in), 0),
        func.coalesce(func.sum(LLMCall.tokens_out), 0),
        func.coalesce(func.sum(LLMCall.cost), 0.0),
        func.coalesce(func.sum(case((col(LLMCall.cache_hit), 1), else_=0)), 0),
        func.count(LLMCall.error),
    )
    if run_id is not None:
        query = query.where(LLMCall.run_id == run_id)
    if evaluation_id is not None:
        query = query.where(LLMCall.evaluation_id == evaluation_id)
    n, tin, tout, cost, hits, errors = session.exec(query).one()
    return {"calls": n, "tokens_in": tin, "tokens_out": tout, "cost": float(cost), "cache_hits": hits,
            "errors": errors}


def pending_operations_by_run(session: Session) -> dict[int, int]:
    """How many operations of each run wait for a reviewer."""
    rows = session.exec(
        select(Operation.run_id, func.count()).where(Operation.status == "pending").group_by(Operation.run_id)
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
        select(func.count()).select_from(Step).where(Step.run_id == run_id, Step.status == "completed")
    ).one()
    return {"rollouts": rollouts, "rollout_errors": errors, "rewards": rewards, "summaries": summaries,
            "advantages": advantages, "operations": operations, "steps_done": steps_done}
