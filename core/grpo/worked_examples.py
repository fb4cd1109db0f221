"""Worked examples from a step's groups (issue 26, point 2): a successful rollout, compressed and verified, or the
group's reference written as a reply (issue 36; with `learner_replies` off, the only source on a task whose reward
reads stated facts).

A small agent gains nothing from abstract lessons but does from worked examples of problems like its own
(DESIGN §8, "A small agent learns knowledge, not reasoning"). The group-relative advantage already says
which rollouts to learn from: in a group where some attempts succeeded and others failed, a success shows a
way to the answer the failures missed. The learner compresses one such rollout (core.domain.prompts.
example_messages) and the compressed example is scored again with the task's own reward against the
sample's reference, on the example's final answer: a compression can lose a step or change a number, and
an example that teaches a wrong answer is worse than none. An example whose answer does not score as right
is dropped, and the drop is recorded (on the group's Advantage text, and counted on the step) so the Review
page can say why a mixed group brought no example.

Kept out of core.grpo.training so that the loop only calls `propose_examples` and `store_examples` once the
learner's operations are stored; the examples are operations after them in the same step and go through the
same review, gate, versions, diff and export as the learner's lessons.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from core.domain.coverage import FULL, needs_of, plan_examples
from core.domain.library import EXAMPLE, ProposedOp
from core.domain.metrics import SUCCESS, attempts_failed, is_answered
from core.domain.prompts import example_messages, reference_reply_messages, trajectory_text
from core.domain.quality import screen_ops
from core.domain.reference_answers import (
    example_text,
    invented_facts,
    invented_reason,
    reference_as_answer,
    reference_parts,
    reply_words,
    template_reply,
    unusable,
)
from core.domain.replies import ExampleReply, ReferenceReply
from core.domain.rewards import METHODS, RewardResult, score_or_error
from core.domain.selection import Selection, select_entries
from core.errors import ModelCallError, StructuredOutputError
from core.grpo.reference_side import learned_from_reference
from core.models.gateway import Gateway, Scope
from core.records.review.decisions import proposed_op, record_examples
from core.records.review.fact_checks import sample_check, train_references
from storage import queries
from storage.db import session_scope
from storage.statuses import GroupStatus, OperationStatus
from storage.tables import Advantage, Operation, Rollout, Run, Sample, Step, Task
from storage.writes import insert_or_skip

log = logging.getLogger(__name__)
RIGHT = SUCCESS  # a reward at or above this is a right answer, as Pass@k counts it
STAGE = "example"  # the ledger's stage for the learner's calls: compressions, and replies written from a reference
NOTE_MARK = "\n\nWorked example: "  # starts the note on an Advantage's text (written again, never twice)


@dataclass(frozen=True)
class WorkedExample:
    """An example to propose: an ADD of kind example, linked to its group (Operation.source_advantage_ids)
    and to the rollout it was compressed from."""

    advantage_id: int
    rollout_id: int | None  # None: made from the reference answer (core.grpo.reference_side)
    text: str
    rationale: str
    flag: str | None = None  # why a person should look first (it states a fact no reference holds); refused in auto

    def op(self) -> ProposedOp:
        return ProposedOp("ADD", [], self.text, self.rationale, EXAMPLE)


def source_rollout(rollouts: list[Rollout]) -> Rollout | None:
    """The rollout to learn from in a group with a mixed result (at least one right and one wrong answer;
    None otherwise): the highest reward, then the shortest answer (less to compress, fewer detours), then the
    first in the group, so the same group always gives the same choice."""
    answered = [r for r in rollouts if is_answered(r)]
    right = [r for r in answered if r.reward >= RIGHT]
    if not right or len(right) == len(answered):
        return None
    return min(right, key=lambda r: (-r.reward, len(r.response or ""), r.group_index))


@dataclass(frozen=True)
class Found:
    """A step's worked examples: those to propose, and how many groups' examples were dropped."""

    examples: list[WorkedExample]
    dropped: int


async def propose_examples(engine: Engine, gateway: Gateway, task: Task, step: Step, advantages: list[Advantage], *,
                           model: str, max_tokens: int, scope: Scope, learner_replies: bool = True) -> Found:
    """One verified worked example per group of the step that has a mixed result, in the groups' order;
    `learner_replies` (RunSettings') says whether the learner writes the reply of an example made from a reference."""
    tried = await asyncio.gather(*(_group_example(engine, gateway, task, step, advantage, model=model,
                                                  max_tokens=max_tokens, scope=scope, learner_replies=learner_replies)
                                   for advantage in advantages if advantage.status == GroupStatus.OK))
    examples = [example for done, example in tried if done and example is not None]
    return Found(examples, sum(1 for done, example in tried if done and example is None))


async def _group_example(engine: Engine, gateway: Gateway, task: Task, step: Step, advantage: Advantage, *,
                         model: str, max_tokens: int, scope: Scope,
                         learner_replies: bool = True) -> tuple[bool, WorkedExample | None]:
    """(whether the group had a rollout to learn from, its verified example or None when it was dropped)."""
    with Session(engine) as session:
        rollouts = queries.step_rollouts(session, step.id, advantage.sample_id)
        sample = session.get(Sample, advantage.sample_id)
    source = source_rollout(rollouts)
    if source is None:
        if learned_from_reference(advantage):
            return True, await _reference_example(engine, gateway, task, sample, advantage, model=model,
                                                  max_tokens=max_tokens, scope=scope, learner_replies=learner_replies)
        return False, None
    if not learner_replies and _reads_stated_facts(task):
        return True, await _reference_example(engine, gateway, task, sample, advantage, model=model,
                                              max_tokens=max_tokens, scope=scope, learner_replies=False,
                                              group=attempts_failed(rollouts))
    where = f"output {source.group_index} (reward {source.reward:g}; {attempts_failed(rollouts)})"
    try:
        reply, _call = await gateway.complete_json(
            stage=STAGE, model=model, messages=example_messages(sample.query, trajectory_text(source.messages)),
            reply=ExampleReply, scope=scope, max_tokens=max_tokens)
    except (StructuredOutputError, ModelCallError) as exc:
        _note(engine, advantage.id, f"none from {where}: the learner's reply failed ({exc}).")
        return True, None
    answer = reply.answer
    check = await _answer_check(task, sample, answer)
    if check.value < RIGHT:
        reason = f": {check.detail}" if check.detail else ""
        _note(engine, advantage.id, f"dropped, compressed from {where}: its own answer {answer!r} scores "
                                    f"{check.value:g} against the reference{reason}.")
        return True, None
    invented = invented_facts(reply.entry_text(), _known(task, sample), numbers=_reads_stated_facts(task))
    flag = f"Flagged: {invented_reason(invented)}." if invented else None
    _note(engine, advantage.id, f"proposed, compressed from {where}; its answer {answer!r} scores "
                                f"{check.value:g} against the reference.{' ' + flag if flag else ''}")
    return True, WorkedExample(advantage.id, source.id, reply.entry_text(),
                               f"A worked example compressed from {where} of the query's group; its own answer "
                               f"({answer}) scores {check.value:g} against the reference."
                               f"{' ' + flag if flag else ''}", flag)


def _known(task: Task, sample: Sample) -> list[str]:
    """What an example may state: the sample's reference and message, and the task's instructions."""
    return [sample.reference or "", sample.query, task.instructions or "", task.answer_format or ""]


def _reads_stated_facts(task: Task) -> bool:
    """Whether the task's reward reads the facts or phrases a reply states, so a number no reference holds is an
    invented fact and the reference alone says what an example may state; not where an example computes its
    numbers on the way (math, numeric, exact)."""
    return task.reward_method in ("facts", "contains_all", "contains")


async def _answer_check(task: Task, sample: Sample, answer: str) -> RewardResult:
    """An example's final answer scored with the task's own reward against the sample's reference (boxed, so
    every method finds it as the final answer)."""
    return await _reply_check(task, sample, f"\\boxed{{{answer}}}")


async def _reference_example(engine: Engine, gateway: Gateway, task: Task, sample: Sample, advantage: Advantage, *,
                             model: str, max_tokens: int, scope: Scope, learner_replies: bool = True,
                             group: str = "every attempt failed") -> WorkedExample | None:
    """A group where every attempt failed has no successful rollout; with the run's reference option its
    reference answer is the successful side, and the example is the problem and the reply a person would send,
    stating each part of the reference in a sentence (core.domain.reference_answers), never its raw form. The
    learner writes that reply (unless the run's `learner_replies` is off); where it cannot (its reply is unusable
    or does not score as right), a template writes a sentence per part. Either is scored with the task's reward as
    the agent's own reply would be, and only a right one lands; a reference of one value that no sentence of the
    template carries (an `exact` text answer) stays as it is, checked as before; otherwise the group gives no
    example.

    With `learner_replies` off, a mixed group (`group` says how it went) on a task whose reward reads the facts a
    reply states gets its example here too, not compressed from its right attempt: the embedded learner's
    compressions kept the attempt's unverified sentences (an invented "According to the sandbox logs", a "Steps:
    The agent's solution:" form), and the reference states only verified facts."""
    parts = reference_parts(task.reward_method, sample.reference, task.reward_settings)
    why = "the task's reward is not computed from the answer"
    if METHODS.get(task.reward_method) is not None and METHODS[task.reward_method].scored_by_function and parts:
        reply, why = None, "the run does not ask the learner for replies"
        if learner_replies:
            reply, why = await _learner_reply(gateway, task, sample, parts, model=model, max_tokens=max_tokens,
                                              scope=scope)
        if reply is not None:
            check = await _reply_check(task, sample, reply)
            if check.value >= RIGHT:
                _note(engine, advantage.id, f"proposed from the reference answer, written as a reply by the learner: "
                                            f"{group}; the reply scores {check.value:g}.")
                return WorkedExample(advantage.id, None, example_text(sample.query, reply),
                                     f"A worked example from the reference answer of a group where {group}, written "
                                     f"as the reply a person would send; it scores {check.value:g} with the task's "
                                     "reward.")
            why = f"the learner's reply scores {check.value:g} ({check.detail})"
        template = template_reply(parts)
        check = await _reply_check(task, sample, template)
        if check.value >= RIGHT and unusable(template, sample.query, sample.reference, parts) is None:
            _note(engine, advantage.id, f"proposed from the reference answer, a sentence per part: {group} ({why}).")
            return WorkedExample(advantage.id, None, example_text(sample.query, template),
                                 f"A worked example from the reference answer of a group where {group}, a sentence "
                                 f"per part of the reference ({why}).")
        why = f"{why}; the template scores {check.value:g} ({check.detail})"
    answer = reference_as_answer(task.reward_method, sample.reference, task.reward_settings)
    check = await _answer_check(task, sample, answer)
    if len(parts) > 1 or check.value < RIGHT:
        _note(engine, advantage.id, f"dropped, from the reference answer: {why}; as it is, it scores "
                                    f"{check.value:g} ({check.detail}).")
        return None
    _note(engine, advantage.id, f"proposed from the reference answer as it is: {group} ({why}).")
    return WorkedExample(advantage.id, None, example_text(sample.query, answer),
                         f"A worked example from the reference answer of a group where {group}.")


async def _learner_reply(gateway: Gateway, task: Task, sample: Sample, parts: list, *, model: str, max_tokens: int,
                         scope: Scope) -> tuple[str | None, str]:
    """The learner's reply to the sample's query stating every part of its reference, or None and why not."""
    messages = reference_reply_messages(task.instructions, task.answer_format, sample.query,
                                        [str(part) for part in parts], reply_words(sample.query))
    try:
        reply, _call = await gateway.complete_json(stage=STAGE, model=model, messages=messages, reply=ReferenceReply,
                                                   scope=scope, max_tokens=max_tokens)
    except (StructuredOutputError, ModelCallError) as exc:
        return None, f"the learner's reply failed ({exc})"
    problem = unusable(reply.reply, sample.query, sample.reference, parts,
                       [task.instructions or "", task.answer_format or ""])
    if problem is not None:
        return None, f"the learner's reply was not used: {problem}"
    return " ".join(reply.reply.split()), ""


async def _reply_check(task: Task, sample: Sample, reply: str) -> RewardResult:
    """A reply scored with the task's reward as the agent's own reply is (not boxed: it is the whole reply), in a
    thread: a scorer may run in its scoring process."""
    return await asyncio.to_thread(score_or_error, task.reward_method, reply, sample.reference, task.reward_settings)


def _note(engine: Engine, advantage_id: int, note: str) -> None:
    """What became of the group's worked example, on its Advantage text (which Review shows with the group);
    an earlier note (a resumed step compresses again, from the cache) is replaced, not repeated."""
    with session_scope(engine) as session:
        row = session.get(Advantage, advantage_id)
        row.text = (row.text or "").split(NOTE_MARK)[0] + NOTE_MARK + note
        session.add(row)


def examples_recorded(engine: Engine, step_id: int) -> bool:
    """Whether the step's worked examples were proposed already (a resumed step does not propose them twice)."""
    with Session(engine) as session:
        return "examples" in (session.get(Step, step_id).stats or {})


def store_examples(engine: Engine, step_id: int, experiences: list[dict], found: Found, *,
                   max_size: int | None = None, max_examples: int | None = None,
                   refuse_flagged: bool = False, hold_rewrites: bool = False) -> list[Operation]:
    """Store the step's examples after its other operations, one per need (core.domain.coverage.plan_examples):
    an ADD, or a MODIFY / MERGE of the examples of the same need it replaces, or at the cap a MODIFY of the most
    redundant example; pending, or invalid with the reason: covered by another example, the library full with
    every example the only one of its need, over the example's length limit, a duplicate, and with
    `refuse_flagged` (auto review mode with hold_flagged) a quality flag by an example's rules or a fact no
    reference holds, as the learner's operations are screened; with `hold_rewrites` (auto review mode) a MODIFY or
    MERGE that drops a verified fact or adds one its group does not hold is left to a person. Each is linked to its
    own group; the step records where each came from, how many were dropped and how many were refused for space, in the same transaction.
    Checked against the library as the step's earlier valid operations leave it."""
    with session_scope(engine) as session:
        step = session.get(Step, step_id)
        task = session.get(Task, session.get(Run, step.run_id).task_id)
        earlier = queries.step_operations(session, step_id)
        valid = [op for op in earlier if op.status != OperationStatus.INVALID]
        first = max((op.position for op in earlier), default=-1) + 1
        positions = [first + offset for offset in range(len(found.examples))]
        universe = frozenset().union(*(needs_of(task.reward_method, s.reference, task.reward_settings)
                                       for s in queries.samples(session, task.id, "train")))
        sources = {a.id: a.sample_id for a in session.exec(
            select(Advantage).where(Advantage.id.in_([e.advantage_id for e in found.examples] or [-1])))}
        samples = [session.get(Sample, sources[e.advantage_id]) for e in found.examples]
        needs = [needs_of(task.reward_method, sample.reference, task.reward_settings) for sample in samples]
        selection = Selection.from_dict(session.get(Run, step.run_id).settings.get("selection"))
        shown = [frozenset(str(e["id"]) for e in select_entries(experiences, sample.query, selection)
                           if e.get("kind") == EXAMPLE) for sample in samples]
        planned = plan_examples(experiences, [(e.text, e.rationale, need) for e, need in zip(found.examples, needs,
                                                                                             strict=True)],
                                universe, max_examples, shown)
        refused = {len(valid) + i: plan.error for i, plan in enumerate(planned) if plan.error}
        if refuse_flagged:
            refused |= {len(valid) + i: e.flag for i, e in enumerate(found.examples)
                        if e.flag and len(valid) + i not in refused}
        references = train_references(session, task)
        checks = {len(valid) + i: sample_check(task, [session.get(Sample, sources[e.advantage_id])], references,
                                               universe) for i, e in enumerate(found.examples)}
        checked = screen_ops(experiences, [*(proposed_op(step, op) for op in valid),
                                           *(plan.op for plan in planned)],
                             refuse_flagged=refuse_flagged, max_size=max_size, max_examples=max_examples,
                             refused=refused, rewrite_checks=checks if hold_rewrites else None,
                             labels=[f"operation {position + 1}" for position in
                                     [*(op.position for op in valid), *positions]])[len(valid):]
        for position, example, item in zip(positions, found.examples, checked, strict=True):
            insert_or_skip(session, Operation(
                step_id=step_id, run_id=step.run_id, position=position, op=item.op.op,
                target_ids=list(item.op.target_ids), text=item.op.text, rationale=item.op.rationale,
                source_advantage_ids=[example.advantage_id],
                status=OperationStatus.PENDING if item.valid else OperationStatus.INVALID, validation_error=item.error))
        step.stats = record_examples(step.stats, positions, [(e.advantage_id, e.rollout_id) for e in found.examples],
                                     found.dropped)
        full = sum(1 for item in checked if not item.valid and (item.error or "").startswith(FULL))
        if full:
            step.stats = {**step.stats, "examples": {**step.stats["examples"], "full": full}}
        session.add(step)
        return queries.step_operations(session, step_id)
