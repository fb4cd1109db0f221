"""The LLM judge: a model scores a rollout against the task's criteria and says why.

The criteria are the task's `criteria` setting plus the sample's own rubric. The scale is `binary`
(0 or 1) or `1-5` (mapped to 0, 0.25, ..., 1). The judge also says whether it is confident; in the
spot-check method an unsure verdict always goes to a person. The answer reaches the judge fenced, and any of its
text addressed to the grader is taken out first and makes the verdict unsure (core/domain/fencing.py). A reply
that is not the JSON asked
for is never a crash: it becomes an unsure verdict without a value, with the raw reply's problem
as the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.domain.fencing import Fence, addressed_note, without_grader_text
from core.domain.replies import JudgeReply
from core.domain.rubric import SCALES
from core.errors import InvalidInput, StructuredOutputError
from storage.tables import Sample, Task

if TYPE_CHECKING:  # the gateway imports litellm (seconds): a page that only reads judges' figures needs neither
    from core.models.gateway import Gateway, Scope

DEFAULT_SCALE = "binary"
GENERIC_ANCHORS = {
    "binary": {0: "fails the criteria", 1: "meets the criteria"},
    "1-5": {1: "wrong or unusable", 2: "mostly wrong", 3: "partly right", 4: "right, minor gaps",
            5: "fully correct and complete"},
}
# "1: off topic", "5 = complete", "- 3 - partly right", "Score 2: ..."; never "1." or "1)", which number a list.
_ANCHOR_LINE = re.compile(r"^[ \t]*(?:[-*•][ \t]*)?(?:score[ \t]+)?(\d)[ \t]*(?::|=|-[ \t]|–|—)"
                          r"[ \t]*(\S[^\n]*?)[ \t]*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Verdict:
    """A judge's score mapped to [0, 1] (None when the reply was unusable), its reason, and doubt."""

    value: float | None
    detail: str
    unsure: bool
    failed: bool = False  # the call itself failed (provider error, timeout): no verdict; production retries it


def scale_of(task: Task) -> str:
    scale = str((task.reward_settings or {}).get("scale") or DEFAULT_SCALE)
    if scale not in SCALES:
        raise InvalidInput(f"unknown judge scale {scale!r}; use binary or 1-5")
    return scale


def to_value(score: int, scale: str) -> float:
    low, high = SCALES[scale]
    return (score - low) / (high - low)


def choices(scale: str) -> list[tuple[int, float]]:
    """(score a person types, reward in [0, 1]) for each point of the scale: the labeling buttons."""
    low, high = SCALES[scale]
    return [(score, to_value(score, scale)) for score in range(low, high + 1)]


def score_of(value: float, scale: str) -> int:
    """The scale point nearest to a reward, so labels on a scale can be compared as categories."""
    low, high = SCALES[scale]
    return low + round(value * (high - low))


def criteria_text(task: Task, sample: Sample) -> str:
    parts = [str((task.reward_settings or {}).get("criteria") or "").strip(), (sample.rubric or "").strip()]
    return "\n".join(p for p in parts if p) or "A correct, helpful and complete answer to the query."


def parse_anchors(text: str | None, scale: str) -> dict[int, str]:
    """The meaning a rubric gives each score in lines like `1: off topic` or `5 = complete`.

    Fewer than two such lines is more likely a stray numbered line than a scale, so it gives nothing.
    """
    low, high = SCALES[scale]
    found: dict[int, str] = {}
    for match in _ANCHOR_LINE.finditer(text or ""):
        score = int(match.group(1))
        if low <= score <= high:
            found.setdefault(score, match.group(2))
    return dict(sorted(found.items())) if len(found) >= 2 else {}


def anchors(task: Task, sample: Sample) -> dict[int, str]:
    """What each point of the task's scale means for this sample: the rubric's own words where it gives
    them, generic ones for the rest, so every score button says what pressing it claims."""
    scale = scale_of(task)
    return {**GENERIC_ANCHORS[scale], **parse_anchors(criteria_text(task, sample), scale)}


def grader_instructions(scale: str) -> str:
    """What the grader is and the JSON it replies with, on `scale`."""
    low, high = SCALES[scale]
    meaning = ("1 if the answer meets the criteria, 0 if it does not" if scale == "binary"
               else "1 (fails the criteria) to 5 (meets every criterion fully)")
    return ("You are a strict, fair grader. Judge the answer only against the criteria; do not reward length "
            "or politeness the criteria do not ask for. Reply with JSON only: "
            f'{{"reason": "<one or two sentences>", "score": <integer {low}-{high}>, "confident": <true|false>}}. '
            f"The score is {meaning}. Set confident to false when the criteria do not settle the case.")


def judge_messages(query: str, criteria: str, reference: str | None, response: str, scale: str,
                   fence: Fence | None = None) -> list[dict]:
    """The grader's prompt: the criteria and the reference (the task's own words) as prompt text; the query and the
    answer, written by users and the agent, JSON-encoded inside a fence (core.domain.fencing)."""
    fence = fence or Fence()
    system = f"{grader_instructions(scale)} {fence.rule}"
    user = f"Criteria:\n{criteria}\n\n"
    if reference:
        user += f"Reference answer:\n{reference}\n\n"
    user += f"The query and the answer to judge:\n{fence.fields(query=query, answer_to_judge=response)}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


async def judge_response(gateway: Gateway, task: Task, sample: Sample, response: str, *, scope: Scope,
                         sample_index: int = 0, stage: str = "judge") -> Verdict:
    """Ask the task's judge model for a verdict on one response; `stage` names the call in the ledger (a
    production trace's is `production_judge`, so its cost shows apart from training's)."""
    scale = scale_of(task)
    shown, addressed = without_grader_text(response)
    messages = judge_messages(sample.query, criteria_text(task, sample), sample.reference, shown, scale)
    try:
        reply, _call = await gateway.complete_json(
            stage=stage, model=task.judge_model, messages=messages, reply=JudgeReply,
            context={"score_range": SCALES[scale]}, scope=scope, max_tokens=300, sample_index=sample_index)
    except StructuredOutputError as exc:
        return Verdict(None, f"judge reply unusable: {exc}"[:300], unsure=True)
    except Exception as exc:  # noqa: BLE001  (a provider error must not stop the run)
        return Verdict(None, f"judge call failed: {type(exc).__name__}: {exc}"[:300], unsure=True, failed=True)
    low, high = SCALES[scale]
    doubt = "" if reply.confident else " (judge unsure)"
    detail = f"judge {reply.score}/{high}{doubt}: {reply.reason}"
    if addressed:
        detail = f"{addressed_note(addressed)}; {detail}"
    return Verdict(to_value(reply.score, scale), detail, unsure=not reply.confident or bool(addressed))
