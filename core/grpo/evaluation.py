"""Evaluation of a library version (or the empty library) on a split with k samples per query."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from core.domain.library import experience_texts
from core.domain.metrics import is_answered, score_groups
from core.domain.selection import Selection
from core.errors import InvalidInput, NotFound
from core.grpo.agent import agent_settings, check_agent_mode
from core.grpo.rollouts import stored_rollout
from core.models.gateway import Gateway, Scope
from core.models.model_choice import check_model
from core.records.library.segments import breakdown, route_versions
from core.records.library.selection import evaluation_frozen, library_for
from core.records.library.versions import resolve_version
from core.records.notifications.events import notify_evaluation_ended
from core.records.people.roles import require_role
from core.records.review.labeling import hold_for_labels
from core.records.runs.duplicate_jobs import lock_task, refuse_second_evaluation
from core.records.tasks.lookup import get_task
from core.records.tasks.scenarios import check_task_kind, personas_by_name
from core.settings import get_settings
from storage import queries
from storage.db import session_scope
from storage.fencing import LeaseLost
from storage.statuses import EVALUATION_HAS_FIGURES, EvaluationPurpose, JobStatus
from storage.tables import AuditEvent, Evaluation, LibraryVersion, Rollout, Run, Task
from storage.tables import utcnow as now

log = logging.getLogger(__name__)
# The ledger stage of an evaluation's agent calls: a gate's or an attribution's cost shows apart from training's.
STAGES = {EvaluationPurpose.GATE: "gate", EvaluationPurpose.ATTRIBUTION: "attribution"}
STOP_CHECK_EVERY = 1.0  # seconds between two reads of whether a person stopped the evaluation (or its run)


def create_evaluation(engine: Engine, task_name: str, version_ref: str, *, split: str = "test", k: int = 1,
                      limit: int | None = None, model: str | None = None, temperature: float = 0.7,
                      route_segments: bool = False, created_by: str = "cli", library_name: str = "default",
                      ended_within_s: float | None = None) -> int:
    """Queue an evaluation of a version of `library_name` (its number, a label, `latest` or `empty`:
    core.records.library.versions.resolve_version). With `route_segments` each scenario
    of a conversation task is played with the library of its persona's segment (its production version,
    else its newest) and the version given for the rest (core/records/library/segments.py). The library's entry
    selection (and each routed library's) is frozen into the evaluation, so it measures what was chosen now.
    One identical to an evaluation already queued or running is refused (DuplicateJob names that one), and with
    `ended_within_s` one identical to an evaluation that ended that recently (a form sent again by Enter)."""
    if k < 1:
        raise InvalidInput("k must be at least 1")
    if limit is not None and limit < 1:
        raise InvalidInput("limit must be at least 1")
    with session_scope(engine) as session:
        require_role(session, created_by, "reviewer", "starting an evaluation")
        task = get_task(session, task_name)
        version = resolve_version(session, task, version_ref, library_name)
        check_agent_mode(task.name, task.agent_mode)
        check_task_kind(session, task)
        if not queries.samples(session, task.id, split, limit=1):
            raise InvalidInput(f"task {task.name!r} has no {split!r} samples")
        model = model or task.policy_model or get_settings().model
        check_model(model, engine=engine)  # before anything is queued: the worker would meet it only at the first call
        routes = None
        if route_segments:
            routes = route_versions(session, task)
            if not routes:
                raise InvalidInput(f"task {task.name!r} has no library bound to a segment; bind one first "
                                   "(`python -m core library bind`, or the Library page)")
        row = Evaluation(task_id=task.id, version_id=version.id if version else None, split=split, k=k, limit=limit,
                         model=model, temperature=temperature,
                         routes=routes, selection=evaluation_frozen(session, version, routes), created_by=created_by)
        lock_task(session, task.id)
        refuse_second_evaluation(session, row, ended_within_s=ended_within_s)
        session.add(row)
        session.flush()
        session.add(AuditEvent(actor=created_by, action="evaluation.create", object_type="evaluation",
                               object_id=row.id, after={"version": version_ref, "split": split, "k": k,
                                                        **({"routes": routes} if routes else {}),
                                                        **({"selection": row.selection} if row.selection else {})}))
        return row.id


def create_fixed_evaluation(session: Session, task: Task, *, purpose: str, split: str, sample_ids: list[int],
                            experiences: list[dict], k: int, model: str, temperature: float,
                            version_id: int | None = None, run_id: int | None = None, step_id: int | None = None,
                            left_out: str | None = None, selection: dict | None = None,
                            created_by: str = "system") -> Evaluation:
    """An evaluation the engine itself needs (a gate, an attribution variant): exactly these queries and
    these experiences, which need not be a stored version, chosen per query by the run's `selection`. It is
    executed by its run, not queued."""
    row = Evaluation(task_id=task.id, version_id=version_id, split=split, k=k, model=model, temperature=temperature, purpose=purpose,
                     sample_ids=list(sample_ids), experiences=list(experiences), run_id=run_id, step_id=step_id,
                     left_out=left_out, selection=selection, created_by=created_by, status=JobStatus.RUNNING)
    session.add(row)
    session.flush()
    return row


def run_answer_limits(run: Run | None) -> dict:
    """A run's gate measures the library with the answers the run's steps were given (its `max_tokens` and
    `max_turns`), not the agent's defaults: a run cut at 96 tokens would otherwise be gated on answers ten times
    as long. An evaluation outside a run uses the defaults."""
    settings = (run.settings or {}) if run is not None else {}
    limits = {"max_tokens": settings.get("max_tokens"), "max_turns": settings.get("max_turns")}
    return {name: int(value) for name, value in limits.items() if value}


async def run_fixed_evaluation(engine: Engine, gateway: Gateway, run_id: int, *, purpose: str, split: str,
                               sample_ids: list[int], experiences: list[dict], k: int, model: str,
                               temperature: float, version_id: int | None = None, step_id: int | None = None,
                               left_out: str | None = None, selection: dict | None = None,
                               check: Callable[[], None] | None = None) -> int:
    """A completed evaluation of `experiences` on exactly `sample_ids`, for a run's gate or measurement, each
    query shown the entries the run's `selection` chooses.

    One the run already made of the same texts, queries, k, selection (and left-out experience) is reused, or finished
    after a kill with its stored rollouts kept (an incomplete one retries its failed rollouts); otherwise a
    new one is executed. An evaluation that ends incomplete is returned: the paired comparison leaves out
    the queries without k answers and refuses to decide when too many are missing. Raises when it cannot
    run at all, so the run records why. `check` (the run's: it raises when the run was paused or cancelled)
    is called every STOP_CHECK_EVERY seconds while the evaluation runs; what it raises ends the evaluation
    at once and goes to the run."""
    with session_scope(engine) as session:
        found = next((ev for ev in session.exec(select(Evaluation).where(
            Evaluation.run_id == run_id, Evaluation.purpose == purpose).order_by(Evaluation.id))
            if ev.k == k and ev.sample_ids == list(sample_ids) and ev.left_out == left_out
            and Selection.from_dict(ev.selection).shows_same(Selection.from_dict(selection))
            and experience_texts(ev.experiences) == experience_texts(experiences)), None)
        if found is None:
            found = create_fixed_evaluation(session, session.get(Task, session.get(Run, run_id).task_id),
                                            purpose=purpose, split=split, sample_ids=sample_ids,
                                            experiences=experiences, k=k, model=model, temperature=temperature,
                                            version_id=version_id, run_id=run_id, step_id=step_id,
                                            left_out=left_out, selection=selection, created_by=purpose)
        evaluation_id, done = found.id, found.status == JobStatus.COMPLETED
    if not done:
        ev = await execute_evaluation_async(engine, evaluation_id, gateway=gateway, check=check)
        if ev.status not in EVALUATION_HAS_FIGURES:
            raise RuntimeError(f"{purpose} evaluation {evaluation_id} ended {ev.status}: {ev.error or ''}")
    return evaluation_id


class _Progress:
    """Rollouts done out of the total, written to the evaluation row at most twice a second."""

    def __init__(self, engine: Engine, evaluation_id: int, total: int):
        self.engine, self.evaluation_id, self.total, self.done, self.last = engine, evaluation_id, total, 0, 0.0

    def advance(self) -> None:
        self.done += 1
        if time.monotonic() - self.last < 0.5 and self.done < self.total:
            return
        self.last = time.monotonic()
        with session_scope(self.engine) as session:
            ev = session.get(Evaluation, self.evaluation_id)
            ev.progress, ev.heartbeat_at = {"rollouts_done": self.done, "rollouts_total": self.total}, now()
            session.add(ev)


def execute_evaluation(engine: Engine, evaluation_id: int, *, gateway: Gateway | None = None,
                       concurrency: int | None = None) -> Evaluation:
    return asyncio.run(execute_evaluation_async(engine, evaluation_id, gateway=gateway, concurrency=concurrency))


class _Cancelled(Exception):  # noqa: N818  (a request, not an error)
    """A person cancelled the evaluation while it ran (core.jobs.run_control.cancel_evaluation)."""


class _Stopped(Exception):  # noqa: N818
    """The evaluation's stop check raised `cause`: its rollouts in flight were abandoned."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def cancel_check(engine: Engine, evaluation_id: int) -> Callable[[], None]:
    """A stop check for an evaluation a person asked for: raises once its status reads `cancelled`."""

    def check() -> None:
        with Session(engine) as session:
            status = session.exec(select(Evaluation.status).where(Evaluation.id == evaluation_id)).one()
        if status == JobStatus.CANCELLED:
            raise _Cancelled(f"evaluation {evaluation_id} was cancelled")

    return check


async def until_stopped(work: Awaitable, check: Callable[[], None] | None, every: float | None = None):
    """`work`'s result, calling `check` every `every` seconds (STOP_CHECK_EVERY) while it runs. When `check`
    raises, the work is cancelled at once (model calls in flight are abandoned; every answered rollout is
    already stored) and _Stopped(what it raised) is raised."""
    task = asyncio.ensure_future(work)
    if check is None:
        return await task
    try:
        while True:
            done, _waiting = await asyncio.wait({task}, timeout=every or STOP_CHECK_EVERY)
            try:
                check()  # once more when the work is done: a stop asked during its last second counts
            except BaseException as exc:  # noqa: BLE001  (whatever stops it is handed on as the cause)
                raise _Stopped(exc) from exc
            if done:
                return task.result()
    except BaseException:
        task.cancel()
        await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: an error of an abandoned rollout must not warn at exit
        raise


def _record_stop(engine: Engine, evaluation_id: int, total: int) -> None:
    """What a stopped evaluation shows: how many rollouts are stored of the total, and for one that its run
    executes, the run's status (paused or cancelled) instead of `running`."""
    with session_scope(engine) as session:
        ev = session.get(Evaluation, evaluation_id)
        run = session.get(Run, ev.run_id) if ev.run_id else None
        if run is not None and run.status in (JobStatus.PAUSED, JobStatus.CANCELLED):
            ev.status = run.status
        ev.progress = {"rollouts_done": len(queries.evaluation_rollouts(session, evaluation_id)),
                       "rollouts_total": total}
        session.add(ev)


async def execute_evaluation_async(engine: Engine, evaluation_id: int, *, gateway: Gateway | None = None,
                                   concurrency: int | None = None,
                                   check: Callable[[], None] | None = None) -> Evaluation:
    """Sample k answers per query, score them, store Mean@k / Pass@k; stored rollouts are reused. Each query is
    shown the entries the evaluation's frozen selection chooses (core.grpo.rollouts.stored_rollout).

    Every STOP_CHECK_EVERY seconds `check` is called (by default, for an evaluation a person asked for: whether
    it was cancelled); when it raises, the rollouts in flight are abandoned. A cancelled evaluation keeps its
    answered rollouts and its status; whatever else `check` raised (a run's pause or cancel) is raised on."""
    with session_scope(engine) as session:
        ev = session.get(Evaluation, evaluation_id)
        if ev is None:
            raise NotFound(f"no evaluation {evaluation_id}")
        cancelled = ev.status == JobStatus.CANCELLED  # between its claim and here
        task = session.get(Task, ev.task_id)
        version = session.get(LibraryVersion, ev.version_id) if ev.version_id else None
        limits = run_answer_limits(session.get(Run, ev.run_id) if ev.run_id else None)
        samples = (queries.samples_by_ids(session, ev.sample_ids) if ev.sample_ids is not None
                   else queries.samples(session, task.id, ev.split, limit=ev.limit))
        if not cancelled:
            ev.status, ev.error, ev.heartbeat_at = JobStatus.RUNNING, None, now()
            ev.started_at = ev.started_at or now()
            ev.progress = {"rollouts_done": 0, "rollouts_total": len(samples) * ev.k}
            session.add(ev)
    if cancelled:
        with Session(engine) as session:
            return session.get(Evaluation, evaluation_id)
    if check is None and ev.run_id is None:
        check = cancel_check(engine, evaluation_id)
    gateway = gateway or Gateway(engine, concurrency=concurrency or get_settings().concurrency)
    agent = agent_settings(task, model=ev.model, temperature=ev.temperature, **limits)
    experiences = ev.experiences if ev.experiences is not None else version.experiences if version else []
    with Session(engine) as session:
        personas = personas_by_name(session, task) if ev.routes else {}
        routed = {vid: session.get(LibraryVersion, vid).experiences for vid in set((ev.routes or {}).values())}
    progress = _Progress(engine, evaluation_id, total=len(samples) * ev.k)
    scope = Scope(run_id=ev.run_id, evaluation_id=evaluation_id)
    stage = STAGES.get(ev.purpose, "rollout")

    slots = asyncio.Semaphore(max(1, gateway.concurrency))  # a bounded pool, as a run's (core.grpo.training)

    async def one(sample, g: int) -> None:
        entries, selection = library_for(sample, ev.routes, personas, routed, experiences, ev.selection)
        await stored_rollout(engine, gateway, agent, task, sample, group_index=g, sample_index=g,
                             experiences=entries, selection=selection, scope=scope, evaluation_id=evaluation_id, stage=stage,
                             people=ev.purpose == EvaluationPurpose.EVALUATION, pool=slots)
        progress.advance()

    try:
        await until_stopped(asyncio.gather(*(one(sample, g) for sample in samples for g in range(ev.k))), check)
        if hold_for_labels(engine, evaluation_id=evaluation_id):
            with Session(engine) as session:
                return session.get(Evaluation, evaluation_id)
        with session_scope(engine) as session:
            rollouts = queries.evaluation_rollouts(session, evaluation_id)
            metrics = evaluation_metrics(rollouts)
            metrics |= breakdown(session, task, [r for r in rollouts if is_answered(r)], {s.id: s for s in samples})
            ev = session.get(Evaluation, evaluation_id)
            ev.progress = {"rollouts_done": len(rollouts), "rollouts_total": progress.total}
            if ev.status != JobStatus.CANCELLED:  # cancelled after its last answer came: it stays cancelled
                ev.n, ev.mean_at_k, ev.pass_at_k, ev.metrics = (metrics["n"], metrics["mean_at_k"], metrics["pass_at_k"],
                                                                metrics)
                ev.cost = queries.call_totals(session, evaluation_id=evaluation_id)["cost"]
                ev.status, ev.finished_at = (JobStatus.INCOMPLETE if metrics["errors"] else JobStatus.COMPLETED), now()
                ev.error = (incomplete_reason(metrics, evaluation_id, unreachable=gateway.unreachable())
                            if metrics["errors"] else None)
                notify_evaluation_ended(session, ev)
            session.add(ev)
    except _Stopped as stopped:
        if isinstance(stopped.cause, LeaseLost):
            raise stopped.cause from None
        _record_stop(engine, evaluation_id, progress.total)
        if not isinstance(stopped.cause, _Cancelled):
            raise stopped.cause from None
        log.info("evaluation %s cancelled; its answered rollouts are kept", evaluation_id)
    except Exception as exc:  # noqa: BLE001  (recorded on the row; the caller shows it)
        log.exception("evaluation %s failed", evaluation_id)
        with session_scope(engine) as session:
            ev = session.get(Evaluation, evaluation_id)
            ev.status, ev.error, ev.finished_at = JobStatus.FAILED, f"{type(exc).__name__}: {exc}", now()
            session.add(ev)
            notify_evaluation_ended(session, ev)
    with Session(engine) as session:
        return session.get(Evaluation, evaluation_id)


def evaluation_metrics(rollouts: list[Rollout]) -> dict:
    """Mean@k and Pass@k over the answered rollouts only, with the errors counted beside them: `errors`
    (rollouts without a reward to count), `answered`, `rollouts`, and `unanswered_queries` (queries none of
    whose samples was answered, left out of n)."""
    by_query: dict[int, list[float]] = {}
    for r in rollouts:
        by_query.setdefault(r.sample_id, [])  # every query, so one without an answer is counted apart
        if is_answered(r):
            by_query[r.sample_id].append(r.reward)
    metrics = score_groups({q: rewards for q, rewards in by_query.items() if rewards})
    answered = sum(len(rewards) for rewards in by_query.values())
    metrics |= {"errors": len(rollouts) - answered, "answered": answered, "rollouts": len(rollouts),
                "unanswered_queries": sum(1 for rewards in by_query.values() if not rewards)}
    return metrics


def incomplete_reason(metrics: dict, evaluation_id: int | str = "ID", *, unreachable: str | None = None) -> str:
    """Why an evaluation is incomplete, and what to do, in one sentence with the command for this evaluation.
    `unreachable` is the gateway's finding that nothing answered at a model's address (Gateway.unreachable):
    then that is the reason, said first, and the evaluation stopped asking there at once instead of retrying."""
    retry = (f"Retry the failed rollouts (Evaluate page, or `python -m core eval --retry {evaluation_id}`); answered "
             "ones are not paid again.")
    if unreachable:
        return (f"nothing answered at the model's address, so no more calls were sent there: {unreachable}. "
                f"{metrics['errors']} of {metrics['rollouts']} rollouts have no reward; Mean@k and Pass@k count the "
                f"{metrics['answered']} answered ones. Start the server (the Models page's Test says when it "
                f"answers), then: {retry}")
    return (f"{metrics['errors']} of {metrics['rollouts']} rollouts have no reward (a model call or the scoring "
            f"failed); Mean@k and Pass@k count the {metrics['answered']} answered ones. {retry}")
