"""How long a run still takes, what a run will cost before it starts, where a queued job stands in line,
and a run's state in words.

Every figure comes from the ledger (storage.tables.LLMCall): the mean latency and tokens of the calls each
stage really made (rollout, judge, summary, advantage, update, gate), of this run first, else of earlier
calls of the same model, else an assumed default speed (DEFAULT_SPEEDS), times the calls still to come per
stage, which follow from the run's settings and its progress counters. The arithmetic is in pure functions
(`planned_calls`, `estimate_left`, `estimate_run`); the functions that take a session only gather their
inputs.

Calls in flight at once: a call's recorded latency is its wall time from request to reply, including its
wait for a slot (the embedded model serves one request at a time, so beside three others a call's latency
is about four times its own work). With `width` calls of a stage in flight, the stage therefore advances
`width` calls per mean latency: seconds = calls x latency / width, with width = min(concurrency, calls the
stage can have ready at once) and 1 for the learner's update, which runs alone. This is exact when the
measured calls ran about as many at a time as the calls to come, which holds for a run's own calls; calls
of earlier runs with another concurrency make the figure rougher. An assumed default speed is a call's own
work: for the embedded model it is not divided (its calls run one after another), for a hosted model it is.

Cost: the tokens of each stage times its model's price per token in litellm's price map (the local copy that
ships with litellm, LITELLM_LOCAL_MODEL_COST_MAP; the gateway prices each call the same way), summed per role
(policy, judge, learner); the embedded models are free, and a model litellm has no price for is said so. The
estimate says it only when a hosted model takes part, so a person choosing a hosted learner sees its cost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlmodel import Session

from core.domain.held_out import VALIDATION_SPLIT, held_out_size
from core.domain.rewards import METHODS, parsed_settings
from core.errors import InvalidInput
from core.models.prices import price_per_token
from core.records.runs.settings import RunSettings, run_settings
from core.records.runs.workers import alive_workers, job_health
from core.settings import get_settings
from storage import queries
from storage.statuses import GateRule, JobStatus, RunKind, StepStatus
from storage.tables import Evaluation, Run, Step, Task

STAGES = ("rollout", "judge", "summary", "advantage", "example", "update", "gate", "direct")
POLICY_STAGES = ("rollout", "gate")  # the agent's own calls; the judge has its own model, the rest are the learner's
MIN_MEASURED = 3  # fewer calls of a stage than this are too few to say its speed
DEFAULT_MIXED = 0.5  # the share of groups whose rewards differ (and so are summarised), until the run shows its own
PYTHON_TURNS = 1.05  # model calls per answer in python mode: measured 21 calls for 20 answers (bench/agent_modes.py, embedded model)


@dataclass(frozen=True)
class Speed:
    """One stage's calls: mean latency (seconds, request to reply) and tokens in and out, with where they
    come from: `calls` measured calls (`source` "run" or "earlier"), or 0 for an assumed default."""

    latency_s: float
    tokens_in: float
    tokens_out: float
    model: str = ""
    calls: int = 0
    source: str = "default"
    serial: bool = False  # an assumed speed of a model that serves one request at a time

    def seconds(self, width: int) -> float:
        """Wall seconds the stage takes per call with `width` calls in flight (see the module docstring)."""
        return self.latency_s if self.serial else self.latency_s / max(1, width)


# Assumed tokens in and out of one call of each stage, for a model with no measured calls yet (the demo
# tasks on the embedded model are near these; a real task's prompts may be longer).
DEFAULT_TOKENS = {"rollout": (300, 200), "gate": (300, 200), "judge": (500, 60), "summary": (700, 150),
                  "advantage": (1000, 250), "example": (900, 250), "update": (1200, 350), "direct": (1500, 400)}
# Assumed speed, tokens per second (prompt read, reply written): the embedded Qwen2.5-Coder-0.5B measured
# about 18 tokens/s writing on 2 cores (DESIGN.md); a hosted model is taken as much faster, plus overhead.
DEFAULT_SPEEDS = {"local": (150.0, 18.0, 0.0), "hosted": (2000.0, 60.0, 0.5)}


@dataclass(frozen=True)
class Shape:
    """What a run has to do: its steps, its groups (training queries x epochs) and its validation queries."""

    steps: int
    groups: int
    validation: int


@dataclass(frozen=True)
class Estimate:
    """Seconds of model time, calls and tokens, and in words what the figures rest on."""

    seconds: float
    basis: str
    calls: int = 0
    tokens: int = 0
    by_stage: dict[str, float] = field(default_factory=dict)
    # USD per role with calls ("policy", "judge", "learner"): (its model, the cost, or None when no price is known)
    costs: dict[str, tuple[str, float | None]] = field(default_factory=dict)

    @property
    def cost(self) -> float | None:
        """The whole estimate's cost in USD, or None when a model's price is unknown."""
        values = [cost for _model, cost in self.costs.values()]
        return None if any(v is None for v in values) else sum(values)


@dataclass(frozen=True)
class QueuePlace:
    """A queued job's place in the worker's line (1 = next), and roughly when it starts (None: unknown)."""

    position: int
    starts_in: float | None
    workers: int


# ---- the arithmetic (pure) --------------------------------------------------------------------------------


def model_role_of(stage: str) -> str:
    """Who makes a stage's calls: the policy (answers, the gate's answers), the judge, or the learner."""
    return "policy" if stage in POLICY_STAGES else "judge" if stage == "judge" else "learner"


def stage_costs(calls: dict[str, float], speeds: dict[str, Speed]) -> dict[str, tuple[str, float | None]]:
    """USD per role: calls x tokens in and out x the price of the stage's model (None: no price known)."""
    costs: dict[str, tuple[str, float | None]] = {}
    for stage, n in calls.items():
        if n <= 0:
            continue
        speed = speeds[stage]
        price = price_per_token(speed.model)
        cost = None if price is None else n * (speed.tokens_in * price[0] + speed.tokens_out * price[1])
        model, before = costs.get(model_role_of(stage), (speed.model, 0.0))
        costs[model_role_of(stage)] = (model, None if before is None or cost is None else before + cost)
    return costs


def money(usd: float) -> str:
    """A cost as a person reads it: "$0.42", "under $0.01", "$0"."""
    return "$0" if usd <= 0 else "under $0.01" if usd < 0.01 else f"${usd:,.2f}"


def cost_words(estimate: Estimate) -> str:
    """"API cost about $0.05 (learner openai/gpt-4o-mini $0.03, policy local/qwen2.5-coder-0.5b $0)", the learner
    first; "" when only the embedded models take part (they cost nothing)."""
    if not any(model and not model.startswith("local/") for model, _cost in estimate.costs.values()):
        return ""
    order = sorted(estimate.costs.items(), key=lambda item: ("learner", "policy", "judge").index(item[0]))
    parts = [f"{role} {model} {money(cost) if cost is not None else 'price unknown'}" for role, (model, cost) in order]
    total = ("not known in full" if estimate.cost is None else
             f"about {money(estimate.cost)}" if estimate.cost >= 0.01 else money(estimate.cost))
    return f"API cost {total} ({', '.join(parts)})"


def default_speed(stage: str, model: str, max_tokens: int | None = None) -> Speed:
    """The assumed speed of a stage on a model nothing has measured yet (DEFAULT_TOKENS, DEFAULT_SPEEDS)."""
    tokens_in, tokens_out = DEFAULT_TOKENS.get(stage, DEFAULT_TOKENS["rollout"])
    if max_tokens and stage in POLICY_STAGES:
        tokens_out = min(tokens_out, max_tokens)
    local = model.startswith("local/")
    read, write, overhead = DEFAULT_SPEEDS["local" if local else "hosted"]
    return Speed(tokens_in / read + tokens_out / write + overhead, tokens_in, tokens_out, model=model, serial=local)


def shape_from_counts(settings: RunSettings, train_count: int, validation_split: int = 0) -> Shape:
    """The shape of a run not started yet, from the task's train (and validation) query counts; the held-out
    validation queries are chosen as core.grpo.gate does."""
    validation = 0
    if settings.gate != GateRule.OFF and settings.validation_size != 0:
        validation = validation_split or held_out_size(train_count, settings.validation_size)
    train = train_count - (0 if validation_split else validation)
    if settings.limit:
        train = min(train, settings.limit)
    train = max(0, train)
    return Shape(steps=settings.epochs * math.ceil(train / settings.batch_size), groups=settings.epochs * train,
                 validation=validation)


def shape_from_progress(settings: RunSettings, progress: dict) -> Shape | None:
    """The shape of a run that has started (its plan is in its progress counters); None before that."""
    steps = int(progress.get("steps_total") or 0)
    if not steps:
        return None
    groups = int(progress.get("rollouts_total") or 0) // max(1, settings.group_size)
    validation = int(progress.get("validation_queries") or 0) if settings.gate != GateRule.OFF else 0
    return Shape(steps=steps, groups=groups, validation=validation)


def mixed_share(settings: RunSettings, progress: dict) -> float:
    """The share of groups the learner summarises: all of them without ground truth or with G = 1 (nothing
    is filtered); else the share of this run's decided groups that were not skipped, or DEFAULT_MIXED (all of
    them when groups where every attempt failed learn from the reference: an upper bound until the run shows)."""
    if not settings.ground_truth or settings.group_size == 1:
        return 1.0
    kept_all = 1.0 if settings.reference_when_all_fail else DEFAULT_MIXED  # only all-right groups are skipped
    kept = int(progress.get("advantages") or 0) + int(progress.get("groups_failed") or 0)
    decided = kept + int(progress.get("groups_skipped") or 0)
    return kept / decided if decided else kept_all


def planned_calls(settings: RunSettings, shape: Shape, *, judged: bool = False, turns: float = 1.0,
                  mixed: float = DEFAULT_MIXED, judge_calls: float = 1.0) -> dict[str, float]:
    """The model calls of a whole training run, per stage: G answers of `turns` calls per group; summaries
    and an advantage for the `mixed` share of groups; one update per step; the gate's candidate (and the
    first step's starting library) on its validation queries x gate_k; `judge_calls` per answer if judged;
    with worked examples on, one compression per mixed group (core.grpo.worked_examples); with lessons off, no
    summary, advantage or update."""
    rollouts = shape.groups * settings.group_size
    gate_answers = 0
    if settings.gate != GateRule.OFF and shape.validation:
        gate_answers = (shape.steps + 1) * shape.validation * settings.gate_k
    lessons = 1.0 if settings.lessons else 0.0  # off: worked examples only, no lesson calls
    return {"rollout": rollouts * turns, "judge": float(rollouts + gate_answers) * judge_calls if judged else 0.0,
            "summary": shape.groups * mixed * settings.group_size * lessons,
            "advantage": shape.groups * mixed * lessons,
            "example": shape.groups * mixed if settings.examples else 0.0,
            "update": float(shape.steps) * lessons if mixed > 0 else 0.0, "gate": gate_answers * turns}


def calls_left(planned: dict[str, float], done: dict[str, int]) -> dict[str, float]:
    """Calls still to come per stage: the plan less what the ledger shows done (never below zero)."""
    return {stage: max(0.0, n - done.get(stage, 0)) for stage, n in planned.items()}


def widths(settings: RunSettings) -> dict[str, int]:
    """Calls of each stage in flight at once: the run's concurrency, as far as the stage has calls ready
    (a batch's answers, its groups); the learner's update and a direct run's one call run alone."""
    answers = settings.batch_size * settings.group_size
    return {"rollout": min(settings.concurrency, answers), "judge": min(settings.concurrency, answers),
            "summary": min(settings.concurrency, answers), "advantage": min(settings.concurrency, settings.batch_size),
            "example": min(settings.concurrency, settings.batch_size),
            "gate": settings.concurrency, "update": 1, "direct": 1}


def stage_seconds(calls: dict[str, float], speeds: dict[str, Speed], width: dict[str, int]) -> dict[str, float]:
    return {stage: n * speeds[stage].seconds(width.get(stage, 1)) for stage, n in calls.items() if n > 0}


def basis_words(calls: dict[str, float], speeds: dict[str, Speed], own: str = "this run") -> str:
    """What an estimate rests on: "from 42 measured calls of this run", "... of local/x", or the default."""
    used = [speeds[stage] for stage, n in calls.items() if n > 0]
    parts = []
    run_calls = sum(s.calls for s in used if s.source == "run")
    if run_calls:
        parts.append(f"{run_calls} measured calls of {own}")
    earlier = [s for s in used if s.source == "earlier"]
    if earlier:
        models = ", ".join(sorted({s.model for s in earlier}))
        parts.append(f"{sum(s.calls for s in earlier)} measured calls of {models}")
    defaults = [stage for stage, n in calls.items() if n > 0 and speeds[stage].source == "default"]
    if defaults:
        local = all(speeds[stage].serial for stage in defaults)
        speed = (f"the embedded model's assumed speed (about {DEFAULT_SPEEDS['local'][1]:.0f} tokens/s)" if local
                 else "an assumed default speed")
        which = "nothing measured yet" if len(defaults) == len(used) else f"for {', '.join(defaults)}"
        parts.append(f"{speed}, {which}")
    return "from " + " and ".join(parts) if parts else "nothing left to call"


def _estimate(calls: dict[str, float], speeds: dict[str, Speed], width: dict[str, int], own: str) -> Estimate:
    seconds = stage_seconds(calls, speeds, width)
    tokens = sum(n * (speeds[stage].tokens_in + speeds[stage].tokens_out) for stage, n in calls.items() if n > 0)
    return Estimate(seconds=sum(seconds.values()), basis=basis_words(calls, speeds, own),
                    calls=round(sum(calls.values())), tokens=round(tokens), by_stage=seconds,
                    costs=stage_costs(calls, speeds))


def _complete(speeds: dict[str, Speed], settings: RunSettings, judge_model: str) -> dict[str, Speed]:
    """Every stage's speed: the given ones, an assumed default for the rest."""
    models = stage_models(settings, judge_model)
    return {stage: speeds.get(stage) or default_speed(stage, models[stage], settings.max_tokens) for stage in STAGES}


def estimate_left(settings: RunSettings, shape: Shape | None, progress: dict, done: dict[str, int],
                  speeds: dict[str, Speed], *, judged: bool = False, judge_model: str = "",
                  turns: float | None = None, kind: str = RunKind.TRAIN, judge_calls: float = 1.0) -> Estimate | None:
    """Seconds of model time a training run still needs over all its stages, or None when its shape is
    unknown. `done` counts the ledger's calls of the run per stage; `turns` are calls per answer (measured
    from the run once it has answers, else the caller's guess, else 1)."""
    speeds = _complete(speeds, settings, judge_model)
    if kind == RunKind.DIRECT:
        return _estimate(calls_left({"direct": 1.0}, done), speeds, widths(settings), "this run")
    if shape is None:
        return None
    answers = int(progress.get("rollouts_done") or 0)
    if answers and done.get("rollout"):
        turns = max(1.0, done["rollout"] / answers)
    planned = planned_calls(settings, shape, judged=judged, turns=turns or 1.0, mixed=mixed_share(settings, progress),
                            judge_calls=judge_calls)
    return _estimate(calls_left(planned, done), speeds, widths(settings), "this run")


def estimate_run(settings: RunSettings, task_sample_count: int, history: dict[str, Speed], *,
                 validation_count: int = 0, judged: bool = False, judge_model: str = "",
                 turns: float = 1.0, judge_calls: float = 1.0) -> Estimate:
    """Calls, tokens and seconds of a whole run with these settings on a task with `task_sample_count` train
    queries (and `validation_count` in a validation split), at the speeds of `history` (per stage)."""
    shape = shape_from_counts(settings, task_sample_count, validation_count)
    planned = planned_calls(settings, shape, judged=judged, turns=turns, mixed=mixed_share(settings, {}),
                            judge_calls=judge_calls)
    return _estimate(planned, _complete(history, settings, judge_model), widths(settings), "this run")


def rough_duration(seconds: float) -> str:
    """A duration as a person says it ahead of time: "under a minute", "12 min", "1 h 20 min"."""
    minutes = round(seconds / 60)
    if minutes < 1:
        return "under a minute"
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def duration(seconds: float | None) -> str:
    """A time measured so far, as a clock reads it: "45s", "3m 05s", "1h 02m" ("–" for none); an estimate
    ahead of time reads as rough_duration."""
    if seconds is None:
        return "–"
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def compact(n: float) -> str:
    """A count as a person reads it: 950, 12k, 4.1M."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 10_000:
        return f"{n / 1_000:.0f}k"
    if n >= 1_000:
        return f"{n / 1_000:.1f}k"
    return str(round(n))


def estimate_words(estimate: Estimate) -> str:
    """"about 96 calls, 150k tokens, 12 min (from 340 measured calls of local/qwen2.5-coder-0.5b)", and the API
    cost when a hosted model takes part (cost_words)."""
    cost = cost_words(estimate)
    return (f"about {estimate.calls} calls, {compact(estimate.tokens)} tokens, "
            f"{rough_duration(estimate.seconds)} ({estimate.basis})" + (f"; {cost}" if cost else ""))


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def queue_words(place: QueuePlace) -> str:
    """"queued: 2nd in line, starts in about 4 min"; what is not known is left out, a missing worker said."""
    line = f"queued: {ordinal(place.position)} in line"
    if place.workers == 0:
        return line + "; no worker is running to take it"
    if place.starts_in is not None:
        line += (", starts in a moment" if place.starts_in < 30
                 else f", starts in about {rough_duration(place.starts_in)}")
    return line


# ---- a run's state in words (pure) ------------------------------------------------------------------------


def _step_name(index: int, total: int) -> str:
    return f"step {index} of {total}" if total > 1 else f"step {index}"


def _finished_step(step: Step, index: int, total: int, manual: bool, numbers: dict[int, int]) -> str:
    """What became of a finished step: applied after review, or not, with the version it left."""
    name = _step_name(index, total)
    after = step.version_after_id or step.version_before_id
    version = f"version #{numbers[after]}" if after in numbers else "its version"
    landed = step.version_after_id is not None and step.version_after_id != step.version_before_id
    if manual:
        return f"{name} applied after review ({version})" if landed else \
            f"{name} reviewed, nothing applied ({version} stays)"
    return f"{name} done ({version})" if landed else f"{name} done, library unchanged ({version})"


def status_words(run: Run, steps: list[Step], numbers: dict[int, int], shown: str | None = None,
                 pending: int = 0) -> str:
    """The run's state as a sentence: "step 1 applied after review (version #3); queued to go on", not
    "queued, 0/1 steps". `steps` in plan order, `numbers` version id -> number, `shown` the status a person
    sees (stalled for a running job whose worker stopped), `pending` its operations waiting for review."""
    shown = shown or run.status
    settings = run_settings(run)
    total = int((run.progress or {}).get("steps_total") or 0) or len(steps)
    finished = [i for i, s in enumerate(steps) if s.status == StepStatus.COMPLETED]
    manual = settings.review_mode == "manual"
    last = _finished_step(steps[finished[-1]], finished[-1] + 1, total, manual, numbers) if finished else ""
    current = next((i + 1 for i, s in enumerate(steps) if s.status != StepStatus.COMPLETED), len(steps) + 1)
    at = _step_name(current, total) if total else "its first step"
    final = f"version #{numbers[run.current_version_id]}" if run.current_version_id in numbers else "its last version"
    if shown == JobStatus.COMPLETED:
        done = f"{len(finished)} step{'s' if len(finished) != 1 else ''}, " if steps else ""
        return f"completed: {done}final {final}"
    if shown == JobStatus.QUEUED:
        return f"{last}; queued to go on" if last else "queued, not started yet"
    if shown == JobStatus.RUNNING:
        return f"running {at}" + (f"; {last}" if last else "")
    if shown == JobStatus.AWAITING_REVIEW:
        return f"{at} waits for review ({pending} operation{'s' if pending != 1 else ''} pending)"
    if shown == JobStatus.AWAITING_LABELS:
        return f"{at} waits for labels"
    if shown == JobStatus.PAUSED:
        return f"paused at {at}" + (f"; {last}" if last else "")
    if shown == JobStatus.STALLED:
        return f"stalled at {at}: its worker stopped beating"
    if shown == JobStatus.FAILED:
        return f"failed at {at}"
    if shown == JobStatus.CANCELLED:
        return f"cancelled after {len(finished)} of {total} steps" if steps else "cancelled before it started"
    return str(shown)


# ---- gathering the inputs (reads) -------------------------------------------------------------------------


def stage_models(settings: RunSettings, judge_model: str = "") -> dict[str, str]:
    """The model behind each stage: the policy answers (and the gate's answers), the judge scores, the learner
    does the rest."""
    return {stage: settings.policy_model if stage in POLICY_STAGES
            else (judge_model or settings.policy_model) if stage == "judge" else settings.learner_model
            for stage in STAGES}


def _speed(row: dict, model: str, source: str) -> Speed:
    return Speed(row["latency_ms"] / 1000, row["tokens_in"], row["tokens_out"], model=model, calls=row["calls"],
                 source=source)


def measured_speeds(session: Session, models: dict[str, str], run_id: int | None = None,
                    max_tokens: int | None = None) -> dict[str, Speed]:
    """Each stage's speed: from this run's own calls when it has made a few, else from earlier calls of the
    stage's model (a gate's answers are measured like rollouts), else the assumed default."""
    own = queries.call_speeds_by_stage(session, run_id=run_id) if run_id is not None else {}
    earlier: dict[str, dict] = {}  # per model, read only when this run has too few calls of a stage
    speeds = {}
    for stage, model in models.items():
        measured = own.get(stage)
        if measured and measured["calls"] >= MIN_MEASURED:
            speeds[stage] = _speed(measured, model, "run")
            continue
        if model not in earlier:
            earlier[model] = queries.call_speeds_by_stage(session, model=model, other_than_run=run_id)
        history = earlier[model].get(stage) or (earlier[model].get("rollout") if stage == "gate" else None)
        if history and history["calls"] >= MIN_MEASURED:
            speeds[stage] = _speed(history, model, "earlier")
        else:
            speeds[stage] = default_speed(stage, model, max_tokens)
    return speeds


def task_facts(session: Session, task: Task) -> dict:
    """What a plan needs of a task: its train and validation query counts, whether a judge scores, its
    judge model and calls per answer."""
    counts = queries.count_samples(session, task.id)
    method = METHODS.get(task.reward_method)
    turns, judge_calls = PYTHON_TURNS if task.agent_mode == "python" else 1.0, 1.0
    if task.kind == "conversation":
        # Up to max_turns agent replies and max_turns - 1 simulated user turns (counted at the agent's
        # speed), then the rubric's call and one per judge rule.
        turns = 2.0 * task.max_turns - 1
        judge_calls = 1.0 + _judge_rules(task)
    return {"train": counts.get("train", 0), "validation": counts.get(VALIDATION_SPLIT, 0),
            "judged": bool(method and method.uses_judge), "judge_model": task.judge_model,
            "turns": turns, "judge_calls": judge_calls}


def _judge_rules(task: Task) -> int:
    try:
        settings = parsed_settings(task.reward_method, task.reward_settings or {})
    except InvalidInput:
        return 0
    return sum(1 for rule in getattr(settings, "rules", []) if rule.check == "judge")


def form_estimate(session: Session, task: Task, settings: RunSettings) -> Estimate:
    """A whole run's calls, tokens and time for a form's settings, before it is queued (empty model fields
    fall back to the task's models, as core.grpo.training.create_run does)."""
    settings = settings.model_copy(update={"policy_model": settings.policy_model or task.policy_model,
                                           "learner_model": settings.learner_model or task.learner_model})
    facts = task_facts(session, task)
    speeds = measured_speeds(session, stage_models(settings, facts["judge_model"]), max_tokens=settings.max_tokens)
    return estimate_run(settings, facts["train"], speeds, validation_count=facts["validation"],
                        judged=facts["judged"], judge_model=facts["judge_model"], turns=facts["turns"],
                        judge_calls=facts["judge_calls"])


def run_estimate(session: Session, run: Run) -> Estimate | None:
    """The model time a run still needs over all its stages (whatever its status), or None when nothing can
    be said (an attribution job, a task that is gone)."""
    task = session.get(Task, run.task_id)
    if task is None or run.kind not in (RunKind.TRAIN, RunKind.DIRECT):
        return None
    settings = run_settings(run)
    facts = task_facts(session, task)
    progress = run.progress or {}
    shape = shape_from_progress(settings, progress) or shape_from_counts(settings, facts["train"],
                                                                         facts["validation"])
    speeds = measured_speeds(session, stage_models(settings, facts["judge_model"]), run.id, settings.max_tokens)
    return estimate_left(settings, shape, progress, queries.call_counts_by_stage(session, run.id), speeds,
                         judged=facts["judged"], judge_model=facts["judge_model"], turns=facts["turns"],
                         kind=run.kind, judge_calls=facts["judge_calls"])


def evaluation_estimate(session: Session, evaluation: Evaluation) -> Estimate | None:
    """The model time an evaluation still needs: its answers (k per query) and their judge calls."""
    task = session.get(Task, evaluation.task_id)
    if task is None:
        return None
    facts = task_facts(session, task)
    progress = evaluation.progress or {}
    total = progress.get("rollouts_total")
    if not total:
        queries_ = len(evaluation.sample_ids) if evaluation.sample_ids is not None else \
            queries.count_samples(session, task.id).get(evaluation.split, 0)
        total = min(queries_, evaluation.limit or queries_) * evaluation.k
    answers = max(0, total - int(progress.get("rollouts_done") or 0))
    calls = {"rollout": answers * facts["turns"], "judge": float(answers) if facts["judged"] else 0.0}
    models = {"rollout": evaluation.model, "judge": facts["judge_model"]}
    speeds = measured_speeds(session, models)
    width = get_settings().concurrency  # what the worker gives an evaluation
    return _estimate(calls, speeds, {"rollout": width, "judge": width}, "this evaluation")


def _job_seconds(session: Session, kind: str, job: Run | Evaluation) -> float | None:
    estimate = run_estimate(session, job) if kind == "run" else evaluation_estimate(session, job)
    return estimate.seconds if estimate is not None else None


def _total(values: Iterable[float | None]) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def queue_position(session: Session, run: Run) -> QueuePlace | None:
    """A queued run's place among the queued runs and evaluations, in the order the worker claims them
    (oldest first, core.jobs.worker.claim_next), and roughly when it starts: the time left of the jobs running now
    and the estimates of those before it, shared among the live workers. None when the run is not queued."""
    if run.status != JobStatus.QUEUED:
        return None
    line = queries.jobs_in_status(session, JobStatus.QUEUED)
    keys = [(kind, job.id) for kind, job in line]
    if ("run", run.id) not in keys:
        return None
    position = keys.index(("run", run.id)) + 1
    running = [(kind, job) for kind, job in queries.jobs_in_status(session, JobStatus.RUNNING)
               if job_health(job.status, job.heartbeat_at) == JobStatus.RUNNING]
    workers = len(alive_workers(session))
    ahead = _total(_job_seconds(session, kind, job) for kind, job in [*running, *line[:position - 1]])
    starts_in = ahead / max(1, workers) if ahead is not None else None
    return QueuePlace(position=position, starts_in=starts_in, workers=workers)
