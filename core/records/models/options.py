"""The models a model picker offers (Train's policy and learner, the Quick trial, Evaluate, Tasks), each with
where it came from, so every picker offers the same ones in the same order:

1. the task's own models (policy, learner, judge, user simulator),
2. the studio's default model,
3. each model connection's models, as its server lists them (core.models.connections.served_models: kept for a
   few minutes, asked again on Refresh; a server that does not answer offers what it listed last, with why),
4. the embedded models and a few models of every provider whose API key is set (core.models.model_choice).

A typed name stays possible wherever these are offered; whether it can be called is checked when a job is queued.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session

from core.models.connections import ServedModels, served_models
from core.models.model_choice import PROVIDERS, key_is_set, local_models
from core.records.evaluation.figures import score
from core.records.models.connections import list_connections
from core.records.runs.settings import run_settings
from core.records.tasks.task_io import TaskSettings
from core.settings import get_settings
from storage import queries
from storage.statuses import LEARNING_KINDS, JobStatus
from storage.tables import Task

TASK_ROLES = (("policy_model", "policy"), ("learner_model", "learner"), ("judge_model", "judge"),
              ("simulator_model", "user simulator"))


@dataclass(frozen=True)
class ModelOption:
    """One model a picker offers and where it came from, in words ("the task's policy model, connection vllm")."""

    name: str
    source: str


def connection_listings(session: Session, *, refresh: bool = False) -> list[ServedModels]:
    """Each connection's listed models (kept, or asked of its server when stale or `refresh`), by name."""
    return [served_models(connection, refresh=refresh) for connection in list_connections(session)]


def model_options(session: Session, task: Task | TaskSettings | None, *, refresh: bool = False) -> list[ModelOption]:
    """Every model to offer for `task` (a stored task, or the settings a form edits; None: no task yet), in the
    order above, each once with all its sources."""
    found: dict[str, list[str]] = {}

    def offer(name: str | None, source: str) -> None:
        if name and source not in found.setdefault(name, []):
            found[name].append(source)

    for field, role in TASK_ROLES if task is not None else ():
        offer(getattr(task, field, None), f"the task's {role} model")
    offer(get_settings().model, "the studio's default")
    for listing in connection_listings(session, refresh=refresh):
        for model in listing.models:
            offer(f"{listing.connection}/{model}", f"connection {listing.connection}")
    for name in local_models():
        offer(name, "embedded")
    for provider, (variable, models) in PROVIDERS.items():
        if key_is_set(variable):
            for name in models:
                offer(name, f"{provider} ({variable} is set)")
    return [ModelOption(name, ", ".join(sources)) for name, sources in found.items()]


def option_names(options: list[ModelOption], *first: str | None) -> list[str]:
    """The names a picker lists: `first` (its current choice, say), then the options, each once."""
    return list(dict.fromkeys([name for name in first if name] + [option.name for option in options]))


def last_evaluation_model(session: Session, task: Task) -> str | None:
    """The model of the task's newest evaluation a person asked for that answered (it has figures), never one
    whose evaluation failed, was cancelled or got no answer (a server that refused every call)."""
    answered = (ev for ev in queries.evaluations(session, task.id) if score(ev, "mean_at_k") is not None)
    newest = next(answered, None)
    return newest.model if newest is not None else None


@dataclass(frozen=True)
class ModelStart:
    """The model a new evaluation or comparison starts from, and why, in words a page and the CLI both print."""

    model: str
    reason: str


def chosen_model(session: Session, task: Task) -> ModelStart:
    """The model of the newest work a person chose for `task`: an evaluation they asked for that answered, or a
    learning run they started (not one that failed), whichever is newer; else the task's policy model, else the
    studio's default. The one choice behind the Evaluate page's first model and `compare`'s new evaluations, so
    neither drifts to another model (the embedded one) once a person worked on a connection's."""
    answered = next((ev for ev in queries.evaluations(session, task.id) if score(ev, "mean_at_k") is not None), None)
    run = next((r for r in queries.runs(session, task.id, kinds=LEARNING_KINDS)
                if r.created_by != "system" and r.status != JobStatus.FAILED
                and (run_settings(r).policy_model or task.policy_model)), None)
    if run is not None and (answered is None or run.created_at >= answered.created_at):
        return ModelStart(run_settings(run).policy_model or task.policy_model,
                          f"the model of run {run.id}, the task's newest work a person chose")
    if answered is not None:
        return ModelStart(answered.model, f"the model of evaluation {answered.id}, the task's newest work a person "
                                          "chose")
    if task.policy_model:
        return ModelStart(task.policy_model, "the task's policy model (no evaluation or run of it yet)")
    return ModelStart(get_settings().model, "the studio's default model (the task names none and has no evaluation "
                                            "or run yet)")
