"""The validation gate's verdict on one step, as stored on Step.gate (JSON) and read by every reader: the
gate itself (core.grpo.gate), the review rules (core.records.review.decisions), the Review and Train pages, the CLI
and the benchmarks, through one typed model instead of string keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

from pydantic import BaseModel, ConfigDict

from storage.statuses import GateDecision

if TYPE_CHECKING:  # the command line's parser imports this module before any database code loads
    from storage.tables import Step


class GateVerdict(BaseModel):
    """What the gate found: its decision, the figures of the paired comparison when it measured, and the
    line a person reads. Stored with exactly the fields that were set (`stored`), so a verdict written before
    a field existed reads that field's default."""

    model_config = ConfigDict(extra="ignore")

    decision: GateDecision | None = None  # None: a re-measurement queued before the gate ever ran
    rule: str | None = None
    reason: str = ""  # why skipped or undecided
    line: str = ""
    n: int | None = None
    k: int | None = None
    mean_before: float | None = None
    mean_after: float | None = None
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    wins: int | None = None
    losses: int | None = None
    ties: int | None = None
    finding: str = ""
    verdict: str = ""
    missing: int = 0  # validation queries left out (model-call errors)
    evaluation_before: int | None = None
    evaluation_after: int | None = None
    remeasure: bool = False  # the reviewed library waits for its own measurement
    proposed: GateVerdict | None = None  # after a re-measurement: the first measurement, of every proposed operation

    @classmethod
    def of(cls, step: Step | None) -> Self | None:
        """The step's verdict, or None when no gate ran."""
        return None if step is None or not step.gate else cls.model_validate(step.gate)

    def stored(self) -> dict:
        """As Step.gate holds it: the fields that were set, in JSON types."""
        return self.model_dump(mode="json", exclude_unset=True)

    @property
    def failed(self) -> bool:
        return self.decision == GateDecision.FAILED

    @property
    def undecided(self) -> bool:
        """The gate could not decide (too many validation queries without answers): the reviewer decides the step
        in manual review; in auto review the run fails, and resuming it measures again."""
        return self.decision == GateDecision.UNDECIDED

    @property
    def measured(self) -> bool:
        """Whether it compared the two libraries' figures (passed or failed)."""
        return self.mean_before is not None
