"""All tables of the studio, in one module (SQLModel tutorial style).

JSON columns hold small structured values (settings, experiences, counters); anything that is
queried or joined on gets its own column.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Column, Index, Integer, Text, UniqueConstraint, false, text
from sqlmodel import AutoString, Field, SQLModel

from storage.statuses import (
    DeliveryStatus,
    EvaluationPurpose,
    GroupStatus,
    JobStatus,
    OperationStatus,
    RunKind,
    SignInOutcome,
    StepStatus,
    WorkerStatus,
)


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime | None) -> datetime | None:
    """A stored time with its zone: SQLite hands back naive datetimes, and they were written in UTC."""
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


def _json(default: Any = None) -> Any:
    """A JSON column; with a default (dict or list) it is NOT NULL, without one (`dict | None`) it may be NULL."""
    factory = (lambda: {}) if default is dict else (lambda: []) if default is list else (lambda: None)
    return Field(default_factory=factory, sa_column=Column(JSON, nullable=default is None))


def _text(nullable: bool = True) -> Any:
    return Field(default=None if nullable else "", sa_column=Column(Text, nullable=nullable))


class Task(SQLModel, table=True):
    """What the agent does, how its answers are scored and which model plays each role."""

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True)
    description: str = ""
    instructions: str = _text(nullable=False)
    answer_format: str = ""
    reward_method: str = "math"
    reward_settings: dict = _json(dict)
    policy_model: str = "local/qwen2.5-coder-0.5b"
    learner_model: str = "local/qwen2.5-coder-0.5b"
    judge_model: str = "local/qwen2.5-coder-0.5b"
    agent_mode: str = "direct"
    # single: one answer per query | conversation: played with personas (core/domain/personas.py). The default is the
    # database's, not SQLAlchemy's, so rows written without the column (older code, migration tests) get it.
    kind: str = Field(default="single", sa_column=Column(AutoString, nullable=False, server_default="single"))
    # A conversation task's user simulator ("" = the policy model) and the most agent turns a conversation has.
    simulator_model: str = Field(default="", sa_column=Column(AutoString, nullable=False, server_default=""))
    max_turns: int = Field(default=4, sa_column=Column(Integer, nullable=False, server_default="4"))
    # Which production traces go to people (core/records/production/traces.py): {"below": score, "share": fraction}.
    production_rules: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False, server_default="{}"))
    # The line above the library in the agent's system prompt and the line that opens its worked examples
    # (core.domain.prompts.LibraryWording); None: the neutral default.
    library_header: str | None = _text()
    examples_intro: str | None = _text()
    created_at: datetime = Field(default_factory=utcnow)


class Persona(SQLModel, table=True):
    """A user a conversation task's simulator plays; core/domain/personas.py checks it (as its Persona model)
    before it is written, and a task's personas are replaced as a whole."""

    __table_args__ = (UniqueConstraint("task_id", "name"),)
    id: int | None = Field(default=None, primary_key=True)
    task_id: int = Field(foreign_key="task.id", index=True)
    name: str
    description: str = _text(nullable=False)
    segment: str
    hidden_facts: list = _json(list)
    created_at: datetime = Field(default_factory=utcnow)


class Sample(SQLModel, table=True):
    """One query of a task, with its optional reference answer or rubric."""

    __table_args__ = (UniqueConstraint("task_id", "external_id"),)
    id: int | None = Field(default=None, primary_key=True)
    task_id: int = Field(foreign_key="task.id", index=True)
    external_id: str
    query: str = _text(nullable=False)
    reference: str | None = _text()
    rubric: str | None = _text()
    split: str = Field(default="train", index=True)
    meta: dict = _json(dict)


class Library(SQLModel, table=True):
    """A named experience library of a task; its content lives in immutable versions."""

    __table_args__ = (UniqueConstraint("task_id", "name"),)
    id: int | None = Field(default=None, primary_key=True)
    task_id: int = Field(foreign_key="task.id", index=True)
    name: str = "default"
    segment: str | None = None  # a conversation task's persona segment this library serves (core/records/library/segments.py)
    # A/B in production (core/records/production/serving.py): a fetch of `production` with a user id is served the
    # version of label `ab_label` for a stable `ab_share` of user ids.
    ab_label: str | None = None
    ab_share: float | None = None
    # Which entries an agent is shown per query (core.domain.selection): `all` (the paper's behaviour) or
    # `top_k`, the `selection_k` most similar to the query by BM25. The defaults repeat core's, which storage
    # may not import; the server default is the k migration 0012 gave the libraries that existed then.
    selection: str = Field(default="all", sa_column=Column(AutoString, nullable=False, server_default="all"))
    selection_k: int = Field(default=2, sa_column=Column(Integer, nullable=False, server_default="3"))
    created_at: datetime = Field(default_factory=utcnow)


class LibraryVersion(SQLModel, table=True):
    """Immutable snapshot: ordered experiences [{"id": "E3", "text": "..."}] and where it came from."""

    __table_args__ = (UniqueConstraint("library_id", "number"),)
    id: int | None = Field(default=None, primary_key=True)
    library_id: int = Field(foreign_key="library.id", index=True)
    number: int
    parent_id: int | None = Field(default=None, foreign_key="libraryversion.id")
    experiences: list = _json(list)
    source: str = "initial"  # initial | run | manual | import | revert | direct
    run_id: int | None = Field(default=None, index=True)  # provenance only: no FK, runs point here too
    step_id: int | None = None
    note: str = ""
    created_by: str = "system"
    created_at: datetime = Field(default_factory=utcnow)


class LibraryLabel(SQLModel, table=True):
    """A movable name (e.g. `production`) that points at one version of a library."""

    __table_args__ = (UniqueConstraint("library_id", "name"),)
    id: int | None = Field(default=None, primary_key=True)
    library_id: int = Field(foreign_key="library.id", index=True)
    name: str
    version_id: int = Field(foreign_key="libraryversion.id")
    moved_by: str = "system"
    moved_at: datetime = Field(default_factory=utcnow)


class Run(SQLModel, table=True):
    """One training run; settings are frozen at creation so a resume repeats the same plan."""

    id: int | None = Field(default=None, primary_key=True)
    task_id: int = Field(foreign_key="task.id", index=True)
    library_id: int = Field(foreign_key="library.id")
    kind: str = RunKind.TRAIN
    start_version_id: int | None = Field(default=None, foreign_key="libraryversion.id")
    current_version_id: int | None = Field(default=None, foreign_key="libraryversion.id")
    settings: dict = _json(dict)
    status: str = Field(default=JobStatus.QUEUED, index=True)
    progress: dict = _json(dict)
    # The queries the validation gate scores candidates on, chosen once when the run first executes.
    validation_ids: list | None = _json()
    heartbeat_at: datetime | None = None
    worker_id: str | None = None
    # The lease generation: every claim (and a person's Resume) adds one, and a worker writes only while the
    # generation it claimed is still the run's (storage/fencing.py).
    lease: int = 0
    error: str | None = _text()
    created_by: str = "cli"
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None


class Step(SQLModel, table=True):
    """One batch of a run: which samples, the library before and after, reward statistics."""

    __table_args__ = (UniqueConstraint("run_id", "epoch", "batch_index"),)
    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id", index=True)
    epoch: int
    batch_index: int
    sample_ids: list = _json(list)
    status: str = StepStatus.RUNNING
    version_before_id: int | None = Field(default=None, foreign_key="libraryversion.id")
    version_after_id: int | None = Field(default=None, foreign_key="libraryversion.id")
    reward_mean: float | None = None
    reward_std: float | None = None
    stats: dict = _json(dict)
    # The validation gate's figures and decision for this step's candidate library (None: no gate ran).
    gate: dict | None = _json()
    error: str | None = _text()
    created_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class Evaluation(SQLModel, table=True):
    """A library version (or the empty library) scored on a split with k samples per query."""

    id: int | None = Field(default=None, primary_key=True)
    task_id: int = Field(foreign_key="task.id", index=True)
    version_id: int | None = Field(default=None, foreign_key="libraryversion.id")
    split: str = "test"
    k: int = 1
    limit: int | None = None
    purpose: str = Field(default=EvaluationPurpose.EVALUATION, index=True)
    # Set for gate and attribution evaluations: exactly these queries, these experiences (a candidate or a
    # leave-one-out variant that is no version), the run (and step) it serves, and the experience left out.
    sample_ids: list | None = _json()
    experiences: list | None = _json()
    run_id: int | None = Field(default=None, index=True)
    step_id: int | None = None
    left_out: str | None = None
    # The entry selection the agent was run with ({"mode", "k"}, core.domain.selection), frozen when the
    # evaluation is made so a resume or a reuse shows the same entries; None (older rows) is `all`.
    selection: dict | None = _json()
    # A segment-routed evaluation: {segment: library version id}; a scenario whose persona's segment is not
    # here uses `version_id` (the default library's version). None: one library for every scenario.
    routes: dict | None = _json()
    model: str = ""
    temperature: float = 0.7
    status: str = Field(default=JobStatus.QUEUED, index=True)
    n: int = 0
    mean_at_k: float | None = None
    pass_at_k: float | None = None
    metrics: dict = _json(dict)
    cost: float = 0.0
    progress: dict = _json(dict)
    heartbeat_at: datetime | None = None
    worker_id: str | None = None
    lease: int = 0  # as Run.lease
    error: str | None = _text()
    created_by: str = "cli"
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None


class Rollout(SQLModel, table=True):
    """One sampled output of the agent, for a training step or an evaluation; at most one per (step or
    evaluation, sample, group index), so a second writer can never add a duplicate."""

    __table_args__ = (
        Index("uq_rollout_step_sample_group", "step_id", "sample_id", "group_index", unique=True,
              sqlite_where=text("step_id IS NOT NULL"), postgresql_where=text("step_id IS NOT NULL")),
        Index("uq_rollout_evaluation_sample_group", "evaluation_id", "sample_id", "group_index", unique=True,
              sqlite_where=text("evaluation_id IS NOT NULL"), postgresql_where=text("evaluation_id IS NOT NULL")),
    )
    id: int | None = Field(default=None, primary_key=True)
    step_id: int | None = Field(default=None, foreign_key="step.id", index=True)
    evaluation_id: int | None = Field(default=None, foreign_key="evaluation.id", index=True)
    sample_id: int = Field(foreign_key="sample.id", index=True)
    group_index: int = 0
    messages: list = _json(list)
    final_answer: str | None = _text()
    response: str | None = _text()
    reward: float | None = None
    reward_source: str | None = None
    reward_detail: str | None = _text()
    summary: str | None = _text()
    # The ids of the library entries the agent was shown, in its prompt's order (the library's selection
    # chose them for this query); None for rollouts stored before selections existed.
    shown_ids: list | None = _json()
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0
    error: str | None = _text()
    # Labeling queue: None (not queued) | needed | done | disputed (labellers disagree; a reviewer decides).
    label_status: str | None = Field(default=None, index=True)
    labels_needed: int = 0
    suggested_reward: float | None = None  # the judge's or verifier's reward before any person's label
    suggested_detail: str | None = _text()
    judge_unsure: bool = False
    # A conversation's rubric: {"criteria": {name: score in [0, 1]}, "rules": [{name, passed, turn, reason}]}
    scores: dict | None = _json()
    created_at: datetime = Field(default_factory=utcnow)


class ConversationTurn(SQLModel, table=True):
    """One turn of a conversation rollout, written as soon as it is spoken, so a killed run resumes the
    conversation where it stopped and pays for no completed turn again. Keyed like its rollout (which is
    written when the conversation ends) plus its position; `role` is seen from the agent's side."""

    __table_args__ = (
        Index("uq_turn_step_sample_group_position", "step_id", "sample_id", "group_index", "position", unique=True,
              sqlite_where=text("step_id IS NOT NULL"), postgresql_where=text("step_id IS NOT NULL")),
        Index("uq_turn_evaluation_sample_group_position", "evaluation_id", "sample_id", "group_index", "position",
              unique=True, sqlite_where=text("evaluation_id IS NOT NULL"),
              postgresql_where=text("evaluation_id IS NOT NULL")),
    )
    id: int | None = Field(default=None, primary_key=True)
    step_id: int | None = Field(default=None, foreign_key="step.id", index=True)
    evaluation_id: int | None = Field(default=None, foreign_key="evaluation.id", index=True)
    sample_id: int = Field(foreign_key="sample.id")
    group_index: int = 0
    position: int
    role: str
    text: str = _text(nullable=False)
    tokens_in: int = 0
    tokens_out: int = 0
    ended: bool = False
    created_at: datetime = Field(default_factory=utcnow)


class RewardLabel(SQLModel, table=True):
    """A person's reward for a rollout; every label is kept. `kind` is `label` (one labeller's score)
    or `decision` (a reviewer settling a disagreement, which then counts over the labels)."""

    id: int | None = Field(default=None, primary_key=True)
    rollout_id: int = Field(foreign_key="rollout.id", index=True)
    value: float
    comment: str = ""
    labeler: str = "local"
    kind: str = "label"
    scores: dict | None = _json()  # a conversation label's score per rubric criterion (raw, on its scale)
    created_at: datetime = Field(default_factory=utcnow)


class Advantage(SQLModel, table=True):
    """The semantic advantage of one group (one per step and sample): the learner's lessons and its raw reply."""

    __table_args__ = (UniqueConstraint("step_id", "sample_id"),)
    id: int | None = Field(default=None, primary_key=True)
    step_id: int = Field(foreign_key="step.id", index=True)
    sample_id: int = Field(foreign_key="sample.id")
    status: str = GroupStatus.OK
    text: str | None = _text()
    proposals: list = _json(list)
    raw_response: str | None = _text()
    error: str | None = _text()
    created_at: datetime = Field(default_factory=utcnow)


class Operation(SQLModel, table=True):
    """One proposed library change and the decision on it; a step's operations are numbered by position."""

    __table_args__ = (UniqueConstraint("step_id", "position"),)
    id: int | None = Field(default=None, primary_key=True)
    step_id: int | None = Field(default=None, foreign_key="step.id", index=True)
    run_id: int | None = Field(default=None, foreign_key="run.id", index=True)
    position: int = 0
    op: str  # ADD | MODIFY | DELETE | MERGE | KEEP
    target_ids: list = _json(list)
    text: str | None = _text()
    rationale: str | None = _text()
    source_advantage_ids: list = _json(list)
    status: str = Field(default=OperationStatus.PENDING, index=True)
    validation_error: str | None = _text()
    reviewer: str | None = None
    reason: str | None = None  # why a decision was made by the engine, e.g. `validation` (the gate)
    decided_at: datetime | None = None
    comment: str | None = _text()
    applied_version_id: int | None = Field(default=None, foreign_key="libraryversion.id")
    created_at: datetime = Field(default_factory=utcnow)


class LLMCall(SQLModel, table=True):
    """The ledger of every model call; successful rows double as the response cache."""

    id: int | None = Field(default=None, primary_key=True)
    run_id: int | None = Field(default=None, foreign_key="run.id", index=True)
    evaluation_id: int | None = Field(default=None, foreign_key="evaluation.id", index=True)
    stage: str = Field(index=True)  # rollout | summary | advantage | update | judge | direct
    model: str
    cache_key: str = Field(index=True)
    request: dict = _json(dict)
    response: str | None = _text()
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0
    cache_hit: bool = False
    attempts: int = 1
    error: str | None = _text()
    # How a structured reply was read: parsed | repaired (json-repair mended it) | malformed; None when no JSON was asked
    reply_status: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    connection: str | None = None  # the model connection the call went through (core/records/models/connections.py)
    # the production trace a judge call scored (no foreign key: adding one would rebuild the ledger on SQLite)
    trace_id: int | None = Field(default=None, index=True)


class AuditEvent(SQLModel, table=True):
    """Who did what to what, and when, with the state before and after."""

    id: int | None = Field(default=None, primary_key=True)
    actor: str
    action: str = Field(index=True)
    object_type: str
    object_id: int | None = None
    before: dict | None = _json()
    after: dict | None = _json()
    created_at: datetime = Field(default_factory=utcnow)


class User(SQLModel, table=True):
    """A person who signs in; the password is kept only as a salted scrypt hash."""

    # One provider identity is one person: two first sign-ins at once cannot both bind it (core/records/people/oidc.py).
    __table_args__ = (Index("ux_user_identity", "issuer", "subject", unique=True),)

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True)
    role: str = "labeler"  # none | labeler | reviewer | admin (core/domain/roles.py)
    password_hash: str  # "" for a person who signs in only through the OpenID Connect provider
    active: bool = True
    created_by: str = "cli"
    created_at: datetime = Field(default_factory=utcnow)
    # The provider's identity (core/records/people/oidc.py, provider_sign_in): the verified email the studio knows the
    # person by (lower case), and the issuer and subject recorded at their first sign-in through the provider.
    email: str | None = Field(default=None, index=True, unique=True)
    issuer: str | None = None
    subject: str | None = None
    # The issue time (iat, epoch seconds) of the ID token whose sign-in the audit log has: a page load of the same
    # sign-in writes no second `user.sign_in`.
    provider_iat: int | None = None


class SignInAttempt(SQLModel, table=True):
    """One sign-in attempt, written before its password is checked: the back-off counts these rows, so
    attempts running at the same time count each other. Kept only as long as the back-off looks back."""

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True)  # the user name typed, known or not
    client: str = Field(default="", index=True)  # e.g. "ip:203.0.113.7", "tab:<hash>"; "" for the command line
    outcome: str = SignInOutcome.PENDING
    created_at: datetime = Field(default_factory=utcnow, index=True)


class Worker(SQLModel, table=True):
    """A worker process that executes queued runs and evaluations; its heartbeat says it is alive."""

    id: str = Field(primary_key=True)
    host: str = ""
    pid: int = 0
    status: str = WorkerStatus.RUNNING
    current: str | None = None  # e.g. "run 3" or "evaluation 5"
    started_at: datetime = Field(default_factory=utcnow)
    heartbeat_at: datetime = Field(default_factory=utcnow)


class ApiKey(SQLModel, table=True):
    """A key a live agent sends to the HTTP API. Only its sha256 is kept (the key is 32 random bytes, so a
    slow hash adds nothing); `prefix` is what the People page shows to tell keys apart."""

    id: int | None = Field(default=None, primary_key=True)
    name: str
    role: str = "read"  # read | ingest (core/records/keys/api_keys.py)
    prefix: str
    key_hash: str = Field(index=True, unique=True)
    created_by: str = "cli"
    created_at: datetime = Field(default_factory=utcnow)
    revoked_by: str | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None
    person: str | None = None  # the user the key acts for: it carries at most their role, checked at every request
    # where an ingest key writes (core/records/keys/api_keys.py): its task (and library), whatever a trace or span
    # names; an ingest key with no task writes anywhere only when an admin chose that (any_task)
    task_id: int | None = None  # no foreign key: SQLite cannot add one to a table others reference
    library: str | None = None
    any_task: bool = Field(default=False, sa_column=Column(Boolean, nullable=False, server_default=false()))


class Trace(SQLModel, table=True):
    """One production interaction a live agent sent back: what it was asked, what it answered (or the
    conversation), with the version that served it and whatever score or feedback came with it.
    `client_id` is the sender's id; a task stores each once, so a retried post changes nothing."""

    __table_args__ = (UniqueConstraint("task_id", "client_id"),)
    id: int | None = Field(default=None, primary_key=True)
    task_id: int = Field(foreign_key="task.id", index=True)
    client_id: str
    library_id: int = Field(foreign_key="library.id")
    # None: an OTLP span whose version was neither named nor recognised ("unknown version", never guessed)
    version_id: int | None = Field(default=None, foreign_key="libraryversion.id", index=True)
    served_label: str | None = None  # the label the agent asked by (its A/B arm), if it said
    input: str = _text(nullable=False)
    output: str | None = _text()
    turns: list | None = _json()
    score: float | None = None
    thumbs: int | None = None  # 1 up, -1 down
    comment: str | None = _text()
    segment: str | None = Field(default=None, index=True)
    user_id: str | None = None
    meta: dict = _json(dict)
    created_at: datetime = Field(default_factory=utcnow, index=True)  # when the agent logged it
    received_at: datetime = Field(default_factory=utcnow)
    api_key_id: int | None = Field(default=None, foreign_key="apikey.id")
    label_status: str | None = Field(default=None, index=True)  # needed | done: the task's labelling rules
    label_value: float | None = None  # a person's score in [0, 1]
    labelled_by: str | None = None
    sample_id: int | None = Field(default=None, foreign_key="sample.id")  # the train sample it was harvested into
    # the task's own reward scoring it in the worker (core/records/production/scoring.py): None (not considered
    # yet) | skipped (its rules did not choose it) | judging (claimed by judge_claim at judged_at) | scored | unsure
    # | retry (its call failed)
    judge_status: str | None = Field(default=None, index=True)
    judge_score: float | None = None  # counts only when scored; an unsure one is the suggestion a person sees
    judge_detail: str | None = _text()
    judge_claim: str | None = None
    judged_at: datetime | None = None
    # a failed judge call (provider error, timeout): status retry, tried again at judge_retry_at (back-off), never
    # sent to people for it; judge_failed_at is the first failure of the current run of failures
    judge_attempts: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    judge_retry_at: datetime | None = None
    judge_failed_at: datetime | None = None
    # The A/B experiment running when it arrived (core/records/production/ab_experiments.py; no FK, like run_id: provenance), the
    # arm the studio serves its user there, and why it does not count in that experiment (None: it counts).
    ab_experiment_id: int | None = Field(default=None, index=True)
    ab_arm: str | None = None
    ab_excluded: str | None = None


class AbExperiment(SQLModel, table=True):
    """One A/B experiment: a library's split of production traffic from its start to its end, with the versions its
    arms served throughout (core/records/production/ab_experiments.py). A label move or a change of the split ends it."""

    id: int | None = Field(default=None, primary_key=True)
    task_id: int = Field(foreign_key="task.id", index=True)
    library_id: int = Field(foreign_key="library.id", index=True)
    candidate_label: str
    share: float  # of user ids served the candidate
    production_version_id: int = Field(foreign_key="libraryversion.id")
    candidate_version_id: int = Field(foreign_key="libraryversion.id")
    started_at: datetime = Field(default_factory=utcnow)
    started_by: str = "system"
    ended_at: datetime | None = None
    ended_by: str | None = None
    end_reason: str | None = _text()
    # SQL NULL, not JSON null, while unset: the guard marks `decided` once with a conditional UPDATE (IS NULL)
    final: dict | None = Field(default=None, sa_column=Column(JSON(none_as_null=True), nullable=True))  # when it ended
    decided: dict | None = Field(default=None, sa_column=Column(JSON(none_as_null=True), nullable=True))  # ab.decided


class OtlpService(SQLModel, table=True):
    """An OpenTelemetry service (its resource's `service.name`) mapped on the Production page to the task and
    library its spans are stored under, for spans that name no task themselves (core/records/production/otlp.py)."""

    service_name: str = Field(primary_key=True, max_length=300)
    task_id: int = Field(foreign_key="task.id", index=True)
    library: str = "default"
    created_by: str = "cli"
    created_at: datetime = Field(default_factory=utcnow)


class OtlpResource(SQLModel, table=True):
    """An OTLP resource's attributes (service, host, process, SDK) stored once, by the sha256 of their JSON:
    a span's trace refers to it (`meta.otlp.resource_hash`), so a resource is never copied into every span."""

    hash: str = Field(primary_key=True, max_length=64)
    attributes: dict = _json(dict)
    created_at: datetime = Field(default_factory=utcnow)


class OtlpHeldSpan(SQLModel, table=True):
    """A span received over OTLP but not yet a trace (core/records/production/otlp_held.py): its service maps to no task
    (`unmapped`, it lands when the service is mapped) or it carries a model call with no message the studio can
    read (`unreadable`, shown with its attributes). Bounded per service by count and age; the dropped are
    counted."""

    __table_args__ = (UniqueConstraint("client_id"),)
    id: int | None = Field(default=None, primary_key=True)
    service: str = Field(index=True, max_length=300)
    reason: str = Field(max_length=20)  # unmapped | unreadable
    client_id: str = Field(max_length=80)
    span: dict = _json(dict)  # the span as read (core/domain/otlp_spans.py SpanTrace), its resource by hash
    api_key_id: int | None = Field(default=None, foreign_key="apikey.id")
    received_at: datetime = Field(default_factory=utcnow, index=True)


class ApiCounter(SQLModel, table=True):
    """A count every API process shares, so N processes allow the configured rate in total: a key's request
    allowance (`key:<id>`, a token bucket: `value` tokens left at `updated_at`), or the unknown-key refusals
    from one client address not yet audited (`refused:<address>`, `updated_at` when they last were)."""

    name: str = Field(primary_key=True, max_length=300)
    value: float = 0.0
    updated_at: float = 0.0  # seconds since the epoch (time.time()), comparable across processes


class ModelConnection(SQLModel, table=True):
    """Where a model is served and how it is reached, named once: a model is then `<name>/<model>`.
    `kind` openai: an OpenAI-compatible server at `base_url` (vLLM, SGLang, Ollama, llama.cpp, LM Studio, a
    gateway); litellm: a provider litellm knows (`provider`). `key_env` names the environment variable that
    holds the API key: the key itself is never stored or shown."""

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True, max_length=60)
    kind: str  # openai | litellm
    base_url: str | None = None
    provider: str | None = None
    key_env: str | None = None
    params: dict = _json(dict)
    created_by: str = "cli"
    created_at: datetime = Field(default_factory=utcnow)


class WebhookEndpoint(SQLModel, table=True):
    """A receiver an administrator configured (core/records/notifications/webhooks.py): its URL, the events it hears (empty: all)
    and the Standard Webhooks secret that signs what it gets. The secret must be stored to sign: `secret` holds it
    encrypted (core.secrets.seal), it is shown once when created and never on a page, in a log or in a list;
    `secret_env` instead names an environment variable that holds it (then nothing secret is stored)."""

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True, max_length=60)
    url: str = _text(nullable=False)
    events: list = _json(list)
    secret: str | None = None
    secret_env: str | None = None
    active: bool = True
    created_by: str = "cli"
    created_at: datetime = Field(default_factory=utcnow)
    busy_by: str | None = None  # the worker delivering to it now, until busy_until (one at a time, in order)
    busy_until: datetime | None = None
    probed_at: datetime | None = None  # its waiting head delivery last tried early (core/records/notifications/webhooks.py)


class WebhookDelivery(SQLModel, table=True):
    """One event for one endpoint: the outbox row written in the transaction of the change that raised it, then
    its delivery log (attempts, the last answer's code or error). A replay is a new row with the same
    `message_id` (the webhook-id receivers deduplicate by) and `replay_of` pointing at the first."""

    id: int | None = Field(default=None, primary_key=True)
    endpoint_id: int = Field(foreign_key="webhookendpoint.id", index=True)
    message_id: str = Field(index=True)
    event_type: str
    payload: dict = _json(dict)
    status: str = Field(default=DeliveryStatus.PENDING, index=True)
    attempts: int = 0
    next_attempt_at: datetime = Field(default_factory=utcnow)
    last_code: int | None = None
    last_error: str | None = _text()
    replay_of: int | None = None
    created_at: datetime = Field(default_factory=utcnow)
    delivered_at: datetime | None = None
    claimed_by: str | None = None  # the one sender of its attempt now (a worker's pass or a Test), until claimed_until
    claimed_until: datetime | None = None
    dismissed_at: datetime | None = None  # a given-up delivery whose notice a person dismissed
