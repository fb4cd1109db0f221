"""The labeling queue: people score rollouts where no automatic check decides.

A rollout enters the queue (`label_status="needed"`) when its task's reward method is `human`, or
`judge_human` and the judge was unsure or the rollout fell in the spot-check share. It needs
`labels_needed` labels from different people. When they agree, that value is the reward; when
they disagree, the mean stands in, the rollout is `disputed`, and a reviewer's decision settles
it. Every label is kept (RewardLabel), a person's newest label counts, and a label on a rollout
outside the queue overrides its automatic reward. A label from the queue is written once per person and
rollout (`once=True`): a doubled or stale key press in the page cannot count twice. When the last rollout of a waiting training
step or evaluation is labelled, that job goes back in the queue and a worker continues it.

A conversation task scored by a rubric (reward method `rubric`) is labelled per criterion
(`submit_criteria_label`): a person gives each criterion a score on its own scale, the label keeps those
raw scores (RewardLabel.scores) and its value is their weighted mean (core.domain.rubric.score_transcript), except
that a must-rule the task checks with a pattern (a `regex` rule) and found broken keeps the value at 0: that
check is mechanical, the same for every rollout, and a wrong pattern is fixed in the task, not label by
label. A rule the judge was asked about (a `judge` rule, e.g. a scenario's must / must-not) is the judge's
opinion, and the person's label replaces it: their value is the weighted mean whatever the judge said
about it (the queue item shows every failed rule, so the person sees what the judge found).

Labels agree when they lie within half a step of their scale of each other: on a scale's own points that
means the same point; a rubric task's weighted means are compared on the five-point grid 0, .25, .5, .75,
1 (the grid a reviewer's single-value decision on such a task uses), so they agree within an eighth and
their mean is the reward. Kappa counts a rubric label at its nearest grid point.
"""

from __future__ import annotations

import hashlib
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import combinations

from sqlalchemy import update
from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.domain.conversation import SPEAKERS
from core.domain.rewards import METHODS, RubricSettings
from core.domain.rubric import Criterion, scale_point, score_transcript
from core.errors import InvalidInput, NotFound
from core.models.conversation_judge import criteria_of, rubric_settings
from core.models.judge import GENERIC_ANCHORS, SCALES, choices, scale_of, score_of, to_value
from core.records.notifications.events import notify_dispute, notify_labels_waiting
from core.records.people.roles import require_role
from core.records.tasks.scenarios import is_conversation, scenario_of
from storage import queries
from storage.db import session_scope
from storage.statuses import JobStatus, LabelStatus, StepStatus
from storage.tables import AuditEvent, Evaluation, RewardLabel, Rollout, Run, Sample, Step, Task

WAITING = JobStatus.AWAITING_LABELS
ACCEPTED = "accepted the judge's suggestion"
RUBRIC_LABEL_SCALE = "1-5"  # the grid a rubric task's labels are compared on, and its decisions are made on


# ---- entering the queue (called while a rollout is scored) ------------------------------------------------


def labels_per_rollout(task: Task) -> int:
    return max(1, int((task.reward_settings or {}).get("labels_per_rollout", 1) or 1))


def spot_check_share(task: Task) -> float:
    return min(1.0, max(0.0, float((task.reward_settings or {}).get("spot_check_share", 0.2) or 0.0)))


def spot_checked(task: Task, key: str) -> bool:
    """Whether this rollout is in the task's spot-check share; a hash, so a resumed run chooses the same."""
    digest = hashlib.sha256(f"{task.id}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < spot_check_share(task)


def needs_person(task: Task, unsure: bool, key: str) -> bool:
    """People label every rollout of a method without the judge, else the unsure ones and a spot-check share."""
    if not is_person_method(task):
        return False
    return not METHODS[task.reward_method].uses_judge or unsure or spot_checked(task, key)


# ---- reading the queue ------------------------------------------------------------------------------------


@dataclass
class QueueItem:
    """One rollout to label, with everything a labeller needs to decide."""

    rollout: Rollout
    sample: Sample
    scale: str
    choices: list[tuple[int, float]]
    labels_so_far: int
    conversation: ConversationView | None = None  # a conversation task's scenario, turns and criteria


@dataclass(frozen=True)
class CriterionChoice:
    """One rubric criterion as the labelling form asks for it: what each point of its scale means, and
    the judge's raw score of it (None when the judge gave none)."""

    name: str
    description: str
    scale: str
    weight: float
    anchors: dict[int, str]
    suggested: int | None = None


@dataclass(frozen=True)
class RuleFinding:
    """A rule the judge found broken. `turn` is 1-based as the transcript numbers turns (None: no one
    turn); `holds_reward` says the rule is checked by its pattern, so the reward stays 0 whatever a person
    scores, while a judge-asked rule is the judge's opinion, which a person's label replaces."""

    name: str
    kind: str
    turn: int | None
    reason: str
    holds_reward: bool


@dataclass(frozen=True)
class ConversationView:
    """What a person reads to label a conversation: the scenario, the turns as (speaker, text) with the
    speaker `User` or `Agent`, the rubric's criteria (empty when the task is not scored by a rubric, then
    a conversation is labelled with one score like any rollout) and the rules the judge found broken."""

    persona: str
    opening: str
    goal: str
    must: list[str]
    must_not: list[str]
    turns: list[tuple[str, str]]
    criteria: list[CriterionChoice]
    failed_rules: list[RuleFinding]

    @property
    def suggested_scores(self) -> dict[str, int] | None:
        """The judge's raw score of every criterion, or None when it did not score them all."""
        scores = {c.name: c.suggested for c in self.criteria}
        return scores if self.criteria and None not in scores.values() else None


@dataclass
class Progress:
    """A task's queue by label status, and one person's share of it when a labeller is given.

    `mine_waiting` counts the rollouts this person labelled that still wait for someone else's label
    (their `labels_needed` is not reached), so a labeller sees their part is finished though the queue is not.
    """

    needed: int = 0
    done: int = 0
    disputed: int = 0
    mine_to_do: int = 0
    mine_done: int = 0
    mine_waiting: int = 0

    @property
    def total(self) -> int:
        return self.needed + self.done + self.disputed

    @property
    def complete(self) -> int:
        """Rollouts with every label they need; a disputed one is complete, it waits for a reviewer, not a labeller."""
        return self.done + self.disputed


def next_item(session: Session, task: Task, labeler: str, skip: tuple[int, ...] | list[int] = ()) -> QueueItem | None:
    """The oldest queued rollout this person has not labelled; skipped ones come last, not never."""
    open_ = queries.rollouts_to_label(session, task.id, labeler)
    if not open_:
        return None
    fresh = [r for r in open_ if r.id not in set(skip)]
    rollout = fresh[0] if fresh else open_[0]
    scale = label_scale(task)
    sample = session.get(Sample, rollout.sample_id)
    return QueueItem(rollout, sample, scale, choices(scale),
                     labels_so_far=len(queries.latest_labels(session, rollout.id)),
                     conversation=conversation_view(task, sample, rollout))


def is_rubric(task: Task) -> bool:
    """Whether the task's reward is a rubric of criteria, so a person labels it per criterion."""
    method = METHODS.get(task.reward_method)
    return method is not None and issubclass(method.settings_model, RubricSettings)


def label_scale(task: Task) -> str:
    """The scale labels of this task are compared on (and single values are checked against): the judge's
    scale, or for a rubric task, whose labels are weighted means, the five-point grid 0, .25, .5, .75, 1."""
    return RUBRIC_LABEL_SCALE if is_rubric(task) else scale_of(task)


def label_score(task: Task, value: float | None) -> float | None:
    """A label's value (or a reward) on the scale this task's labellers press, to two decimals, for showing:
    4 for 0.75 on 1-5, 1 for 1 on binary, 2.75 for a rubric label's weighted mean of 0.4375."""
    return None if value is None else round(scale_point(value, label_scale(task)), 2)


def criterion_choices(task: Task, rollout: Rollout | None = None) -> list[CriterionChoice]:
    """The task's criteria with their anchors (core.models.judge's generic words for the scale) and, given a
    rollout the judge scored, its raw score of each; empty when the task is not scored by a rubric."""
    if not is_rubric(task):
        return []
    judged = ((rollout.scores if rollout is not None else None) or {}).get("criteria") or {}
    found = []
    for criterion in criteria_of(task):
        value = judged.get(criterion.name)
        suggested = score_of(value, criterion.scale) if isinstance(value, int | float) and 0 <= value <= 1 else None
        found.append(CriterionChoice(criterion.name, criterion.description, criterion.scale, criterion.weight,
                                     dict(GENERIC_ANCHORS[criterion.scale]), suggested))
    return found


def _regex_rules(task: Task) -> set[str]:
    """The names of the task's rules checked by a pattern (a scenario's own rules are all judge rules)."""
    if not is_rubric(task):
        return set()
    return {rule.name for rule in rubric_settings(task).rules if rule.check == "regex"}


def failed_rules(task: Task, rollout: Rollout) -> list[RuleFinding]:
    """The rules the judge recorded as broken on this rollout (Rollout.scores["rules"]), in its order."""
    regex = _regex_rules(task)
    found = []
    for rule in (rollout.scores or {}).get("rules") or []:
        if not isinstance(rule, dict) or rule.get("passed") is not False:
            continue
        turn = rule.get("turn")
        name = str(rule.get("name") or "?")
        found.append(RuleFinding(name, str(rule.get("kind") or "must"),
                                 turn + 1 if isinstance(turn, int) else None, str(rule.get("reason") or ""),
                                 holds_reward=name in regex))
    return found


def transcript_turns(rollout: Rollout) -> list[tuple[str, str]]:
    """A conversation's turns as (speaker, text), `User` or `Agent`, without the agent's system prompt;
    the stored transcript text as one turn when the messages were not kept."""
    turns = [(SPEAKERS[m.get("role")], str(m.get("content") or "") or "(empty message)")
             for m in rollout.messages or [] if isinstance(m, dict) and m.get("role") in SPEAKERS]
    if not turns and rollout.response:
        return [("Transcript", rollout.response)]
    return turns


def conversation_view(task: Task, sample: Sample, rollout: Rollout) -> ConversationView | None:
    """A conversation rollout as a person labels it (None for a single-reply task)."""
    if not is_conversation(task):
        return None
    scenario = scenario_of(sample)
    return ConversationView(persona=scenario.persona, opening=scenario.opening, goal=scenario.goal,
                            must=list(scenario.must), must_not=list(scenario.must_not),
                            turns=transcript_turns(rollout), criteria=criterion_choices(task, rollout),
                            failed_rules=failed_rules(task, rollout))


def progress(session: Session, task: Task, labeler: str | None = None) -> Progress:
    """The task's queue counts and, for `labeler`, what they labelled, what waits on others and what is left."""
    queued = queries.queued_rollouts(session, task.id)
    counts = Counter(r.label_status for r in queued)
    result = Progress(needed=counts.get(LabelStatus.NEEDED, 0), done=counts.get(LabelStatus.DONE, 0),
                      disputed=counts.get(LabelStatus.DISPUTED, 0))
    if labeler:
        labels = queries.latest_labels_of_task(session, task.id)
        for rollout in queued:
            mine, open_ = labeler in labels.get(rollout.id, {}), rollout.label_status == LabelStatus.NEEDED
            result.mine_done += mine
            result.mine_waiting += mine and open_
            result.mine_to_do += open_ and not mine
    return result


# ---- writing labels ---------------------------------------------------------------------------------------


def _check_value(task: Task, value: float) -> float:
    allowed = [v for _, v in choices(label_scale(task))]
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"a label is a number, got {value!r}") from None
    if not any(abs(value - v) < 1e-9 for v in allowed):
        shown = ", ".join(f"{v:g}" for v in allowed)
        raise InvalidInput(f"a label on this task's scale is one of {shown}, got {value:g}")
    return value


def _context(session: Session, rollout_id: int) -> tuple[Rollout, Task]:
    rollout = session.get(Rollout, rollout_id)
    if rollout is None:
        raise NotFound(f"no rollout {rollout_id}")
    if rollout.error is not None:
        raise InvalidInput(f"rollout {rollout_id} failed ({rollout.error[:80]}); there is no answer to label")
    sample = session.get(Sample, rollout.sample_id)
    return rollout, session.get(Task, sample.task_id)


def agree(values: list[float], scale: str) -> bool:
    """Whether labels agree: all within half a step of the scale of each other (on the scale's own points,
    the same point; per-criterion labels, which fall between the points, within an eighth on 1-5)."""
    low, high = SCALES[scale]
    return max(values) - min(values) <= 0.5 / (high - low) + 1e-9


def _settle(session: Session, rollout: Rollout, task: Task) -> None:
    """Set the rollout's reward and status from its labels (a decision beats the labels)."""
    history = queries.label_history(session, rollout.id)
    decisions = [h for h in history if h.kind == "decision"]
    labels = {h.labeler: h for h in history if h.kind == "label"}  # each person's newest label
    if rollout.suggested_reward is None and rollout.label_status is None and rollout.reward is not None:
        rollout.suggested_reward, rollout.suggested_detail = rollout.reward, rollout.reward_detail
    if decisions:
        last = decisions[-1]
        rollout.reward, rollout.label_status = last.value, LabelStatus.DONE
        rollout.reward_source, rollout.reward_detail = "human", f"decided by {last.labeler}: {last.value:g}"
        return
    values = [label.value for label in labels.values()]
    needed = rollout.labels_needed or 1
    if len(values) < needed:
        rollout.label_status = LabelStatus.NEEDED
        return
    agreed = agree(values, label_scale(task))
    rollout.reward = values[0] if len(set(values)) == 1 else statistics.fmean(values)
    rollout.reward_source = "human"
    who = ", ".join(f"{name} {label.value:g}" for name, label in labels.items())
    rollout.reward_detail = f"labelled by {who}" + ("" if agreed else " (disagree: mean until a reviewer decides)")
    notify_dispute(session, rollout, task, agreed)
    rollout.label_status = LabelStatus.DONE if agreed else LabelStatus.DISPUTED


@dataclass
class Labelled:
    """A rollout after a label, and whether that label sent its waiting run or evaluation back to the queue.

    `repeated` says nothing was written: the person had labelled this rollout already and asked for once only.
    """

    rollout: Rollout
    released: bool
    repeated: bool = False


def _criteria_value(task: Task, rollout: Rollout, scores: object, *,
                    judge_rules: bool = False) -> tuple[float, dict[str, int]]:
    """A per-criterion label's value and its raw scores, in the rubric's order, after checking them: every
    criterion of the task scored, each on its own scale, and no other. The value is the weighted mean,
    or 0 when a pattern-checked rule was found broken (and, with `judge_rules`, when any rule was: the
    judge's whole verdict, as accepting it takes it)."""
    if not is_rubric(task):
        raise InvalidInput(f"task {task.name!r} is not scored by a rubric (its reward method is "
                           f"{task.reward_method}); label it with one score")
    if not isinstance(scores, dict) or not scores:
        raise InvalidInput("a per-criterion label needs a score for each criterion, as {criterion: score}")
    named = [name for name in scores if not isinstance(name, str)]
    if named:
        raise InvalidInput(f"criteria are named by text, got {', '.join(map(repr, named))}")
    criteria: list[Criterion] = criteria_of(task)
    reward, _normalised = score_transcript(scores, criteria)
    raw = {criterion.name: int(scores[criterion.name]) for criterion in criteria}
    broken = [rule for rule in failed_rules(task, rollout) if rule.holds_reward or judge_rules]
    return (0.0 if broken else reward), raw


def _write(engine: Engine, rollout_id: int, value: float | None, actor: str, comment: str, kind: str,
           once: bool = False, scores: dict | None = None, judge_rules: bool = False) -> Labelled:
    """Write one label or decision: a single value on the task's scale, or with `scores` a per-criterion
    label whose value comes from them (see _criteria_value)."""
    with session_scope(engine) as session:
        rollout, task = _context(session, rollout_id)
        if kind == "decision":
            require_role(session, actor, "reviewer", "deciding a disputed label")
        else:
            require_role(session, actor, "labeler", "labelling rollouts")
        if scores is None:
            value = _check_value(task, value)
        else:
            value, scores = _criteria_value(task, rollout, scores, judge_rules=judge_rules)
        if once and actor in queries.latest_labels(session, rollout_id):
            session.expunge(rollout)
            return Labelled(rollout, released=False, repeated=True)
        before = {"reward": rollout.reward, "source": rollout.reward_source, "label_status": rollout.label_status}
        session.add(RewardLabel(rollout_id=rollout_id, value=value, comment=(comment or "").strip()[:2000],
                                labeler=actor, kind=kind, scores=scores))
        session.flush()
        _settle(session, rollout, task)
        session.add(rollout)
        after = {"reward": rollout.reward, "label_status": rollout.label_status, "value": value,
                 "comment": comment or ""}
        if scores is not None:
            after["scores"] = scores
        session.add(AuditEvent(actor=actor, action=f"rollout.{kind}", object_type="rollout", object_id=rollout_id,
                               before=before, after=after))
        step_id, evaluation_id = rollout.step_id, rollout.evaluation_id
    released = release_if_labelled(engine, step_id=step_id, evaluation_id=evaluation_id, actor=actor)
    with Session(engine) as session:
        return Labelled(session.get(Rollout, rollout_id), released)


def submit_label(engine: Engine, rollout_id: int, value: float, actor: str, comment: str = "", *,
                 once: bool = False) -> Labelled:
    """Record one person's score for a rollout (a labeller or above); their newest label counts.

    With `once`, a second label by the same person on the same rollout writes nothing (`repeated`): the
    queue never offers a rollout twice, so a second one from there is a doubled key press, not a correction.
    On a rubric task the value is a point of the five-point grid 0, .25, .5, .75, 1; the queue asks for
    a score per criterion instead (submit_criteria_label).
    """
    return _write(engine, rollout_id, value, actor, comment, "label", once)


def submit_criteria_label(engine: Engine, rollout_id: int, scores: dict[str, int], labeler: str,
                          comment: str = "", *, once: bool = False) -> Labelled:
    """Record one person's per-criterion label of a conversation scored by a rubric: `scores` gives every
    criterion of the task a whole number on its scale (binary 0-1, 1-5), and no unknown criterion
    (InvalidInput names what is wrong). The label keeps the raw scores; its value is their weighted mean,
    the reward a judge's same scores would give, with one exception: a rule the task checks by a pattern
    and found broken keeps the value at 0. The person overrides the judge-asked rules (a scenario's must /
    must-not): their label says how good the conversation was, not whether the judge was right about a
    rule. From there it is a label like any other: same role (labeller), same audit, same `once`,
    agreement, disputes, and the waiting run or evaluation queued again when the last label lands.
    """
    return _write(engine, rollout_id, None, labeler, comment, "label", once, scores=scores)


def accept_suggestion(engine: Engine, rollout_id: int, actor: str, comment: str = "") -> Labelled:
    """Take the judge's (or verifier's) suggested reward as this person's label, once, at the scale point
    nearest to it; the comment says it was accepted, so labels that only echo the judge can be told apart.

    On a rubric task the judge's per-criterion scores become the person's per-criterion label, with the
    judge's whole verdict: a rule it found broken keeps the value at 0, as in its suggestion."""
    with Session(engine) as session:
        rollout, task = _context(session, rollout_id)
        if rollout.suggested_reward is None:
            raise InvalidInput(f"rollout {rollout_id} has no suggested reward to accept")
        rubric = is_rubric(task)
        if rubric:
            scores = {c.name: c.suggested for c in criterion_choices(task, rollout)}
            if None in scores.values():
                missing = ", ".join(name for name, score in scores.items() if score is None)
                raise InvalidInput(f"the judge did not score criteria {missing} of rollout {rollout_id}; "
                                   "score them yourself")
        else:
            scale = scale_of(task)
            value = to_value(score_of(rollout.suggested_reward, scale), scale)
    note = (comment or "").strip()
    comment = f"{ACCEPTED}: {note}" if note else ACCEPTED
    if rubric:
        return _write(engine, rollout_id, None, actor, comment, "label", True, scores=scores, judge_rules=True)
    return submit_label(engine, rollout_id, value, actor, comment, once=True)


def decide_label(engine: Engine, rollout_id: int, value: float, actor: str, comment: str = "") -> Labelled:
    """A reviewer settles a disagreement (or corrects any label); the decision counts over the labels.
    On a rubric task the value is a point of the five-point grid, or see decide_criteria_label."""
    return _write(engine, rollout_id, value, actor, comment, "decision")


def decide_criteria_label(engine: Engine, rollout_id: int, scores: dict[str, int], actor: str,
                          comment: str = "") -> Labelled:
    """A reviewer settles a disagreement on a rubric task per criterion, valued as submit_criteria_label."""
    return _write(engine, rollout_id, None, actor, comment, "decision", scores=scores)


def hold_for_labels(engine: Engine, *, step_id: int | None = None, run_id: int | None = None,
                    evaluation_id: int | None = None) -> bool:
    """Mark a step and its running run, or an evaluation, `awaiting_labels` while a rollout of it needs a label.

    The status is written before the check, inside one transaction, so a label that lands at the same
    moment either sees the waiting job (and release_if_labelled queues it again) or is seen here (and the
    job goes on); the other side of this is release_if_labelled.
    """
    table, job_id = (Step, step_id) if step_id is not None else (Evaluation, evaluation_id)
    with session_scope(engine) as session:
        session.exec(update(table).where(table.id == job_id).values(status=WAITING))
        waiting = queries.has_rollouts_to_label(session, step_id=step_id, evaluation_id=evaluation_id)
        if not waiting:
            session.exec(update(table).where(table.id == job_id).values(status=JobStatus.RUNNING))
        elif step_id is not None:
            session.exec(update(Run).where(Run.id == run_id, Run.status == JobStatus.RUNNING).values(status=WAITING))
        notify_labels_waiting(session, waiting, step_id=step_id, evaluation_id=evaluation_id)
    return waiting


def release_if_labelled(engine: Engine, *, step_id: int | None, evaluation_id: int | None, actor: str) -> bool:
    """Put a waiting step's run, or a waiting evaluation, back in the queue once nothing in it needs a label."""
    if step_id is None and evaluation_id is None:
        return False
    with session_scope(engine) as session:
        if queries.has_rollouts_to_label(session, step_id=step_id, evaluation_id=evaluation_id):
            return False
        if step_id is not None:
            step = session.get(Step, step_id)
            if step is None or step.status != WAITING:
                return False
            step.status = StepStatus.RUNNING
            session.add(step)
            moved = session.exec(update(Run).where(Run.id == step.run_id, Run.status == WAITING)
                                 .values(status=JobStatus.QUEUED)).rowcount
            job = ("run", step.run_id)
        else:
            moved = session.exec(update(Evaluation).where(Evaluation.id == evaluation_id, Evaluation.status == WAITING)
                                 .values(status=JobStatus.QUEUED)).rowcount
            job = ("evaluation", evaluation_id)
        if moved:
            session.add(AuditEvent(actor=actor, action=f"{job[0]}.labels_complete", object_type=job[0],
                                   object_id=job[1], before={"status": WAITING}, after={"status": JobStatus.QUEUED}))
        return bool(moved)


def is_person_method(task: Task) -> bool:
    method = METHODS.get(task.reward_method)
    return method is not None and method.uses_people


# ---- agreement between labellers --------------------------------------------------------------------------


@dataclass
class Agreement:
    """Fleiss' kappa over rollouts with the usual number of labels, Cohen's kappa per pair of labellers.

    Each disagreement names its rollout and sample, each labeller's label on the scale they pressed (`labels`,
    "5" and "1" on 1-5, see label_score), the mean that stands in as `score now` on that scale and as
    `reward now` in [0, 1]."""

    items: int = 0
    raters_per_item: int = 0
    fleiss: float | None = None
    cohen: dict[tuple[str, str], tuple[float | None, int]] = field(default_factory=dict)
    disagreements: list[dict] = field(default_factory=list)


def fleiss_kappa(table: list[list[int]]) -> float | None:
    """Fleiss' kappa of an items x categories count table with the same number of raters per item."""
    if not table:
        return None
    n = sum(table[0])
    if n < 2 or any(sum(row) != n for row in table):
        return None
    items = len(table)
    p_j = [sum(row[j] for row in table) / (items * n) for j in range(len(table[0]))]
    p_bar = statistics.fmean((sum(c * c for c in row) - n) / (n * (n - 1)) for row in table)
    p_e = sum(p * p for p in p_j)
    if p_e >= 1.0:
        return 1.0 if p_bar >= 1.0 else None
    return (p_bar - p_e) / (1 - p_e)


def cohen_kappa(a: list[int], b: list[int]) -> float | None:
    """Cohen's kappa of two labellers' scores on the same rollouts."""
    if len(a) != len(b) or not a:
        return None
    total = len(a)
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / total
    ca, cb = Counter(a), Counter(b)
    expected = sum(ca[c] * cb[c] for c in set(a) | set(b)) / (total * total)
    if expected >= 1.0:
        return 1.0 if observed >= 1.0 else None
    return (observed - expected) / (1 - expected)


def agreement(session: Session, task: Task) -> Agreement:
    scale = label_scale(task)
    categories = [score for score, _ in choices(scale)]
    per_item: dict[int, dict[str, int]] = {}
    result = Agreement()
    labels_by_rollout = queries.latest_labels_of_task(session, task.id)
    for rollout in queries.queued_rollouts(session, task.id):
        labels = labels_by_rollout.get(rollout.id, {})
        if len(labels) < 2:
            continue
        per_item[rollout.id] = {name: score_of(label.value, scale) for name, label in labels.items()}
        if rollout.label_status == LabelStatus.DISPUTED:
            result.disagreements.append({"rollout": rollout.id, "sample": rollout.sample_id,
                                         "labels": {k: f"{label_score(task, v.value):g}" for k, v in labels.items()},
                                         "score now": label_score(task, rollout.reward),
                                         "reward now": rollout.reward})
    if not per_item:
        return result
    size = Counter(len(v) for v in per_item.values()).most_common(1)[0][0]
    table = [[list(v.values()).count(c) for c in categories] for v in per_item.values() if len(v) == size]
    result.items, result.raters_per_item, result.fleiss = len(table), size, fleiss_kappa(table)
    pairs: dict[tuple[str, str], tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    for scores in per_item.values():
        for x, y in combinations(sorted(scores), 2):
            pairs[(x, y)][0].append(scores[x])
            pairs[(x, y)][1].append(scores[y])
    result.cohen = {pair: (cohen_kappa(a, b), len(a)) for pair, (a, b) in pairs.items()}
    return result
