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


class StepStatus(StrEnum):
    RUNNING = "running"
    AWAITING_REVIEW = "awaiting_review"
    AWAITING_LABELS = "awaiting_labels"
    COMPLETED = "completed"


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


class WorkerStatus(StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"


class RunKind(StrEnum):
    TRAIN = "train"
    DIRECT = "direct"


class OpKind(StrEnum):
    """A library operation, proposed by the learner or made by a person."""

    ADD = "ADD"
    MODIFY = "MODIFY"
    DELETE = "DELETE"
    MERGE = "MERGE"
    KEEP = "KEEP"


J, O = JobStatus, OperationStatus

# What a worker may pick up and carry on (train --resume, a claim of a job that is not finished).
WORKER_MAY_CONTINUE = (J.QUEUED, J.RUNNING, J.PAUSED, J.FAILED, J.AWAITING_REVIEW, J.AWAITING_LABELS)
# What a person may press Pause, Resume or Cancel on (as shown, so `stalled` counts).
PERSON_MAY_PAUSE = (J.QUEUED, J.RUNNING, J.STALLED)
PERSON_MAY_RESUME = (J.PAUSED, J.FAILED, J.STALLED)
PERSON_MAY_CANCEL = (J.QUEUED, J.RUNNING, J.PAUSED, J.AWAITING_REVIEW, J.AWAITING_LABELS, J.FAILED, J.STALLED)
EVALUATION_MAY_RESUME = (J.FAILED, J.STALLED)
# A job that is not over: it holds or waits for a worker or a person.
ACTIVE = (J.QUEUED, J.RUNNING)
UNFINISHED = (J.QUEUED, J.RUNNING, J.PAUSED, J.AWAITING_REVIEW, J.AWAITING_LABELS)
FINISHED = (J.COMPLETED, J.FAILED, J.CANCELLED)

# Operation decisions: what a reviewer sets, and what counts as decided-but-not-applied.
DECISIONS = (O.APPROVED, O.REJECTED)
DECIDED = (O.APPROVED, O.REJECTED, O.EDITED)
TO_APPLY = (O.APPROVED, O.EDITED)
