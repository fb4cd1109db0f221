"""What the studio tells a person about the learner a run will use, before it is queued (Train page, `train`).

The embedded model (`local/...`) runs offline and costs nothing, but as the learner it rarely writes a usable
lesson, and a person choosing it should know that with the figures, not find out after an hour of training.
Measured in this studio (issue 26): in one run 11 of its 14 operations were invalid (it copied the update
prompt's example ids), the one that landed retold a training problem and was cut off mid-sentence, and the
library it learned on 24 problems changed the embedded agent's score by +0.017 [-0.050, +0.083] (paired, no
detectable difference) on 60 held-out GSM8K problems. The way to a capable learner is named: a model connection
(the Models page, or `python -m core models add`), by name when the studio has some, whose models every picker
lists; and where a provider's API key is set, a hosted learner is offered, with what it would cost for this run
(core.records.runs.progress prices it).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session

from core.errors import InvalidInput
from core.models.model_choice import LOCAL_PREFIX, PROVIDERS, check_model, known_models
from core.models.prices import price_per_token
from core.records.models.connections import list_connections
from core.records.runs.progress import form_estimate, money
from core.records.runs.settings import RunSettings
from core.settings import get_settings
from storage.tables import Task

EMBEDDED_LEARNER = (
    "The learner is the embedded model {model}: it rarely writes a usable lesson. Measured in this studio: in one "
    "run 11 of its 14 operations were invalid, the one that landed retold a training problem and was cut off "
    "mid-sentence, and the library it learned changed the embedded agent's score by +0.017 [-0.050, +0.083] "
    "(no detectable difference) on 60 held-out GSM8K problems."
)


@dataclass(frozen=True)
class LearnerAdvice:
    """The notice about an embedded learner: its text, and a hosted learner this studio can call now (None when
    no provider's key is set) with its estimated API cost for the run (None: no known price)."""

    learner: str
    text: str
    hosted: str | None = None
    hosted_cost: float | None = None


def learner_of(task: Task, settings: RunSettings) -> str:
    """The learner a run with these settings uses: as core.grpo.training.create_run resolves it."""
    return settings.learner_model or task.learner_model or get_settings().model


def hosted_learners() -> list[str]:
    """Hosted models this studio can call now (their provider's key is set), priced ones first."""
    callable_here = []
    for name in known_models():
        if name.startswith(LOCAL_PREFIX):
            continue
        try:
            check_model(name)
        except InvalidInput:
            continue
        callable_here.append(name)
    return sorted(callable_here, key=lambda name: price_per_token(name) is None)


def learner_advice(session: Session, task: Task, settings: RunSettings) -> LearnerAdvice | None:
    """The notice for a run whose learner is an embedded model, with a hosted learner offered where a key is set;
    None for any other learner."""
    learner = learner_of(task, settings)
    if not learner.startswith(LOCAL_PREFIX):
        return None
    text = EMBEDDED_LEARNER.format(model=learner)
    hosted = next(iter(hosted_learners()), None)
    connections = connection_words(session)
    if hosted is None:
        keys = ", ".join(variable for variable, _models in PROVIDERS.values())
        return LearnerAdvice(learner, f"{text} For a learner that writes usable lessons, {connections}; or set a "
                                      f"provider's API key ({keys}) where the app and the worker run, and choose its "
                                      "model as the learner.")
    estimate = form_estimate(session, task, settings.model_copy(update={"learner_model": hosted}))
    cost = estimate.costs.get("learner", (hosted, None))[1]
    priced = f", about {money(cost)} of API cost for this run" if cost is not None else ", its price is not known"
    return LearnerAdvice(learner, f"{text} A hosted learner can be used here: {hosted} (its API key is set){priced}. "
                                  f"Or {connections}.", hosted=hosted, hosted_cost=cost)


def connection_words(session: Session) -> str:
    """How to reach a capable learner through a model connection, naming this studio's connections if it has any."""
    names = [connection.name for connection in list_connections(session)]
    if names:
        listed = ", ".join(names)
        return (f"choose a capable model of a model connection as the learner: this studio has {listed} (the "
                "Learner model field lists the models their servers serve, written connection/model; add another "
                "on the Models page)")
    return ("connect a capable model as a model connection: add its server (vLLM, Ollama, llama.cpp's server, a "
            "company gateway) or provider on the Models page or with python -m core models add, then choose "
            "connection/model as the learner")
