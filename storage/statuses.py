"""Every status the studio stores or shows, and the named sets of them that rules test against.

Storage, core and pages all read these names; no status is spelled as a bare string anywhere else.
The members are `StrEnum`s, so they compare equal to, and are stored as, their plain text.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """A run's or an evaluation's state. `stalled` is never stored: it is a `running` job whose heartbeat
    stopped (see core.jobs.job_health)."""

    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_REVIEW = "awaiting_review"
    AWAITING_LABELS = "awaiting_labels"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STALLED = "stalled"
    # An evaluation that ran every rollout but some model calls failed: its figures count the answered
    # rollouts only, and "retry" runs just the failed ones.
    INCOMPLETE = "incomplete"


class StepStatus(StrEnum):
    RUNNING = "running"
    AWAITING_REVIEW = "awaiting_review"
    AWAITING_LABELS = "awaiting_labels"
    COMPLETED = "completed"
    FAILED = "failed"  # every group failed, or the learner's update did: the run fails here and a resume redoes it


class OperationStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EDITED = "edited"
    APPLIED = "applied"
    INVALID = "invalid"


class GroupStatus(StrEnum):
    """An Advantage row: the outcome of one query's group in a step. `waiting` is never stored."""

    OK = "ok"
    SKIPPED = "skipped"
    FAILED = "failed"
    WAITING = "waiting"


class LabelStatus(StrEnum):
    """A rollout's place in the labeling queue (None: it needs no person)."""

    NEEDED = "needed"
    DONE = "done"
    DISPUTED = "disputed"


class TraceJudgeStatus(StrEnum):
    """A production trace and the task's own reward (None: not considered yet; core/records/production/scoring.py)."""

    SKIPPED = "skipped"  # the task's rules did not choose it
    JUDGING = "judging"  # claimed by a worker, its verdict not yet in
    SCORED = "scored"  # a sure verdict: the judge's score counts
    UNSURE = "unsure"  # the verdict waits for a person (its value only a suggestion)
    RETRY = "retry"  # the call failed (provider error, timeout): tried again later, never sent to people for it


class SignInOutcome(StrEnum):
    """A sign-in attempt: written as pending before its password is checked, then settled."""

    PENDING = "pending"
    OK = "ok"
    FAILED = "failed"


class WorkerStatus(StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"


class RunKind(StrEnum):
    """What a run does: learn a library (`train`), write experiences directly (`direct`), or measure the
    effect of each experience of a version (`attribute`)."""

    TRAIN = "train"
    DIRECT = "direct"
    ATTRIBUTE = "attribute"


class EvaluationPurpose(StrEnum):
    """Why an evaluation exists: one a person asked for, a training step's validation gate, or one
    leave-one-out variant of an experience measurement."""

    EVALUATION = "evaluation"
    GATE = "gate"
    ATTRIBUTION = "attribution"


class GateRule(StrEnum):
    """When a training step's candidate library may land (run setting `gate`)."""

    OFF = "off"
    NO_WORSE = "no_worse"
    BETTER = "better"


class GateDecision(StrEnum):
    """What the validation gate found for one step (Step.gate["decision"])."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    # Too many validation queries lack an answer (model-call errors): the gate neither passes nor rejects; in
    # manual review the step waits for the reviewer, in auto review the run fails and a resume measures again.
    UNDECIDED = "undecided"


class OpKind(StrEnum):
    """A library operation, proposed by the learner or made by a person."""

    ADD = "ADD"
    MODIFY = "MODIFY"
    DELETE = "DELETE"
    MERGE = "MERGE"
    KEEP = "KEEP"


# What a worker may pick up and carry on (train --resume, a claim of a job that is not finished).
WORKER_MAY_CONTINUE = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.PAUSED, JobStatus.FAILED, JobStatus.AWAITING_REVIEW, JobStatus.AWAITING_LABELS)
# What a person may press Pause, Resume or Cancel on (as shown, so `stalled` counts).
PERSON_MAY_PAUSE = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.STALLED)
PERSON_MAY_RESUME = (JobStatus.PAUSED, JobStatus.FAILED, JobStatus.STALLED)
PERSON_MAY_CANCEL = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.PAUSED, JobStatus.AWAITING_REVIEW, JobStatus.AWAITING_LABELS, JobStatus.FAILED, JobStatus.STALLED)
# A cancelled evaluation resumes like an incomplete one: its answered rollouts are kept and reused.
EVALUATION_MAY_RESUME = (JobStatus.FAILED, JobStatus.STALLED, JobStatus.INCOMPLETE, JobStatus.CANCELLED)
# What a person may press Cancel on for an evaluation (as shown, so `stalled` counts).
EVALUATION_MAY_CANCEL = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.STALLED, JobStatus.AWAITING_LABELS)
# An evaluation with figures: complete, or incomplete (model-call errors, its figures count answered rollouts).
EVALUATION_HAS_FIGURES = (JobStatus.COMPLETED, JobStatus.INCOMPLETE)
# A job that is not over: it holds or waits for a worker or a person.
ACTIVE = (JobStatus.QUEUED, JobStatus.RUNNING)
UNFINISHED = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.PAUSED, JobStatus.AWAITING_REVIEW, JobStatus.AWAITING_LABELS)
FINISHED = (JobStatus.COMPLETED, JobStatus.INCOMPLETE, JobStatus.FAILED, JobStatus.CANCELLED)

# Runs that learn a library (what the Train and Review pages list); an attribution measures one.
LEARNING_KINDS = (RunKind.TRAIN, RunKind.DIRECT)

# Operation decisions: what a reviewer sets, and what counts as decided-but-not-applied.
DECISIONS = (OperationStatus.APPROVED, OperationStatus.REJECTED)
DECIDED = (OperationStatus.APPROVED, OperationStatus.REJECTED, OperationStatus.EDITED)
TO_APPLY = (OperationStatus.APPROVED, OperationStatus.EDITED)


class DeliveryStatus(StrEnum):
    """A webhook delivery in the outbox (core/records/notifications/webhooks.py): waiting for its (next) attempt, delivered (a 2xx
    answer), or failed: given up after the last attempt, or refused at once (a redirect, an address not allowed)."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
