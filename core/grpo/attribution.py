"""Measure experiences: what each experience of a version adds, by leaving it out (leave-one-out attribution).

A measurement is a run of kind `attribute` on one version. The worker evaluates the version and, for each of
its experiences, the version without that one (a *variant*), all on the same queries with k samples each and
common random numbers, so the left-out experience is the only difference between the full version and a
variant. Each experience's *effect* is then the paired difference of the full version minus the variant
(core.records.evaluation.comparison: the per-query mean rewards, a seeded bootstrap 95% interval, a sign test), and its verdict:
it **helps** when the interval lies above 0, **hurts** when it lies below 0, and is **unclear** otherwise.

Which queries: the task's `validation` split when it has one, else its `test` split (the queries are frozen
into the run's settings, so a resumed run scores the same ones). Measuring on `test` is a fallback: removing
experiences because of a test measurement makes later test scores of the new version look better than they
are, which the estimate and the CLI say. The variants' agent calls go in the ledger under the stage
`attribution`, people are never asked for labels, and a stopped measurement resumes with every finished
variant (and every stored rollout of an unfinished one) reused. `remove_hurting` deletes the experiences that
hurt through the manual edit path, as a new audited version.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum

from pydantic import Field
from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from core.domain.library import ProposedOp
from core.domain.rewards import METHODS
from core.errors import Conflict, InvalidInput, NotFound
from core.grpo.evaluation import run_fixed_evaluation
from core.models.gateway import Gateway
from core.records.evaluation.comparison import Paired, compare_evaluations
from core.records.library.selection import frozen
from core.records.library.versions import edit_library, resolve_version
from core.records.people.roles import require_role
from core.records.runs.settings import ApiBase, Budget, JobSettings, Temperature, default_concurrency
from core.records.tasks.lookup import get_task
from core.settings import get_settings
from storage import queries
from storage.db import session_scope
from storage.statuses import UNFINISHED, EvaluationPurpose, JobStatus, OpKind, RunKind
from storage.tables import (
    AuditEvent,
    Evaluation,
    Library,
    LibraryVersion,
    LLMCall,
    Rollout,
    Run,
    Sample,
    Task,
)

VALIDATION_SPLIT = "validation"
FALLBACK_SPLIT = "test"
FULL = "full version"  # how progress names the evaluation of the whole version (no experience left out)


class Verdict(StrEnum):
    """What an experience does, from its effect's 95% interval."""

    HELPS = "helps"
    HURTS = "hurts"
    UNCLEAR = "unclear"


class AttributionSettings(JobSettings):
    """A measurement's settings, frozen into Run.settings; the run machinery reads the same dict through
    RunSettings (policy model, temperature, concurrency, seed, budget, api base), which ignores the rest."""

    split: str | None = Field(None, description="the split the queries come from (default: validation, else test)")
    k: int = Field(2, ge=1, description="samples per query for every variant")
    limit: int | None = Field(None, ge=1, description="use only the first N queries of the split")
    sample_ids: list[int] = Field(default_factory=list)
    policy_model: str = ""
    temperature: Temperature = 0.7
    concurrency: int = Field(default_factory=default_concurrency, ge=1,
                             description="calls in flight per model (TFGRPO_CONCURRENCY)")
    seed: int = 0
    budget_usd: Budget = Field(None, description="pause the measurement when its cost reaches this many USD")
    api_base: ApiBase = None

    @classmethod
    def build(cls, **values) -> AttributionSettings:
        """Like JobSettings.build; an option left out (None) takes its default."""
        return super().build(**{name: value for name, value in values.items() if value is not None})


@dataclass(frozen=True)
class Effect:
    """One experience's effect: mean reward of the version minus that of the version without it, per query."""

    experience_id: str
    text: str
    delta: float
    ci_low: float | None  # None when fewer than two queries were compared (no interval)
    ci_high: float | None
    p_value: float
    n: int  # queries compared
    k: int  # samples per query
    verdict: str  # a Verdict
    mean_with: float
    mean_without: float
    run_id: int
    version_id: int  # the version it was measured in
    version_number: int
    split: str
    evaluation_with: int
    evaluation_without: int
    # How many of the whole version's rollouts were shown this entry, of how many: under a `top_k` selection
    # an entry shown to few queries can only change those (None: measured before rollouts recorded it).
    shown: int | None = None
    rollouts: int | None = None

    @property
    def interval(self) -> str:
        if self.ci_low is None or self.ci_high is None:
            return "–"
        return f"[{self.ci_low:+.3f}, {self.ci_high:+.3f}]"

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def shown_line(self) -> str:
        """"12 of 40 rollouts", or "–" when the measurement predates recording it."""
        return "–" if self.shown is None else f"{self.shown} of {self.rollouts} rollouts"


# ---------------------------------------------------------------------------------------------- planning


def _finite(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def verdict_of(stats: Paired) -> Verdict:
    if stats.n >= 2 and stats.ci_low > 0:
        return Verdict.HELPS
    if stats.n >= 2 and stats.ci_high < 0:
        return Verdict.HURTS
    return Verdict.UNCLEAR


def choose_split(session: Session, task: Task, split: str | None) -> tuple[str, str]:
    """The split to measure on and a note for people: the given one, else `validation` when the task has
    one, else `test` (with the caveat that decisions taken on it make later test scores optimistic)."""
    if split:
        return split, ""
    if queries.samples(session, task.id, VALIDATION_SPLIT, limit=1):
        return VALIDATION_SPLIT, ""
    return FALLBACK_SPLIT, (f"task {task.name!r} has no validation split, so this measures on its test split: "
                            "removing experiences because of it makes later test scores of the new version "
                            "look better than they are (add a validation split to avoid that)")


@dataclass
class _Plan:
    task: Task
    version: LibraryVersion
    split: str
    note: str
    sample_ids: list[int]


def _plan(session: Session, task_name: str, version_ref: str, split: str | None, limit: int | None,
          library_name: str) -> _Plan:
    """What a measurement of this version would evaluate, or an error saying why it cannot be measured."""
    task = get_task(session, task_name)
    version = resolve_version(session, task, version_ref, library_name)
    if version is None:
        raise InvalidInput("the empty library has no experiences to measure; choose a version that has some")
    if not version.experiences:
        raise InvalidInput(f"version #{version.number} has no experiences to measure")
    method = METHODS.get(task.reward_method)
    if method is not None and method.uses_people and not method.uses_judge:
        raise InvalidInput(f"task {task.name!r} is scored by people only; a measurement cannot wait for labels "
                           "(evaluate versions on the Evaluate page instead)")
    split, note = choose_split(session, task, split)
    samples = queries.samples(session, task.id, split, limit=limit)
    if not samples:
        raise InvalidInput(f"task {task.name!r} has no {split!r} samples to measure on")
    return _Plan(task, version, split, note, [s.id for s in samples])


def _average_cost(session: Session, task: Task) -> tuple[float | None, float, str]:
    """(agent cost per rollout, judge cost per judged rollout, where the figures come from); the agent's is
    None when nothing says what this model costs (no paid rollout of the task yet)."""
    method = METHODS.get(task.reward_method)
    judge = 0.0
    if method is not None and method.uses_judge and not task.judge_model.startswith("local/"):
        judge = float(session.exec(select(func.coalesce(func.avg(LLMCall.cost), 0.0))
                                   .where(LLMCall.stage == "judge", LLMCall.model == task.judge_model,
                                          LLMCall.cost > 0)).one())
    if task.policy_model.startswith("local/"):
        return 0.0, judge, "the embedded model costs nothing"
    average, count = session.exec(
        select(func.avg(Rollout.cost), func.count(Rollout.id)).join(Sample, Sample.id == Rollout.sample_id)
        .where(Sample.task_id == task.id, Rollout.cost > 0)).one()
    if not count:
        return None, judge, "unknown: no rollout of this task has cost anything yet"
    return float(average), judge, f"the average of this task's {count} paid rollouts"


def estimate(engine: Engine, task_name: str, version_ref: str, *, split: str | None = None, k: int = 2,
             limit: int | None = None, library_name: str = "default") -> dict:
    """What measuring this version takes, shown before it starts: queries, variants (experiences + 1), agent
    calls = variants x queries x k (and as many judge calls for a judged task), and the estimated cost."""
    settings = AttributionSettings.build(split=split, k=k, limit=limit)
    with Session(engine) as session:
        plan = _plan(session, task_name, version_ref, settings.split, settings.limit, library_name)
        per_rollout, per_judge, basis = _average_cost(session, plan.task)
        method = METHODS.get(plan.task.reward_method)
    variants = len(plan.version.experiences) + 1
    calls = variants * len(plan.sample_ids) * settings.k
    judge_calls = calls if method is not None and method.uses_judge else 0
    cost = None if per_rollout is None else calls * per_rollout + judge_calls * per_judge
    return {"task": plan.task.name, "version_id": plan.version.id, "version_number": plan.version.number,
            "experiences": variants - 1, "variants": variants, "split": plan.split, "queries": len(plan.sample_ids),
            "k": settings.k, "agent_calls": calls, "judge_calls": judge_calls, "estimated_cost": cost,
            "cost_basis": basis, "agent_mode": plan.task.agent_mode, "note": plan.note}


def estimate_line(est: dict) -> str:
    """The estimate in one sentence, as the Library page and the CLI say it."""
    cost = "cost unknown" if est["estimated_cost"] is None else f"about ${est['estimated_cost']:.2f}"
    judge = f" and {est['judge_calls']} judge calls" if est["judge_calls"] else ""
    turns = " (at least: the python mode may take several turns per answer)" if est["agent_mode"] == "python" else ""
    return (f"version #{est['version_number']}: {est['variants']} variants (the version and one without each of its "
            f"{est['experiences']} experiences) x {est['queries']} {est['split']} queries x k={est['k']} = "
            f"{est['agent_calls']} agent calls{turns}{judge}; {cost} ({est['cost_basis']})")


def create_attribution(engine: Engine, task_name: str, version_ref: str, *, split: str | None = None, k: int = 2,
                       limit: int | None = None, library_name: str = "default", created_by: str = "cli",
                       concurrency: int | None = None, budget_usd: float | None = None) -> int:
    """Queue a measurement of a version (its number in the library, a label or `latest`) as a run of kind `attribute`; a worker (or
    `python -m core attribute`) executes it. Refuses the empty library, a version without experiences, a split
    without samples, a task scored by people only, and a version already being measured."""
    settings = AttributionSettings.build(split=split, k=k, limit=limit, concurrency=concurrency, budget_usd=budget_usd)
    with session_scope(engine) as session:
        require_role(session, created_by, "reviewer", "measuring experiences")
        plan = _plan(session, task_name, version_ref, settings.split, settings.limit, library_name)
        busy = session.exec(select(Run).where(Run.kind == RunKind.ATTRIBUTE, Run.start_version_id == plan.version.id,
                                              col(Run.status).in_(UNFINISHED))).first()
        if busy is not None:
            raise Conflict(f"version #{plan.version.number} is already being measured by run {busy.id} ({busy.status}); "
                           "let it finish or cancel it first")
        settings.split, settings.sample_ids = plan.split, plan.sample_ids
        settings.policy_model = plan.task.policy_model or get_settings().model
        # Every variant chooses its entries per query as the library does now; leaving an entry out of a
        # `top_k` library lets the next most similar one in, which is what removing it would do.
        settings.selection = frozen(session.get(Library, plan.version.library_id))
        variants = len(plan.version.experiences) + 1
        run = Run(task_id=plan.task.id, library_id=plan.version.library_id, kind=RunKind.ATTRIBUTE,
                  start_version_id=plan.version.id, current_version_id=plan.version.id,
                  settings=settings.model_dump(), created_by=created_by,
                  progress={"variants_done": 0, "variants_total": variants, "split": plan.split,
                            "queries": len(plan.sample_ids), "k": settings.k})
        session.add(run)
        session.flush()
        summary = {name: value for name, value in settings.model_dump().items() if name != "sample_ids"}
        session.add(AuditEvent(actor=created_by, action="run.create", object_type="run", object_id=run.id,
                               after={"task": plan.task.name, "kind": RunKind.ATTRIBUTE, "version_id": plan.version.id,
                                      "queries": len(plan.sample_ids), "settings": summary}))
        return run.id


# ---------------------------------------------------------------------------------------------- measuring


def _variants(experiences: list[dict]) -> list[tuple[str | None, list[dict]]]:
    """(experience left out, the experiences evaluated): the whole version first, then one without each."""
    return [(None, list(experiences))] + [(exp["id"], [e for e in experiences if e["id"] != exp["id"]])
                                         for exp in experiences]


def _run_evaluations(session: Session, run_id: int) -> list[Evaluation]:
    return list(session.exec(select(Evaluation).where(Evaluation.run_id == run_id,
                                                      Evaluation.purpose == EvaluationPurpose.ATTRIBUTION)
                             .order_by(Evaluation.id)))


async def evaluate_variant(engine: Engine, gateway: Gateway, run_id: int, left_out: str | None,
                           experiences: list[dict], check: Callable[[], None] | None = None) -> int:
    """A completed evaluation of one variant on the run's queries (reused or finished when the run made it);
    `check` (the run's stop check) is called every second while it runs, so a pause or a cancel stops the
    variant in the middle."""
    with Session(engine) as session:
        run = session.get(Run, run_id)
        settings = AttributionSettings.from_dict(run.settings)
        version_id = run.start_version_id if left_out is None else None
    return await run_fixed_evaluation(engine, gateway, run_id, purpose=EvaluationPurpose.ATTRIBUTION,
                                      split=settings.split, sample_ids=settings.sample_ids, experiences=experiences,
                                      k=settings.k, model=settings.policy_model, temperature=settings.temperature,
                                      version_id=version_id, left_out=left_out, selection=settings.selection,
                                      check=check)


def _set_progress(engine: Engine, run_id: int, **values) -> None:
    with session_scope(engine) as session:
        run = session.get(Run, run_id)
        run.progress = {**run.progress, **values}
        session.add(run)


async def measure_experiences(engine: Engine, run_id: int, gateway: Gateway, check: Callable[[], None]) -> None:
    """Evaluate the run's version and each leave-one-out variant on the same queries, then store every
    experience's effect on the run (progress["effects"]). `check` heartbeats and stops the run when a person
    paused or cancelled it or the budget is spent; it is called before each variant, after it, and every second
    while a variant's rollouts run (a cancel stops the measurement within seconds, core.jobs.run_control)."""
    with Session(engine) as session:
        run = session.get(Run, run_id)
        version = session.get(LibraryVersion, run.start_version_id)
        experiences = [dict(exp) for exp in version.experiences]
    variants = _variants(experiences)
    ids: dict[str | None, int] = {}
    check()
    for done, (left_out, chosen) in enumerate(variants):
        _set_progress(engine, run_id, variants_done=done, variants_total=len(variants), current=left_out or FULL)
        ids[left_out] = await evaluate_variant(engine, gateway, run_id, left_out, chosen, check)
        _set_progress(engine, run_id, variants_done=done + 1)
        check()
    with Session(engine) as session:
        seed = AttributionSettings.from_dict(session.get(Run, run_id).settings).seed
    effects = [_effect_figures(engine, exp, ids[None], ids[exp["id"]], seed) for exp in experiences]
    _set_progress(engine, run_id, current=None, effects=effects,
                  counts={v: sum(1 for e in effects if e["verdict"] == v) for v in Verdict})


def _effect_figures(engine: Engine, exp: dict, with_id: int, without_id: int, seed: int) -> dict:
    """The stored figures of one experience's effect (JSON-safe: no infinite interval), with how often the whole
    version's rollouts were shown it."""
    stats = compare_evaluations(engine, without_id, with_id, seed=seed).stats
    shown, rollouts = times_shown(engine, with_id, exp["id"])
    return {"experience_id": exp["id"], "text": exp["text"], "delta": stats.delta, "ci_low": _finite(stats.ci_low),
            "ci_high": _finite(stats.ci_high), "p_value": stats.p_value, "n": stats.n,
            "mean_with": stats.mean_b, "mean_without": stats.mean_a, "verdict": verdict_of(stats),
            "evaluation_with": with_id, "evaluation_without": without_id, "shown": shown, "rollouts": rollouts}


def times_shown(engine: Engine, evaluation_id: int, experience_id: str) -> tuple[int | None, int]:
    """(rollouts of the evaluation whose agent was shown the entry, rollouts); None when some rollout did not
    record what it was shown (stored before selections existed)."""
    with Session(engine) as session:
        rows = queries.evaluation_rollouts(session, evaluation_id)
    if any(r.shown_ids is None for r in rows):
        return None, len(rows)
    return sum(1 for r in rows if experience_id in r.shown_ids), len(rows)


# ---------------------------------------------------------------------------------------------- reading


def _effects_of(session: Session, run: Run) -> dict[str, Effect]:
    version = session.get(LibraryVersion, run.start_version_id)
    settings = AttributionSettings.from_dict(run.settings)
    found = {}
    for figures in (run.progress or {}).get("effects") or []:
        found[figures["experience_id"]] = Effect(
            experience_id=figures["experience_id"], text=figures["text"], delta=figures["delta"],
            ci_low=figures["ci_low"], ci_high=figures["ci_high"], p_value=figures["p_value"], n=figures["n"],
            k=settings.k, verdict=Verdict(figures["verdict"]), mean_with=figures["mean_with"],
            mean_without=figures["mean_without"], run_id=run.id, version_id=version.id, version_number=version.number,
            split=settings.split or "", evaluation_with=figures["evaluation_with"],
            evaluation_without=figures["evaluation_without"], shown=figures.get("shown"),
            rollouts=figures.get("rollouts"))
    return found


def _completed_attributions(session: Session, *, version_id: int | None = None,
                            library_id: int | None = None) -> list[Run]:
    """Completed measurements, newest first, of one version or of any version of a library."""
    query = select(Run).where(Run.kind == RunKind.ATTRIBUTE, Run.status == JobStatus.COMPLETED)
    if version_id is not None:
        query = query.where(Run.start_version_id == version_id)
    if library_id is not None:
        query = query.where(Run.library_id == library_id)
    return list(session.exec(query.order_by(col(Run.id).desc())))


def run_effects(engine: Engine, run_id: int) -> dict[str, Effect]:
    """The effects one measurement found, by experience id, in the version's order (empty until it completes)."""
    with Session(engine) as session:
        run = session.get(Run, run_id)
        if run is None or run.kind != RunKind.ATTRIBUTE:
            raise NotFound(f"no measurement run {run_id}")
        return _effects_of(session, run)


def experience_effects(engine: Engine, version_id: int) -> dict[str, Effect]:
    """Each experience's effect from the newest completed measurement of this version (empty if none)."""
    with Session(engine) as session:
        runs = _completed_attributions(session, version_id=version_id)
        return _effects_of(session, runs[0]) if runs else {}


def effects_for_library(engine: Engine, library_id: int) -> dict[str, Effect]:
    """The newest measured effect of every experience id in any version of a library. Ids are stable across
    versions (a MODIFY keeps the id), so an effect may have been measured on another text: compare
    `Effect.text` with the current one, and `Effect.version_number` says where it was measured."""
    found: dict[str, Effect] = {}
    with Session(engine) as session:
        for run in _completed_attributions(session, library_id=library_id):
            for exp_id, effect in _effects_of(session, run).items():
                found.setdefault(exp_id, effect)
    return found


def attribution_runs(engine: Engine, version_id: int) -> list[Run]:
    """Every measurement of a version, newest first, whatever its status (for progress and resume)."""
    with Session(engine) as session:
        return list(session.exec(select(Run).where(Run.kind == RunKind.ATTRIBUTE, Run.start_version_id == version_id)
                                 .order_by(col(Run.id).desc())))


def measurement_progress(engine: Engine, run_id: int) -> dict:
    """Where a measurement is: variants done of the total, the variant being evaluated (`full version` or the
    experience left out) with its rollouts done, and the run's calls and cost so far."""
    with Session(engine) as session:
        run = session.get(Run, run_id)
        if run is None:
            raise NotFound(f"no run {run_id}")
        progress = dict(run.progress or {})
        current = progress.get("current")
        rollouts = {}
        if current:
            left_out = None if current == FULL else current
            for ev in reversed(_run_evaluations(session, run_id)):
                if ev.left_out == left_out:
                    rollouts = ev.progress or {}
                    break
        totals = queries.call_totals(session, run_id=run_id)
    return {"variants_done": progress.get("variants_done", 0), "variants_total": progress.get("variants_total", 0),
            "current": current, "rollouts_done": rollouts.get("rollouts_done", 0),
            "rollouts_total": rollouts.get("rollouts_total", 0), "calls": totals["calls"],
            "cache_hits": totals["cache_hits"], "cost": totals["cost"], "split": progress.get("split"),
            "queries": progress.get("queries"), "k": progress.get("k")}


# ---------------------------------------------------------------------------------------------- acting


def remove_hurting(engine: Engine, task_name: str, version_id: int, actor: str, *,
                   library_name: str = "default") -> LibraryVersion:
    """A new version without the experiences the newest measurement of `version_id` found to hurt, made
    through the manual edit path (validated, audited) with a note naming the measurement. The measured version
    must still be the latest of its library: a measurement says nothing about a library that changed since."""
    effects = experience_effects(engine, version_id)
    with Session(engine) as session:
        version = session.get(LibraryVersion, version_id)
        if version is None:
            raise NotFound(f"no version {version_id}")
        library = session.get(Library, version.library_id)
        if library.name != library_name:
            raise InvalidInput(f"version #{version.number} is in library {library.name!r}, not {library_name!r}")
        latest = queries.latest_version(session, library.id)
    if not effects:
        raise InvalidInput(f"version #{version.number} has not been measured yet; measure its experiences first")
    hurting = [e.experience_id for e in effects.values() if e.verdict == Verdict.HURTS]
    if not hurting:
        raise InvalidInput(f"no experience of version #{version.number} hurts (measured by run "
                           f"{next(iter(effects.values())).run_id})")
    if latest.id != version.id:
        raise Conflict(f"version #{version.number} is no longer the latest (#{latest.number} is); its measurement "
                       "describes the library as it was, so measure the latest version or delete by hand")
    run_id = next(iter(effects.values())).run_id
    note = (f"removed the experiences that hurt ({', '.join(hurting)}) as measured by run {run_id} "
            f"on version #{version.number}")
    new = edit_library(engine, task_name, [ProposedOp(OpKind.DELETE, hurting)], actor, library_name=library_name,
                       note=note, base_version_id=version.id)
    with session_scope(engine) as session:
        session.add(AuditEvent(actor=actor, action="attribution.remove_hurting", object_type="run", object_id=run_id,
                               before={"version_id": version.id}, after={"version_id": new.id, "removed": hurting}))
    return new
