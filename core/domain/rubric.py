"""Conversation rewards: a per-criterion rubric scored by a judge, and must / must-not rules.

Pure: no model, no database. The engine asks the judge (with `RubricReply` as the structured reply)
and the judge-checked rules; this module turns the answers into one reward in [0, 1] with its reason.
A broken must-rule (or a matched must-not rule) sets the reward to 0 whatever the criteria say: a
conversation that leaks a secret is not saved by being polite, and the reason names the rule and the
turn so a reviewer can find it.

Turn indexes are 0-based positions in the conversation's turns; reasons say `turn N` 1-based, as a
person counts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from core.domain.replies import MAX_REASON_CHARS, Reply, Text
from core.errors import InvalidInput

Scale = Literal["binary", "1-5"]
SCALES: dict[str, tuple[int, int]] = {"binary": (0, 1), "1-5": (1, 5)}
Matcher = Callable[[str, str], bool]  # (pattern, text) -> matched; the engine may pass a killable one


DEFAULT_RUBRIC: dict = {  # a new conversation task's reward settings, to be edited for the task
    "rubric": [
        {"name": "helpfulness", "description": "Reaches the goal of the conversation with a correct, concrete next "
                                               "step.", "scale": "1-5", "weight": 2.0},
        {"name": "tone", "description": "Calm, respectful and suited to how this user talks.", "scale": "1-5",
         "weight": 1.0},
    ],
    "rules": [],
}


class Criterion(BaseModel):
    """One quality the judge scores on its own scale; `weight` says how much it counts in the reward."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1)]
    description: str = ""
    scale: Scale = "1-5"
    weight: Annotated[float, Field(gt=0)] = 1.0


class Rule(BaseModel):
    """A hard requirement: `must` happen in some turn, or `must_not` happen in any turn of `role`.
    A regex rule is checked here; a judge rule's `question` is asked by the engine."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1)]
    kind: Literal["must", "must_not"]
    check: Literal["regex", "judge"]
    pattern: str | None = None
    question: str | None = None
    role: Literal["assistant", "user", "any"] = "assistant"
    # What a yes to the judge question means: the thing `happened`, or the agent `avoided` it. Asking a must-not
    # rule as "did the agent avoid X?" keeps a judge that says yes to everything from breaking it falsely.
    asks: Literal["happened", "avoided"] = "happened"

    @model_validator(mode="after")
    def _complete(self) -> Rule:
        if self.check == "regex":
            if not self.pattern:
                raise ValueError(f"regex rule {self.name!r} needs a pattern")
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"rule {self.name!r}: the pattern does not compile: {exc}") from exc
        elif not (self.question or "").strip():
            raise ValueError(f"judge rule {self.name!r} needs a question")
        return self


@dataclass(frozen=True)
class RuleResult:
    """A rule's outcome: `passed` is None while a judge rule waits for the judge (`needs_judge`)."""

    rule: Rule
    passed: bool | None
    turn_index: int | None
    reason: str

    @property
    def needs_judge(self) -> bool:
        return self.passed is None


@dataclass(frozen=True)
class RubricResult:
    """The conversation's reward, each criterion's score in [0, 1], and why."""

    reward: float
    criteria: dict[str, float]
    reason: str
    failed_rules: tuple[RuleResult, ...] = ()


def normalise(score: int, scale: str) -> float:
    """A raw score on its scale mapped to [0, 1]: binary 0/1, 1-5 to 0, .25, .5, .75, 1."""
    low, high = SCALES[scale]
    if isinstance(score, bool) or not isinstance(score, int) or not low <= score <= high:
        raise InvalidInput(f"score {score!r} is not on the {scale} scale ({low} to {high})")
    return (score - low) / (high - low)


def scale_point(value: float, scale: str) -> float:
    """A value in [0, 1] as a point of its scale, the reverse of normalise: 0.75 on 1-5 is 4.0, 1 on binary is
    1.0; a value between the points (a rubric label's weighted mean) stays between them, 0.4375 on 1-5 is 2.75.
    For showing people a score on the scale they pressed."""
    low, high = SCALES[scale]
    return low + value * (high - low)


def score_transcript(criterion_scores: Mapping[str, int],
                     criteria: Sequence[Criterion]) -> tuple[float, dict[str, float]]:
    """The weighted mean of the normalised criterion scores, and each normalised score. A missing or
    unknown criterion is an error: a silently skipped criterion would change what the reward means."""
    if not criteria:
        raise InvalidInput("a rubric needs at least one criterion")
    names = {criterion.name for criterion in criteria}
    missing = [criterion.name for criterion in criteria if criterion.name not in criterion_scores]
    if missing:
        raise InvalidInput(f"no score for criteria {', '.join(missing)}")
    unknown = sorted(set(criterion_scores) - names)
    if unknown:
        raise InvalidInput(f"scores for unknown criteria {', '.join(unknown)}")
    normalised = {}
    for criterion in criteria:
        try:
            normalised[criterion.name] = normalise(criterion_scores[criterion.name], criterion.scale)
        except InvalidInput as exc:
            raise InvalidInput(f"criterion {criterion.name!r}: {exc}") from exc
    total = sum(criterion.weight for criterion in criteria)
    reward = sum(criterion.weight * normalised[criterion.name] for criterion in criteria) / total
    return reward, normalised


@dataclass(frozen=True)
class Found:
    """regex_found's answer, shaped as the scoring process reads a score (value, source, detail)."""

    value: float
    source: str
    detail: str


def regex_found(text: str, pattern: str, settings: Mapping) -> Found:
    """1.0 when `pattern` is found in `text` (case ignored): what the engine runs in the scoring process,
    which imports this light module rather than the engine's."""
    found = re.search(pattern, text, re.DOTALL | re.IGNORECASE) is not None
    return Found(1.0 if found else 0.0, "verifier", "found" if found else "not found")


def _regex_search(pattern: str, text: str) -> bool:
    return re.search(pattern, text, re.DOTALL) is not None


def _checked(turns: Sequence[dict], role: str) -> list[int]:
    return [i for i, turn in enumerate(turns) if role == "any" or turn["role"] == role]


def check_rule(turns: Sequence[dict], rule: Rule, matcher: Matcher = _regex_search) -> RuleResult:
    """One rule against the turns of its role; a judge rule is returned as waiting for the judge."""
    if rule.check == "judge":
        return RuleResult(rule, None, None, f"rule {rule.name!r} needs the judge: {rule.question}")
    indexes = _checked(turns, rule.role)
    hit = next((i for i in indexes if matcher(rule.pattern or "", turns[i]["text"])), None)
    who = "any" if rule.role == "any" else rule.role
    if rule.kind == "must":
        if hit is not None:
            return RuleResult(rule, True, hit, f"must-rule {rule.name!r} met in turn {hit + 1}")
        return RuleResult(rule, False, None, f"must-rule {rule.name!r} failed: no {who} turn "
                                             f"(of {len(indexes)}) matches /{rule.pattern}/")
    if hit is not None:
        return RuleResult(rule, False, hit, f"must-not rule {rule.name!r} broken in turn {hit + 1} "
                                            f"({turns[hit]['role']}): matches /{rule.pattern}/")
    return RuleResult(rule, True, None, f"must-not rule {rule.name!r} kept in all {len(indexes)} {who} turns")


def check_rules(turns: Sequence[dict], rules: Sequence[Rule], matcher: Matcher = _regex_search) -> list[RuleResult]:
    """Every rule's result, in the rules' order. `matcher` runs the regex; the engine may pass one that
    runs in a killable process, since a task's pattern is user-controlled."""
    return [check_rule(turns, rule, matcher) for rule in rules]


def happened(rule: Rule, holds: bool) -> bool:
    """Whether the thing the rule is about happened, from the judge's yes or no to the rule's question."""
    return holds if rule.asks == "happened" else not holds


def judged_rule(rule: Rule, holds: bool, turn_index: int | None, reason: str) -> RuleResult:
    """A judge rule's result from the judge's answer to its question (see Rule.asks): a must rule passes when
    the thing happened, a must-not rule when it did not."""
    passed = happened(rule, holds) if rule.kind == "must" else not happened(rule, holds)
    where = f" in turn {turn_index + 1}" if turn_index is not None else ""
    verb = "met" if passed else ("failed" if rule.kind == "must" else "broken")
    label = "must-rule" if rule.kind == "must" else "must-not rule"
    return RuleResult(rule, passed, turn_index, f"{label} {rule.name!r} {verb}{where}: {reason}")


def final_reward(criterion_scores: Mapping[str, int], criteria: Sequence[Criterion],
                 rule_results: Sequence[RuleResult] = ()) -> RubricResult:
    """The conversation's reward: 0 when a rule failed (the reason names each failed rule and its turn),
    else the criteria's weighted mean. A rule still waiting for the judge is an error, not a pass."""
    waiting = [result.rule.name for result in rule_results if result.needs_judge]
    if waiting:
        raise InvalidInput(f"rules not yet judged: {', '.join(waiting)}")
    reward, normalised = score_transcript(criterion_scores, criteria)
    failed = tuple(result for result in rule_results if result.passed is False)
    if failed:
        return RubricResult(0.0, normalised, "; ".join(result.reason for result in failed), failed)
    shown = ", ".join(f"{name} {value:.2f}" for name, value in normalised.items())
    return RubricResult(reward, normalised, f"weighted mean {reward:.2f} ({shown})")


def _int_score(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ValueError(f"score must be an integer, got {value!r}")
    return int(value)


class CriterionVerdict(BaseModel):
    """The judge's score of one criterion and why."""

    score: Annotated[int, BeforeValidator(_int_score)]
    reason: Text = ""

    @field_validator("reason")
    @classmethod
    def _short(cls, value: str) -> str:
        return value[:MAX_REASON_CHARS]


class RubricReply(Reply):
    """The judge's per-criterion verdict. Validated with `context={"criteria": {name: scale}}` (see
    `verdict_context`), every criterion must be there, on its scale, and no other."""

    criteria: dict[str, CriterionVerdict]
    unsure: bool = False

    @model_validator(mode="after")
    def _matches_rubric(self, info: ValidationInfo) -> RubricReply:
        scales: dict[str, str] | None = (info.context or {}).get("criteria")
        if scales is None:
            return self
        missing = [name for name in scales if name not in self.criteria]
        if missing:
            raise ValueError(f"the verdict has no score for criteria {', '.join(missing)}")
        unknown = sorted(set(self.criteria) - set(scales))
        if unknown:
            raise ValueError(f"the verdict scores unknown criteria {', '.join(unknown)}")
        for name, scale in scales.items():
            low, high = SCALES[scale]
            score = self.criteria[name].score
            if not low <= score <= high:
                raise ValueError(f"criterion {name!r}: score must be between {low} and {high}, got {score}")
        return self

    def scores(self) -> dict[str, int]:
        return {name: verdict.score for name, verdict in self.criteria.items()}


def verdict_context(criteria: Sequence[Criterion]) -> dict:
    """The validation context for RubricReply (what core.models.gateway.Gateway.complete_json takes)."""
    return {"criteria": {criterion.name: criterion.scale for criterion in criteria}}


def verdict_schema(criteria: Sequence[Criterion]) -> dict:
    """The JSON schema of a verdict on these criteria, each criterion a required property with its own
    score range, so strict structured output cannot leave one out or go off its scale."""
    def one(criterion: Criterion) -> dict:
        low, high = SCALES[criterion.scale]
        return {"type": "object", "additionalProperties": False, "required": ["score", "reason"],
                "properties": {"score": {"type": "integer", "minimum": low, "maximum": high},
                               "reason": {"type": "string"}}}

    names = [criterion.name for criterion in criteria]
    return {"type": "object", "additionalProperties": False, "required": ["criteria", "unsure"],
            "properties": {
                "criteria": {"type": "object", "additionalProperties": False, "required": names,
                             "properties": {criterion.name: one(criterion) for criterion in criteria}},
                "unsure": {"type": "boolean"}}}


def parse_verdict(text: str, criteria: Sequence[Criterion]) -> RubricReply:
    """A judge's raw reply checked against the rubric; any problem is an InvalidInput naming it."""
    try:
        data = json.loads(text, strict=False)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"the judge's verdict is not JSON: {exc}") from exc
    try:
        return RubricReply.model_validate(data, context=verdict_context(criteria))
    except ValidationError as exc:
        problems = "; ".join(_problem(error) for error in exc.errors())
        raise InvalidInput(f"the judge's verdict does not fit the rubric: {problems}") from exc


def _problem(error: Mapping) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()))
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


class RuleReply(Reply):
    """The judge's answer to one rule's question: whether the asked thing happened, and in which turn
    (1-based as the transcript numbers them; 0 when no turn decides it)."""

    holds: bool
    turn: Annotated[int, Field(ge=0)] = 0
    quote: Text = ""
    reason: Text = ""

    @field_validator("reason")
    @classmethod
    def _short(cls, value: str) -> str:
        return value[:MAX_REASON_CHARS]


MIN_QUOTE_CHARS = 12  # shorter "quotes" ("yes", "refund") are found anywhere and prove nothing


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())


def quote_found(quote: str, turns: Sequence[dict], turn_index: int | None, role: str) -> bool:
    """Whether the judge's quote is really in the conversation: in the turn it named, else in any turn of the
    rule's role (case, punctuation and spacing ignored). A judge that says a must-not rule was broken must
    show where; a small judge says "yes" to most questions, and an unsupported yes would zero the reward."""
    wanted = _normal(quote)
    if len(wanted) < MIN_QUOTE_CHARS:
        return False
    if turn_index is not None and 0 <= turn_index < len(turns):
        candidates = [turns[turn_index]]
    else:
        candidates = [turns[i] for i in _checked(turns, role)]
    return any(wanted in _normal(turn["text"]) for turn in candidates)
