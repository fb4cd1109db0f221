"""The settings of a training run, declared once with their constraints (a pydantic model).

Frozen into Run.settings when a run is created; the Train page, the CLI (its defaults and help) and
the engine all read this one definition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from core.domain.library import MAX_EXAMPLES, MAX_EXPERIENCES
from core.errors import InvalidInput, describe_validation
from core.secrets import mask_url
from core.settings import get_settings
from storage.statuses import GateRule

if TYPE_CHECKING:  # the CLI's train help reads the defaults here before any database code loads
    from storage.tables import Run


def _temperature_in_range(value: float) -> float:
    if not 0 <= value <= 2:
        raise ValueError("must be between 0 and 2")
    return value


def _budget_positive(value: float | None) -> float | None:
    if value is not None and value <= 0:
        raise ValueError("must be positive")
    return value


Temperature = Annotated[float, AfterValidator(_temperature_in_range)]
# Stored and shown with its credentials masked; the process that calls it reads the full URL from
# STUDIO_API_BASE (core.secrets.resolve_api_base).
ApiBase = Annotated[str | None, AfterValidator(mask_url)]
Budget = Annotated[float | None, AfterValidator(_budget_positive)]


def default_concurrency() -> int:
    return get_settings().concurrency


class JobSettings(BaseModel):
    """A job's settings as stored in its row: read back with `from_dict`, built from a form or the command
    line with `build` (a bad value is InvalidInput naming the field)."""

    model_config = ConfigDict(extra="ignore")

    # Frozen from the library when the job is created, so every rollout of the job (and a resume) shows the
    # agent entries chosen the same way, whatever happens to the library's setting meanwhile. None (runs
    # made before selections existed) is `all`.
    selection: dict | None = Field(None, description="the library's entry selection when the job was created "
                                   "({mode, k}; core.domain.selection)")

    @classmethod
    def from_dict(cls, data: dict) -> Self:
        return cls.model_validate(data)

    @classmethod
    def build(cls, **values) -> Self:
        try:
            return cls(**values)
        except ValidationError as exc:
            raise InvalidInput(describe_validation(exc)) from None


class RunSettings(JobSettings):
    """Everything that shapes a run; frozen into Run.settings when the run is created.

    The constraints are declared on the fields, so the Train page, the CLI and a stored run are checked
    by the same rules; the CLI's defaults are these defaults.
    """

    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    epochs: int = Field(3, ge=1, description="passes over the training queries")
    batch_size: int = Field(8, ge=1, description="queries per step")
    group_size: int = Field(5, ge=1, description="G, outputs per query (1 = no group comparison)")
    temperature: Temperature = 0.7
    concurrency: int = Field(default_factory=default_concurrency, ge=1,
                             description="calls in flight per model (TFGRPO_CONCURRENCY)")
    limit: int | None = Field(None, ge=1, description="use only the first N training queries")
    seed: int = 0
    ground_truth: bool = True
    review_mode: Literal["auto", "manual"] = "auto"
    hold_flagged: bool = Field(True, description="in auto review mode, operations with a quality flag (text cut "
                               "off, a near duplicate, a query's numbers, over the length limit) are refused before "
                               "the validation gate (invalid, the flag as the reason); off: they are measured and "
                               "approved like the others. Manual review shows them to the reviewer either way")
    policy_model: str = ""
    learner_model: str = ""
    max_tokens: int = Field(1024, ge=16)
    learner_max_tokens: int = Field(768, ge=16)
    max_turns: int | None = Field(None, ge=1, description="python mode: model turns per answer (default 3); "
                                  "conversation tasks: agent turns per conversation (default: the task's max_turns)")
    max_experiences: int = Field(MAX_EXPERIENCES, ge=1, description="the most experiences a library may hold")
    examples: bool = Field(False, description="also propose worked examples: in each group where some attempts "
                           "succeeded and others failed, the learner compresses a successful attempt, and the "
                           "example is proposed only if its own answer scores as right (needs ground truth)")
    max_examples: int = Field(MAX_EXAMPLES, ge=1, description="the most worked examples a library may hold")
    lessons: bool = Field(True, description="propose lessons from each group's semantic advantage (the paper); "
                          "off: the run learns worked examples only (needs examples on)")
    reference_when_all_fail: bool = Field(False, description="a group in which every attempt failed (rewards "
                                          "equal and below 1) goes to the learner with the sample's reference "
                                          "answer as the successful side, instead of being skipped (needs ground "
                                          "truth and a reference): knowledge the agent cannot have is learned "
                                          "only this way")
    learner_replies: bool = Field(True, description="a worked example made from a reference is written by the "
                                  "learner as the reply a person would send (checked against the reference; a "
                                  "sentence per fact where it fails); off: the sentence per fact, without asking "
                                  "the learner, and on a task whose reward reads the facts a reply states (facts, "
                                  "contains_all, contains) a group with a right attempt also gets its example from "
                                  "the reference, not compressed from the attempt")
    skip_covered: bool = Field(True, description="in a run that learns worked examples only (lessons off), a "
                               "training query is not rolled out again where one example shown to it already "
                               "states its reference in full, or where an example stating it in full was rejected "
                               "earlier in the run: an example from its group would be refused again")
    start_label: str | None = Field(None, description="start from the version this label points at (e.g. "
                                    "production) instead of the library's latest")
    old_share: float | None = Field(None, ge=0.0, le=1.0, description="an update from production: train on the "
                                    "samples harvested from traces plus this share of the other train samples")
    max_operations: int | None = Field(None, ge=1, description="operations the learner may propose per step "
                                       "(default: grows with the batch size, batch_size // 2, 4 to 12)")
    validation_size: int | None = Field(None, ge=0, description="train queries held out for the gate when "
                                        "the task has no validation split (default: 20%, 8 to 50; 0 = none)")
    gate: GateRule = Field(GateRule.NO_WORSE, description="when a step's library lands: off (always), "
                           "no_worse (not significantly worse, mean not lower) or better (significantly better)")
    gate_k: int = Field(2, ge=1, description="samples per validation query for the gate")
    direct_count: int = Field(8, ge=1)
    budget_usd: Budget = Field(None, description="pause the run when its cost reaches this many USD")
    api_base: ApiBase = None
    call_timeout_s: float | None = Field(None, gt=0, description="seconds one model request may take before it is "
                                         "retried (default TFGRPO_CALL_TIMEOUT_S)")
    call_deadline_s: float | None = Field(None, gt=0, description="seconds one model call may take with all its "
                                          "retries (default TFGRPO_CALL_DEADLINE_S)")

    @model_validator(mode="after")
    def _examples_need_ground_truth(self) -> RunSettings:
        """A worked example is proposed only once its answer scores as right against the reference; without
        ground truth there is nothing to score it against."""
        if self.examples and not self.ground_truth:
            raise ValueError("worked examples are checked against the reference answer: keep ground truth on, "
                             "or turn examples off")
        return self

    @model_validator(mode="after")
    def _learns_something(self) -> RunSettings:
        if not (self.lessons or self.examples):
            raise ValueError("a run with lessons off learns worked examples only: turn examples on, or lessons on")
        return self

    @model_validator(mode="after")
    def _reference_needs_ground_truth(self) -> RunSettings:
        """Without ground truth the learner sees neither rewards nor the reference, so there is no failed group
        and no successful side to show it."""
        if self.reference_when_all_fail and not self.ground_truth:
            raise ValueError("learning from the reference when every attempt failed needs ground truth: keep ground "
                             "truth on, or turn the option off")
        return self

    def gateway_limits(self) -> dict:
        """The gateway's per-request timeout and overall deadline, where this run sets them."""
        limits = {"timeout_s": self.call_timeout_s, "deadline_s": self.call_deadline_s}
        return {name: value for name, value in limits.items() if value is not None}

    def operations_limit(self) -> int:
        """The most operations one step may propose: the setting, or half the batch size within 4 to 12
        (a larger batch brings more lessons to fold in)."""
        return self.max_operations or min(12, max(4, self.batch_size // 2))

    def refuses_flagged(self) -> bool:
        """Whether a step's flagged operations (lessons and worked examples alike) are refused before the gate: in
        auto review mode with hold_flagged on. Nobody was asked to look at them, so they are never held; the
        engine refuses them and the Review page says so on each card."""
        return self.review_mode == "auto" and self.hold_flagged

    def validate(self) -> RunSettings:  # type: ignore[override]
        """Check the settings again (after assignment of fields); raise InvalidInput naming the first problem."""
        return RunSettings.build(**self.model_dump())


def run_settings(run: Run) -> RunSettings:
    """A run's settings as frozen when it was created, typed: the one way every reader gets them (a stored run
    from before a setting existed reads that setting's default)."""
    return RunSettings.from_dict(run.settings or {})
