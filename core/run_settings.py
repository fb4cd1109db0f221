"""The settings of a training run, declared once with their constraints (a pydantic model).

Frozen into Run.settings when a run is created; the Train page, the CLI (its defaults and help) and
the engine all read this one definition.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.errors import InvalidInput, describe_validation
from core.settings import get_settings
from storage.statuses import GateRule


class RunSettings(BaseModel):
    """Everything that shapes a run; frozen into Run.settings when the run is created.

    The constraints are declared on the fields, so the Train page, the CLI and a stored run are checked
    by the same rules; the CLI's defaults are these defaults.
    """

    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    epochs: int = Field(3, ge=1, description="passes over the training queries")
    batch_size: int = Field(8, ge=1, description="queries per step")
    group_size: int = Field(5, ge=1, description="G, outputs per query (1 = no group comparison)")
    temperature: float = 0.7
    concurrency: int = Field(default_factory=lambda: get_settings().concurrency, ge=1,
                             description="calls in flight per model (TFGRPO_CONCURRENCY)")
    limit: int | None = Field(None, ge=1, description="use only the first N training queries")
    seed: int = 0
    ground_truth: bool = True
    review_mode: Literal["auto", "manual"] = "auto"
    policy_model: str = ""
    learner_model: str = ""
    max_tokens: int = Field(1024, ge=16)
    learner_max_tokens: int = Field(768, ge=16)
    max_turns: int = Field(3, ge=1)
    max_experiences: int = Field(30, ge=1, description="the most experiences a library may hold")
    max_operations: int | None = Field(None, ge=1, description="operations the learner may propose per step "
                                       "(default: grows with the batch size, batch_size // 2, 4 to 12)")
    validation_size: int | None = Field(None, ge=0, description="train queries held out for the gate when "
                                        "the task has no validation split (default: 20%, 8 to 50; 0 = none)")
    gate: GateRule = Field(GateRule.NO_WORSE, description="when a step's library lands: off (always), "
                           "no_worse (not significantly worse, mean not lower) or better (significantly better)")
    gate_k: int = Field(2, ge=1, description="samples per validation query for the gate")
    direct_count: int = Field(8, ge=1)
    budget_usd: float | None = Field(None, description="pause the run when its cost reaches this many USD")
    api_base: str | None = None

    @field_validator("temperature")
    @classmethod
    def _temperature_in_range(cls, value: float) -> float:
        if not 0 <= value <= 2:
            raise ValueError("must be between 0 and 2")
        return value

    @field_validator("budget_usd")
    @classmethod
    def _budget_positive(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("must be positive")
        return value

    def operations_limit(self) -> int:
        """The most operations one step may propose: the setting, or half the batch size within 4 to 12
        (a larger batch brings more lessons to fold in)."""
        return self.max_operations or min(12, max(4, self.batch_size // 2))

    def validate(self) -> RunSettings:  # type: ignore[override]
        """Check the settings again (after assignment of fields); raise InvalidInput naming the first problem."""
        return RunSettings.build(**self.model_dump())

    @classmethod
    def from_dict(cls, data: dict) -> RunSettings:
        return cls.model_validate(data)

    @classmethod
    def build(cls, **values) -> RunSettings:
        """Settings from a form or the command line; a bad value is InvalidInput naming the field."""
        try:
            return cls(**values)
        except ValidationError as exc:
            raise InvalidInput(describe_validation(exc)) from None
