"""Reward methods: one registry that says, for each method, what it reads and who scores it.

`METHODS` maps a method's name to one object (`RewardMethod`): its description, the pydantic model of
the settings it reads (constraints declared on the fields), whether it needs each sample's reference
(and which setting can stand in for it), whether the judge model or people take part, and, for a
verifier, the function that scores. The Tasks page, task-file validation, rollouts, labeling and runs
all read this registry; none of them branches on a method's name.

Every reward is stored with where it came from and a human-readable reason, so reviewers can see
why a rollout scored 0 or 1 without re-running anything.

A method that runs a pattern or a parser someone else controls (regex: the task's pattern; math: the
model's answer) is `isolated`: `score` runs it in a scoring process with a time and a memory limit
(core/domain/scoring.py), so one costly input costs a 0 reward with the reason instead of a stalled run.

A pure module: no database, no model calls (the judge lives in core/models/judge.py, the queue in
core/records/review/labeling.py).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal, Protocol, get_args, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.domain import scoring
from core.domain.answers import extract_final_answer, normalize_answer
from core.domain.regex_safety import pattern_problem
from core.domain.rubric import Criterion, Rule
from core.errors import InvalidInput

__all__ = ["METHODS", "Fact", "Method", "MethodSettings", "RewardConfig", "RewardMethod", "RewardResult",
           "cannot_try", "check_settings", "get_method", "majority_rewards", "parse_facts", "pattern_problem", "score",
           "score_or_error", "setting_keys", "try_reward", "warm_up"]

_DETAIL_LIMIT = 200


@dataclass(frozen=True)
class RewardResult:
    value: float
    source: str
    detail: str


def _short(text: object, limit: int = _DETAIL_LIMIT) -> str:
    text = str(text).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- settings: what each method reads, its constraints declared on the fields ----------------------------

MAX_CRITERIA_CHARS = 20_000  # as every text field of a task (core.domain.datasets.MAX_FIELD_CHARS; a test keeps them equal)
MAX_LABELS_PER_ROLLOUT = 5
Scale = Literal["binary", "1-5"]  # the judge's and the labellers' scales (core.models.judge.SCALES; a test keeps them equal)
SCALE_NAMES: tuple[str, ...] = get_args(Scale)
_TRUE_OR_FALSE = "true or false"


class MethodSettings(BaseModel):
    """The base of every method's settings. Types are strict (the text "yes" is not a bool, "0.1" is not a
    number); keys no method reads are allowed and kept as they are. A field's `description` is the rule
    a person reads when a value breaks it: "<key> must be <description>, got <value>"."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class NoSettings(MethodSettings):
    """A method that reads no settings (math, exact)."""


class NumericSettings(MethodSettings):
    rel_tol: float = Field(1e-6, ge=0, allow_inf_nan=False, description="a number of 0 or more")
    abs_tol: float = Field(1e-9, ge=0, allow_inf_nan=False, description="a number of 0 or more")


class RegexSettings(MethodSettings):
    pattern: str | None = Field(None, description="text (a regular expression)")
    ignore_case: bool = Field(True, description=_TRUE_OR_FALSE)
    full_match: bool = Field(False, description=_TRUE_OR_FALSE)

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        try:
            re.compile(pattern or "")
        except re.error as exc:
            raise InvalidInput(f"pattern is not a valid regular expression: {exc}") from exc
        problem = pattern_problem(pattern or "")
        if problem:
            raise InvalidInput(problem)
        return pattern


class ContainsAllSettings(MethodSettings):
    phrases: str | list[str] | None = Field(None, description="a list of text phrases (or one phrase)")
    partial: bool = Field(False, description=_TRUE_OR_FALSE)
    ignore_case: bool = Field(True, description=_TRUE_OR_FALSE)


class FactsSettings(MethodSettings):
    partial: bool = Field(False, description=_TRUE_OR_FALSE)


class JudgeSettings(MethodSettings):
    criteria: str = Field("", max_length=MAX_CRITERIA_CHARS, description="text")
    scale: Scale = Field("binary", description=f"one of {', '.join(SCALE_NAMES)}")


class HumanSettings(JudgeSettings):
    labels_per_rollout: int = Field(1, ge=1, le=MAX_LABELS_PER_ROLLOUT,
                                    description=f"a whole number from 1 to {MAX_LABELS_PER_ROLLOUT}")


class JudgeHumanSettings(HumanSettings):
    spot_check_share: float = Field(0.2, ge=0, le=1, allow_inf_nan=False, description="a number from 0 to 1")


class RubricSettings(MethodSettings):
    """A conversation task's rubric (core/domain/rubric.py): criteria the judge scores one by one, with their scales
    and weights, and must / must-not rules checked on the turns. Scenarios add their own must-rules."""

    rubric: list[Criterion] = Field(min_length=1, description="a list of criteria ({name, description, scale, "
                                    "weight}), at least one")
    rules: list[Rule] = Field(default_factory=list, description="a list of rules ({name, kind, check, pattern "
                              "or question, role})")
    labels_per_rollout: int = Field(1, ge=1, le=MAX_LABELS_PER_ROLLOUT,
                                    description=f"a whole number from 1 to {MAX_LABELS_PER_ROLLOUT}")
    spot_check_share: float = Field(0.1, ge=0, le=1, allow_inf_nan=False, description="a number from 0 to 1")
    transcript_chars: int = Field(6000, ge=500, description="a whole number of 500 or more (the longest "
                                  "transcript a judge or the learner reads; longer ones are shortened with a marker)")

    @field_validator("rubric")
    @classmethod
    def _unique_names(cls, criteria: list[Criterion]) -> list[Criterion]:
        names = [criterion.name for criterion in criteria]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise InvalidInput(f"rubric criteria must have different names; {', '.join(repeated)} appears twice")
        return criteria


def _setting(settings: dict[str, Any], model: type[MethodSettings], key: str) -> Any:
    """A setting's value, or the model's default when it is missing or null."""
    value = settings.get(key)
    return model.model_fields[key].default if value is None else value


def _settings_problem(model: type[MethodSettings], exc: ValidationError) -> str:
    """The first broken setting as one line that names it."""
    error = exc.errors()[0]
    key = str(error["loc"][0]) if error["loc"] else ""
    if error["type"] == "value_error":
        return str(error["ctx"]["error"])
    if error["type"] == "string_too_long":
        return f"{key} is longer than {error['ctx']['max_length']:,} characters"
    field = model.model_fields.get(key)
    if field is None or not field.description:
        return f"{key}: {error['msg']}" if key else str(error["msg"])
    return f"{key} must be {field.description}, got {_short(repr(error['input']), 80)}"


def _parse_gold(reference: str) -> list:
    """Parse a reference with math-verify, wrapping bare answers so LaTeX like 2\\sqrt{2} is read whole.

    Raw parsing of "2\\sqrt{2}" yields 2 and of "x^2+1" nothing; inside \\boxed{} both parse correctly,
    but "0.5" would become 1/2 in boxed mode, which is harmless for verification.
    """
    from math_verify import parse

    text = reference.strip()
    if "$" in text or "\\boxed" in text or "\\fbox" in text:
        return parse(text, parsing_timeout=None)
    gold = parse("\\boxed{" + text + "}", parsing_timeout=None)
    return gold or parse(text, parsing_timeout=None)


def _shown(parsed: list) -> str:
    """The string math-verify extracted (it returns [sympy_expr, source_string])."""
    if len(parsed) > 1 and isinstance(parsed[1], str):
        return parsed[1]
    return str(parsed[0])


def _math_reward(response: str, reference: str, settings: dict[str, Any]) -> RewardResult:
    """math-verify equivalence; like math-verify, several \\boxed{} in a response form one multi-part answer."""
    # math-verify's own timeouts are signals, which cannot stop C code: the scoring process's kill is the limit.
    from math_verify import parse, verify

    try:
        gold = _parse_gold(reference)
        if not gold:
            return RewardResult(0.0, "verifier", f"could not parse reference answer {_short(reference)}")
        pred = parse(response, parsing_timeout=None)
        if not pred:
            fallback = extract_final_answer(response)
            if fallback:
                pred = parse("\\boxed{" + fallback + "}", parsing_timeout=None)
        if not pred:
            return RewardResult(0.0, "verifier", f"expected {_short(reference)}, no answer found in response")
        ok = verify(gold, pred, timeout_seconds=None)
        got = _shown(pred)
    except MemoryError:  # the scoring process reports it as its memory limit
        raise
    except Exception as exc:  # a broken verifier must never crash a training run
        return RewardResult(0.0, "verifier", _short(f"math-verify error: {type(exc).__name__}: {exc}"))
    verdict = "correct" if ok else "wrong"
    return RewardResult(
        1.0 if ok else 0.0, "verifier", f"{verdict}: expected {_short(reference)}, got {_short(got)}"
    )


_NO_FINAL_ANSWER = ('no answer found in response (read: the last \\boxed{}, else the line after the last '
                    '"Answer:", else the last number)')


def _exact_reward(response: str, reference: str, settings: dict[str, Any]) -> RewardResult:
    """The final answer (extract_final_answer) equals the reference once both are normalised (normalize_answer)."""
    got = extract_final_answer(response)
    if got is None:
        return RewardResult(0.0, "verifier", f"expected {_short(reference)}, {_NO_FINAL_ANSWER}")
    ok = normalize_answer(got) == normalize_answer(reference)
    verdict = "correct" if ok else "wrong"
    return RewardResult(
        1.0 if ok else 0.0, "verifier", f"{verdict}: expected {_short(reference)}, got {_short(got)}"
    )


def _to_number(text: str | None) -> float | None:
    """Float value of a plain number or simple fraction like 3/4; None if it is anything else."""
    norm = normalize_answer(text)
    if norm is None:
        return None
    try:
        if norm.count("/") == 1:
            value = float(Fraction(norm.replace(" ", "")))
        else:
            value = float(norm)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _numeric_reward(response: str, reference: str, settings: dict[str, Any]) -> RewardResult:
    rel_tol = float(_setting(settings, NumericSettings, "rel_tol"))
    abs_tol = float(_setting(settings, NumericSettings, "abs_tol"))
    expected = _to_number(reference)
    if expected is None:
        return RewardResult(0.0, "verifier", f"reference {_short(reference)} is not numeric")
    got_text = extract_final_answer(response)
    if got_text is None:
        return RewardResult(0.0, "verifier", f"expected {_short(reference)}, {_NO_FINAL_ANSWER}")
    got = _to_number(got_text)
    if got is None:
        return RewardResult(
            0.0, "verifier", f"expected {_short(reference)}, got non-numeric answer {_short(got_text)}"
        )
    ok = math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol)
    verdict = "correct" if ok else "wrong"
    return RewardResult(
        1.0 if ok else 0.0,
        "verifier",
        f"{verdict}: expected {_short(reference)}, got {_short(got_text)} (rel_tol={rel_tol:g}, abs_tol={abs_tol:g})",
    )


def _regex_reward(response: str, reference: str, settings: dict[str, Any]) -> RewardResult:
    """1.0 when the response matches the pattern (the task's `pattern` setting, else the sample's reference).

    Patterns are written by the task's owner, not by a model; an invalid one is a configuration error.
    `ignore_case` (default true) and `full_match` (default false: the pattern may match anywhere).
    """
    pattern = str(settings.get("pattern") or reference)
    flags = re.IGNORECASE if _setting(settings, RegexSettings, "ignore_case") else 0
    try:
        compiled = re.compile(pattern, flags | re.DOTALL)
    except re.error as exc:
        raise InvalidInput(f"invalid regular expression {_short(pattern)}: {exc}") from exc
    text = response.strip()
    match = compiled.fullmatch(text) if _setting(settings, RegexSettings, "full_match") else compiled.search(text)
    if match:
        return RewardResult(1.0, "verifier", f"matches /{_short(pattern, 80)}/: {_short(match.group(0), 80)}")
    return RewardResult(0.0, "verifier", f"no match for /{_short(pattern, 80)}/")


def required_phrases(reference: str, settings: dict[str, Any]) -> list[str]:
    """The phrases `contains_all` requires: the task's `phrases` setting, else the reference split at ; or new lines."""
    given = settings.get("phrases")
    if isinstance(given, str):
        given = [given]
    items = given if given else re.split(r"[;\n]", reference)
    return [str(p).strip() for p in items if str(p).strip()]


def _contains_all_reward(response: str, reference: str, settings: dict[str, Any]) -> RewardResult:
    """1.0 when every required phrase occurs in the response (case-insensitive unless `ignore_case` is false).

    Phrases come from the task's `phrases` setting, else from the reference split at `;` or new lines.
    With `partial: true` the reward is the share of phrases found instead of all-or-nothing.
    """
    phrases = required_phrases(reference, settings)
    if not phrases:
        raise InvalidInput("reward method 'contains_all' needs phrases (task setting `phrases` or the reference)")
    ignore_case = _setting(settings, ContainsAllSettings, "ignore_case")
    fold = (lambda t: " ".join(t.lower().split())) if ignore_case else (lambda t: " ".join(t.split()))
    text = fold(response)
    missing = [p for p in phrases if fold(p) not in text]
    return _all_or_share(len(phrases), missing, "phrases", "; ", _setting(settings, ContainsAllSettings, "partial"))


def _all_or_share(total: int, missing: list[str], what: str, joiner: str, partial: bool) -> RewardResult:
    """1.0 when nothing is missing, else 0.0, or with `partial` the share found; the detail names what is missing."""
    found = total - len(missing)
    detail = f"{found} of {total} {what} found"
    if missing:
        detail += "; missing: " + _short(joiner.join(missing), 150)
    return RewardResult(found / total if partial else float(not missing), "verifier", detail)


_ARTICLES = frozenset({"a", "an", "the"})
_WORD = re.compile(r"\d+(?:[.,]\d+)*|[^\W_]+")  # a number keeps its decimal point and thousands commas
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def _words(text: str) -> list[str]:
    """The words of `text` as `contains` compares them: case, punctuation, spacing and the articles a, an, the
    ignored, thousands commas dropped (1,234 is 1234)."""
    words = []
    for word in _WORD.findall(unicodedata.normalize("NFKC", text).casefold()):
        if _THOUSANDS.fullmatch(word):
            word = word.replace(",", "")
        if word not in _ARTICLES:
            words.append(word)
    return words


def _has_run(words: list[str], run: list[str]) -> bool:
    """Whether `run` occurs in `words` as consecutive whole words."""
    return any(words[i:i + len(run)] == run for i in range(len(words) - len(run) + 1))


def _contains_reward(response: str, reference: str, settings: dict[str, Any]) -> RewardResult:
    """1.0 when the reference's words occur in the response, in order and next to each other, as whole words.

    For short factual answers stated in a sentence ("The capital of France is Paris." for "Paris"), which
    `exact` cannot read; whole words keep "Parisian" from passing for "Paris".
    """
    wanted = _words(reference)
    if not wanted:
        raise InvalidInput(f"reward method 'contains' needs a reference with words, got {_short(reference, 80)!r}")
    words = _words(response)
    phrase = " ".join(wanted)
    if _has_run(words, wanted):
        return RewardResult(1.0, "verifier", f"found {_short(phrase, 80)!r} as whole words")
    inside = " (it occurs only inside other words)" if phrase in " ".join(words) else ""
    return RewardResult(0.0, "verifier", f"{_short(phrase, 80)!r} not found as whole words{inside}")


@dataclass(frozen=True)
class Fact:
    """One fact a `facts` reference requires: an optional label (for people and the learner, never matched) and
    the wordings that each count as stating it."""

    label: str
    wordings: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.label or self.wordings[0]


def parse_facts(reference: str) -> list[Fact]:
    """The facts of a `facts` reference: separated by `;` (or new lines), each `label: wording | wording`.

    The label ends at the first ": " only, so a wording like 8:00 stays whole; a wording without words
    (punctuation only) is dropped, and a labelled fact left with no wording is a configuration error rather
    than a fact that can never be found.
    """
    facts = []
    for part in re.split(r"[;\n]", reference):
        label, colon, rest = part.partition(": ")
        if not colon:
            label, rest = "", part
        label = label.strip()
        wordings = tuple(wording.strip() for wording in rest.split("|") if _words(wording))
        if wordings:
            facts.append(Fact(label, wordings))
        elif label:
            raise InvalidInput(f"reward method 'facts': the fact {_short(label, 80)!r} has no wording after its "
                               "label (write label: wording | other wording)")
    return facts


def _facts_reward(response: str, reference: str, settings: dict[str, Any]) -> RewardResult:
    """1.0 when every fact of the reference is stated in the response, in any of its wordings, as whole words
    compared like `contains`; with `partial: true` the share of facts found.

    For answers whose correctness is a few concrete facts (a policy's number, a name, a reference format) that a
    reply may phrase in several ways: whole words keep "54 days" from passing for "45 days" and "PC-482130" for
    "PC-48213".
    """
    facts = parse_facts(reference)
    if not facts:
        raise InvalidInput("reward method 'facts' needs a reference that lists facts, separated by ; (each an "
                           f"optional label and ': ', then wordings separated by |), got {_short(reference, 80)!r}")
    words = _words(response)
    missing = [fact.name for fact in facts
               if not any(_has_run(words, _words(wording)) for wording in fact.wordings)]
    return _all_or_share(len(facts), missing, "facts", ", ", _setting(settings, FactsSettings, "partial"))


# ---- the registry --------------------------------------------------------------------------------------


@runtime_checkable
class RewardMethod(Protocol):
    """What the studio needs to know about a reward method; resolved by name with `get_method`.

    `uses_judge`: the task's judge model scores (core/models/judge.py). `uses_people`: rollouts may wait in the
    labeling queue (core/records/review/labeling.py): every one if the judge takes no part, else the unsure ones and a
    spot-check share. Neither: a verifier, whose `score` decides alone (and only a verifier can serve
    the no-ground-truth mode's comparison of final answers). `isolated`: the verifier runs patterns or
    parsers that a task's author or the model controls, so the module's `score` runs it in a scoring
    process with a time and a memory limit (its scorer must then be a module-level function).
    """

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...  # one sentence: what the method compares
    @property
    def reads(self) -> str: ...  # which part of the response it reads: the final-answer formats it accepts
    @property
    def settings_model(self) -> type[MethodSettings]: ...
    @property
    def needs_reference(self) -> bool: ...
    @property
    def reference_setting(self) -> str | None: ...  # a setting that may stand in for each sample's reference
    @property
    def uses_judge(self) -> bool: ...
    @property
    def uses_people(self) -> bool: ...
    @property
    def scored_by_function(self) -> bool: ...
    @property
    def isolated(self) -> bool: ...

    def score(self, response: str, reference: str, settings: dict[str, Any]) -> RewardResult: ...


Scorer = Callable[[str, str, dict[str, Any]], RewardResult]


@dataclass(frozen=True)
class Method:
    """A reward method of this studio (see RewardMethod)."""

    name: str
    description: str
    settings_model: type[MethodSettings] = NoSettings
    scorer: Scorer | None = None
    needs_reference: bool = False
    reference_setting: str | None = None
    uses_judge: bool = False
    uses_people: bool = False
    isolated: bool = False
    reads: str = "The whole response."

    @property
    def scored_by_function(self) -> bool:
        return not (self.uses_judge or self.uses_people)

    @property
    def scored_by(self) -> str:
        if self.scored_by_function:
            return "a verifier function"
        if self.uses_judge and self.uses_people:
            return "the judge model with people confirming"
        return "the judge model" if self.uses_judge else "people"

    def score(self, response: str, reference: str, settings: dict[str, Any]) -> RewardResult:
        """Run the scorer in this process, without limits (the scoring process calls this; the rest of the
        studio calls the module's `score`, which isolates where the method says so)."""
        if self.scorer is None:
            raise InvalidInput(f"reward method {self.name!r} is scored by {self.scored_by}, not by a function")
        return self.scorer(response, reference, settings)


_FINAL_ANSWER = ('The final answer: the last \\boxed{}, else the first line after the last "Answer:", else the last '
                 'number; a sentence without any of these has no answer.')

METHODS: dict[str, RewardMethod] = {method.name: method for method in (
    Method("math", "The final answer is mathematically equal to the reference (math-verify: 0.5, 1/2 and "
           "\\frac{1}{2} are equal).", scorer=_math_reward, needs_reference=True, isolated=True,
           reads='Every \\boxed{} in the response, as one answer (several boxes are a multi-part answer); '
                 'without a box, the answer math-verify finds in the text (the last number or expression), else '
                 'the first line after the last "Answer:".'),
    Method("exact", "The final answer equals the reference after normalisation: case, spacing, surrounding $, "
           "\\text{} and a trailing period are ignored, and numbers compare as numbers (12.0 is 12, 1,234 is 1234).",
           scorer=_exact_reward, needs_reference=True, reads=_FINAL_ANSWER),
    Method("contains", "The reference appears in the response as whole words, in order; case, punctuation, "
           "spacing and the articles a, an, the are ignored (Paris is found in \"The capital is Paris.\", not in "
           "\"Parisian\").", scorer=_contains_reward, needs_reference=True),
    Method("numeric", "The final answer is a number (or a fraction like 3/4) within a tolerance of the reference "
           "(rel_tol, abs_tol).", NumericSettings, scorer=_numeric_reward, needs_reference=True, reads=_FINAL_ANSWER),
    Method("regex", "The response matches a regular expression (the pattern setting, else the reference), "
           "anywhere in it unless full_match is on.", RegexSettings, scorer=_regex_reward, needs_reference=True,
           reference_setting="pattern", isolated=True, reads="The whole response, without surrounding spaces."),
    Method("contains_all", "The response contains every phrase (the phrases setting, else the reference split at "
           "; or new lines), anywhere, also inside words; case and spacing are ignored unless ignore_case is off.",
           ContainsAllSettings, scorer=_contains_all_reward, needs_reference=True, reference_setting="phrases"),
    Method("facts", "The response states every fact of the reference (facts separated by ;, each an optional "
           "label and \": \" then its accepted wordings separated by |) in one of its wordings, as whole words "
           "compared like contains; the label is never matched, and partial gives the share of facts found.",
           FactsSettings, scorer=_facts_reward, needs_reference=True),
    Method("judge", "An LLM judge scores the response against the criteria (scale binary or 1-5).", JudgeSettings,
           uses_judge=True, reads="The whole response, as the judge model reads it."),
    Method("human", "People label every rollout in the labeling queue.", HumanSettings, uses_people=True,
           reads="The whole response, as people read it."),
    Method("judge_human", "The judge suggests a score; people confirm a share (spot_check_share) and every unsure "
           "verdict.", JudgeHumanSettings, uses_judge=True, uses_people=True,
           reads="The whole response, as the judge model and people read it."),
    Method("rubric", "For conversation tasks: the judge scores the whole transcript on each rubric criterion (the "
           "reward is their weighted mean); a failed must-rule sets it to 0; people confirm a share and every "
           "unsure verdict.", RubricSettings, uses_judge=True, uses_people=True,
           reads="The whole conversation, as the judge model and people read it."),
)}


def get_method(name: str) -> RewardMethod:
    """The registered method called `name`; InvalidInput naming the known methods otherwise."""
    method = METHODS.get(name) if isinstance(name, str) else None
    if method is None:
        raise InvalidInput(f"unknown reward method {name!r}; use one of {', '.join(METHODS)}")
    return method


def setting_keys(name: str) -> tuple[str, ...]:
    """The reward_settings keys method `name` reads, in the order its settings model declares them."""
    return tuple(get_method(name).settings_model.model_fields)


def all_setting_keys() -> frozenset[str]:
    """Every key some registered method reads; any other key is kept unchecked."""
    return frozenset(key for method in METHODS.values() for key in method.settings_model.model_fields)


def setting_defaults(name: str) -> dict[str, Any]:
    """The default of every setting method `name` reads."""
    return {key: field.default for key, field in get_method(name).settings_model.model_fields.items()}


def parsed_settings(name: str, settings: Any) -> MethodSettings:
    """The keys method `name` reads, checked against its settings model and returned as it; InvalidInput
    names the first bad one.

    Other keys are kept as they are, unchecked (a newer studio's settings survive a round trip), and a
    null value means the default.
    """
    model = get_method(name).settings_model
    if not isinstance(settings, dict):
        raise InvalidInput("reward settings must be a JSON object (a dictionary)")
    read = {key: value for key, value in settings.items() if key in model.model_fields and value is not None}
    try:
        return model.model_validate(read)
    except ValidationError as exc:
        raise InvalidInput(_settings_problem(model, exc)) from None


def check_settings(name: str, settings: Any) -> None:
    """Check the keys method `name` reads against its settings model (parsed_settings)."""
    parsed_settings(name, settings)


def score(method: str, response: str, reference: str | None, settings: dict | None = None) -> RewardResult:
    """Score one response against a reference answer with a registered verifier.

    Raises ValueError for configuration mistakes (unknown method, missing reference) so they surface
    before a run starts; problems with the response itself only ever produce a 0.0 reward. An isolated
    method scores the response's last 20,000 characters in a scoring process: past its time or memory
    limit the reward is 0.0 from source `error` with the reason (core/domain/scoring.py).
    """
    found = METHODS.get(method)
    if found is None:
        known = ", ".join(sorted(name for name, m in METHODS.items() if m.scored_by_function))
        raise InvalidInput(f"unknown reward method {method!r}; known methods: {known}")
    settings = dict(settings or {})
    if missing := _missing_reference(method, found, reference, settings):
        raise InvalidInput(missing)
    if (scorer := _isolated_scorer(found)) is not None:
        return RewardResult(*scoring.score_in_child(scorer, response or "", str(reference or ""), settings))
    return found.score(response or "", str(reference or ""), settings)


def _missing_reference(method: str, found: RewardMethod, reference: str | None, settings: dict) -> str | None:
    """Why `reference` cannot be scored against (the method needs one and no setting stands in for it), or None."""
    has_setting = bool(found.reference_setting and settings.get(found.reference_setting))
    if found.needs_reference and (reference is None or not str(reference).strip()) and not has_setting:
        return f"reward method {method!r} needs a reference answer"
    return None


def _isolated_scorer(found: RewardMethod) -> Callable | None:
    """The scorer a method runs in a scoring process (core.domain.scoring), or None where it scores in place."""
    return found.scorer if found.isolated and isinstance(found, Method) and found.scorer is not None else None


def scores_or_errors(method: str, answers: list[tuple[str | None, str | None]],
                     settings: dict | None = None) -> list[RewardResult]:
    """score_or_error of each (response, reference) under one method and its settings, an isolated method's all in
    one round trip to a scoring process (core.domain.scoring.score_many_in_child): the rollouts of a training level
    are scored together, and a round trip each was most of a score's cost."""
    found = METHODS.get(method)
    scorer = _isolated_scorer(found) if found is not None else None
    if scorer is None:
        return [score_or_error(method, response, reference, settings) for response, reference in answers]
    settings = dict(settings or {})
    results: list[RewardResult | None] = [None] * len(answers)
    asked: list[int] = []
    for i, (_response, reference) in enumerate(answers):
        if missing := _missing_reference(method, found, reference, settings):
            results[i] = RewardResult(0.0, "error", missing)
        else:
            asked.append(i)
    outcomes = scoring.score_many_in_child(scorer, [(answers[i][0] or "", str(answers[i][1] or ""), settings)
                                                    for i in asked]) if asked else []
    for i, outcome in zip(asked, outcomes, strict=True):
        results[i] = (RewardResult(0.0, "error", str(outcome)) if isinstance(outcome, InvalidInput)
                      else RewardResult(*outcome))
    return results


def score_or_error(method: str, response: str, reference: str | None, settings: dict | None = None) -> RewardResult:
    """`score` for use inside a run: a configuration problem becomes a 0.0 reward from source
    `error` with the reason, so one sample without a reference never stops a run."""
    try:
        return score(method, response, reference, settings)
    except ValueError as exc:
        return RewardResult(0.0, "error", str(exc))


class RewardConfig(Protocol):
    """What trying a reward needs of a task: a stored Task and TaskSettings both fit."""

    reward_method: str
    reward_settings: dict[str, Any] | None


def cannot_try(name: str) -> str | None:
    """Why method `name` cannot score an answer on the spot (the judge model or people give it), or None.

    Trying such a reward would need a model call or a person, which a settings page must not start.
    """
    method = get_method(name)
    if method.scored_by_function:
        return None
    if method.uses_judge and method.uses_people:
        who = "the judge model, with people confirming some of its verdicts"
    else:
        who = "the judge model" if method.uses_judge else "people, in the labeling queue"
    return f"This reward is given by {who}; it cannot be tried here."


def try_reward(task: RewardConfig, answer: str, reference: str | None) -> RewardResult:
    """Score one answer with the task's reward exactly as a run scores a rollout (score_or_error, the engine's
    call), so an author sees the reward and its reason before spending a run on a wrong setting.

    A configuration problem (no reference, a pattern that cannot compile) is a 0.0 from source `error` with
    the reason, as in a run; a method the judge or people score raises InvalidInput saying so (cannot_try).
    """
    reason = cannot_try(task.reward_method)
    if reason is not None:
        raise InvalidInput(reason)
    return score_or_error(task.reward_method, answer, reference, dict(task.reward_settings or {}))


def warm_up() -> None:
    """Score a trivial answer with every isolated method, so a new scoring process pays math-verify's and
    sympy's imports (about 0.3 s) before its first timed score instead of inside it."""
    for method in METHODS.values():
        if method.isolated:
            method.score("\\boxed{1}", "1", {})


def majority_rewards(responses: list[str]) -> list[RewardResult]:
    """Self-consistency rewards for the paper's no-ground-truth mode.

    A rollout earns 1.0 when its answer matches the group's most common answer (ties go to the answer
    seen first); rollouts without an answer earn 0.0.
    """
    answers = [normalize_answer(extract_final_answer(r or "")) for r in responses]
    counts = Counter(a for a in answers if a is not None)
    total = len(responses)
    if not counts:
        return [
            RewardResult(0.0, "majority", "no answer found; no answer in the group to agree with")
        ] * total
    majority = max(dict.fromkeys(a for a in answers if a is not None), key=lambda a: counts[a])
    tally = f"({counts[majority]} of {total})"
    results = []
    for answer in answers:
        if answer is None:
            detail = f"no answer found; majority answer {_short(majority)} {tally}"
            results.append(RewardResult(0.0, "majority", detail))
        elif answer == majority:
            results.append(
                RewardResult(1.0, "majority", f"agrees with majority answer {_short(majority)} {tally}")
            )
        else:
            detail = f"answer {_short(answer)} disagrees with majority answer {_short(majority)} {tally}"
            results.append(RewardResult(0.0, "majority", detail))
    return results
