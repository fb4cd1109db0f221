"""The reward of a conversation: the rubric judge per criterion, and the must / must-not rules.

core/domain/rubric.py turns scores and rule results into one reward; this module gets them. The task's rules
and the scenario's own must / must-not statements (asked of the judge as yes/no questions) are checked
first; a regex rule runs in the scoring process, since a task's pattern may be costly on a long transcript.
A judge reply that is not the JSON asked for, or a failed call, never stops a run: the verdict has no
value and is unsure, so a person gives the reward in the labelling queue.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.domain import scoring
from core.domain.conversation import fenced_transcript
from core.domain.fencing import Fence, addressed_note, without_grader_text
from core.domain.personas import Persona, Scenario
from core.domain.prompts import rubric_messages, rule_messages, scenario_text
from core.domain.rewards import RubricSettings, parsed_settings
from core.domain.rubric import (
    Criterion,
    RubricReply,
    Rule,
    RuleReply,
    RuleResult,
    check_rules,
    final_reward,
    happened,
    judged_rule,
    quote_found,
    regex_found,
    verdict_context,
    verdict_schema,
)
from core.errors import InvalidInput, StructuredOutputError
from storage.tables import Task

if TYPE_CHECKING:  # the gateway imports litellm (seconds): a page that only reads judges' figures needs neither
    from core.models.gateway import Gateway, Scope

RULE_TEXT_CHARS = 80


@dataclass(frozen=True)
class ConversationVerdict:
    """The reward in [0, 1] (None when the judge's reply was unusable), why, doubt, and the per-criterion
    scores and rule results a Rollout keeps in `scores`."""

    value: float | None
    detail: str
    unsure: bool
    scores: dict = field(default_factory=dict)
    failed: bool = False  # the call itself failed (provider error, timeout): no verdict; production retries it


def rubric_settings(task: Task) -> RubricSettings:
    """The task's rubric settings, checked; InvalidInput when the task is not set up for conversations."""
    try:
        return parsed_settings("rubric", task.reward_settings or {})
    except InvalidInput as exc:
        raise InvalidInput(f"task {task.name!r}: the rubric settings are not usable: {exc}") from None


def scenario_rules(scenario: Scenario) -> list[Rule]:
    """A scenario's must / must-not statements as judge rules on the agent's turns."""
    def named(kind: str, text: str) -> str:
        short = " ".join(text.split())
        return f"{kind}: {short[:RULE_TEXT_CHARS]}{'…' if len(short) > RULE_TEXT_CHARS else ''}"

    return ([Rule(name=named("must", text), kind="must", check="judge", question=f"Did this happen? {text}")
             for text in scenario.must]
            + [Rule(name=named("must not", text), kind="must_not", check="judge", asks="avoided",
                    question=f"Did the agent avoid this in every turn? {text}") for text in scenario.must_not])


def isolated_match(pattern: str, text: str) -> bool:
    """A rule's regex in the scoring process; past its time or memory limit the rule cannot be checked,
    which is a configuration problem of the task, said as such."""
    value, source, detail = scoring.score_in_child(regex_found, text, pattern, {})
    if source == "error":
        raise InvalidInput(f"the rule pattern /{pattern[:80]}/ could not be checked: {detail}")
    return value == 1.0


async def judge_conversation(gateway: Gateway, task: Task, persona: Persona, scenario: Scenario, turns: list[dict],
                             *, scope: Scope, sample_index: int = 0, stage: str = "judge") -> ConversationVerdict:
    """Score one conversation: rules first (a broken one decides the reward whatever the criteria say, but
    the criteria are still scored, for the per-criterion means), then the rubric. `stage` names the calls in
    the ledger (`production_judge` for a production conversation)."""
    settings = rubric_settings(task)
    situation = scenario_text(persona, scenario)
    shown, addressed = [], []
    for turn in turns:  # the agent's text addressed to the grader is taken out once per turn
        if turn["role"] == "assistant":
            kept, found = without_grader_text(turn["text"] or "")
            shown.append({**turn, "text": kept})
            addressed += found
        else:
            shown.append(turn)
    transcript = fenced_transcript(shown, settings.transcript_chars)
    rules = [*settings.rules, *scenario_rules(scenario)]
    try:
        results = await asyncio.to_thread(check_rules, turns, rules, isolated_match)
        results = [await _ask(gateway, task, result, situation, transcript, turns, scope, sample_index, stage)
                   if result.needs_judge else result for result in results]
        reply, _call = await gateway.complete_json(
            stage=stage, model=task.judge_model, messages=rubric_messages(situation, settings.rubric, transcript, Fence()),
            reply=RubricReply, context=verdict_context(settings.rubric), schema=verdict_schema(settings.rubric),
            scope=scope, max_tokens=200 + 120 * len(settings.rubric), sample_index=sample_index)
    except InvalidInput as exc:
        return ConversationVerdict(0.0, f"rules not checkable: {exc}"[:300], unsure=False)
    except StructuredOutputError as exc:
        return ConversationVerdict(None, f"judge reply unusable: {exc}"[:300], unsure=True)
    except Exception as exc:  # noqa: BLE001  (a provider error must not stop the run)
        return ConversationVerdict(None, f"judge call failed: {type(exc).__name__}: {exc}"[:300], unsure=True,
                                   failed=True)
    outcome = final_reward(reply.scores(), settings.rubric, results)
    doubt = " (judge unsure)" if reply.unsure else ""
    reasons = "; ".join(f"{name}: {verdict.reason}" for name, verdict in reply.criteria.items() if verdict.reason)
    detail = (f"{addressed_note(addressed)}; " if addressed else "") + f"{outcome.reason}{doubt}" + (
        f" | {reasons}" if reasons else "")
    return ConversationVerdict(outcome.reward, detail[:2000], unsure=reply.unsure or bool(addressed),
                               scores=scores_record(outcome.criteria, results))


async def _ask(gateway: Gateway, task: Task, result: RuleResult, situation: str, transcript: str,
               turns: list[dict], scope: Scope, sample_index: int, stage: str = "judge") -> RuleResult:
    """A judge rule's question asked; the turn it names is kept only when it exists. A must-not rule counts as
    broken only when the judge quotes words that are really in the conversation (core.domain.rubric.quote_found)."""
    rule = result.rule
    reply, _call = await gateway.complete_json(
        stage=stage, model=task.judge_model, messages=rule_messages(situation, rule.question or "", transcript, Fence()),
        reply=RuleReply, scope=scope, max_tokens=250, sample_index=sample_index)
    turn = reply.turn - 1 if 1 <= reply.turn <= len(turns) else None
    reason = reply.reason or "the judge gave no reason"
    if rule.kind == "must_not" and happened(rule, reply.holds) and not quote_found(reply.quote, turns, turn, rule.role):
        return judged_rule(rule, rule.asks == "avoided", None, f"the judge said it happened but quoted nothing the "
                                                               f"{rule.role} said "
                                              f"({reply.quote[:80]!r}), so it is not counted")
    return judged_rule(rule, reply.holds, turn, reason)


def scores_record(criteria: dict[str, float], results: list[RuleResult]) -> dict:
    """What a Rollout keeps of its rubric: each criterion in [0, 1], and each rule with the turn it points at."""
    return {"criteria": dict(criteria),
            "rules": [{"name": r.rule.name, "kind": r.rule.kind, "passed": r.passed, "turn": r.turn_index,
                       "reason": r.reason} for r in results]}


def criteria_of(task: Task) -> list[Criterion]:
    """The task's rubric criteria (the labelling form asks for each)."""
    return list(rubric_settings(task).rubric)
