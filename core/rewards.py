"""Reward functions for rollouts.

Every reward is stored with where it came from and a human-readable reason, so reviewers can see
why a rollout scored 0 or 1 without re-running anything.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from core.answers import extract_final_answer, normalize_answer
from core.errors import InvalidInput

__all__ = ["METHODS", "PERSON_METHODS", "REWARD_METHODS", "RewardResult", "majority_rewards", "score"]

_DETAIL_LIMIT = 200


@dataclass(frozen=True)
class RewardResult:
    value: float
    source: str
    detail: str


def _short(text: object, limit: int = _DETAIL_LIMIT) -> str:
    text = str(text).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    # Signal-based timeouts in math-verify only work in the main thread; we run in worker threads.
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
    except Exception as exc:  # a broken verifier must never crash a training run
        return RewardResult(0.0, "verifier", _short(f"math-verify error: {type(exc).__name__}: {exc}"))
    verdict = "correct" if ok else "wrong"
    return RewardResult(
        1.0 if ok else 0.0, "verifier", f"{verdict}: expected {_short(reference)}, got {_short(got)}"
    )


def _exact_reward(response: str, reference: str, settings: dict[str, Any]) -> RewardResult:
    got = extract_final_answer(response)
    if got is None:
        return RewardResult(0.0, "verifier", f"expected {_short(reference)}, no answer found in response")
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
    rel_tol = float(settings.get("rel_tol", 1e-6))
    abs_tol = float(settings.get("abs_tol", 1e-9))
    expected = _to_number(reference)
    if expected is None:
        return RewardResult(0.0, "verifier", f"reference {_short(reference)} is not numeric")
    got_text = extract_final_answer(response)
    if got_text is None:
        return RewardResult(0.0, "verifier", f"expected {_short(reference)}, no answer found in response")
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
    flags = re.IGNORECASE if settings.get("ignore_case", True) else 0
    try:
        compiled = re.compile(pattern, flags | re.DOTALL)
    except re.error as exc:
        raise InvalidInput(f"invalid regular expression {_short(pattern)}: {exc}") from exc
    text = response.strip()
    match = compiled.fullmatch(text) if settings.get("full_match") else compiled.search(text)
    if match:
        return RewardResult(1.0, "verifier", f"matches /{_short(pattern, 80)}/: {_short(match.group(0), 80)}")
    return RewardResult(0.0, "verifier", f"no match for /{_short(pattern, 80)}/")


def _phrases(reference: str, settings: dict[str, Any]) -> list[str]:
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
    phrases = _phrases(reference, settings)
    if not phrases:
        raise InvalidInput("reward method 'contains_all' needs phrases (task setting `phrases` or the reference)")
    fold = (lambda t: " ".join(t.lower().split())) if settings.get("ignore_case", True) else (lambda t: " ".join(t.split()))
    text = fold(response)
    missing = [p for p in phrases if fold(p) not in text]
    found = len(phrases) - len(missing)
    value = found / len(phrases) if settings.get("partial") else float(not missing)
    detail = f"{found} of {len(phrases)} phrases found"
    if missing:
        detail += "; missing: " + _short("; ".join(missing), 150)
    return RewardResult(value, "verifier", detail)


REWARD_METHODS: dict[str, Callable[[str, str, dict[str, Any]], RewardResult]] = {
    "math": _math_reward,
    "exact": _exact_reward,
    "numeric": _numeric_reward,
    "regex": _regex_reward,
    "contains_all": _contains_all_reward,
}
# Methods that can take what they check from the task's settings instead of each sample's reference.
SETTINGS_ONLY = {"regex": "pattern", "contains_all": "phrases"}
# Methods that need a model or a person rather than a function (core/judge.py, core/labeling.py).
PERSON_METHODS = ("human", "judge_human")
MODEL_METHODS = ("judge", "judge_human")
METHODS = {
    "math": "math-verify equivalence with the reference answer",
    "exact": "exact match of the final answer (normalised)",
    "numeric": "numeric match within a tolerance (rel_tol, abs_tol)",
    "regex": "the response matches a regular expression (pattern, or the reference)",
    "contains_all": "the response contains every phrase (phrases, or the reference split at ;)",
    "judge": "an LLM judge scores against the criteria (scale binary or 1-5)",
    "human": "people label every rollout in the labeling queue",
    "judge_human": "the judge suggests, people confirm a share (spot_check_share) and every unsure verdict",
}


def score(method: str, response: str, reference: str | None, settings: dict | None = None) -> RewardResult:
    """Score one response against a reference answer with a registered verifier.

    Raises ValueError for configuration mistakes (unknown method, missing reference) so they surface
    before a run starts; problems with the response itself only ever produce a 0.0 reward.
    """
    func = REWARD_METHODS.get(method)
    if func is None:
        known = ", ".join(sorted(REWARD_METHODS))
        raise InvalidInput(f"unknown reward method {method!r}; known methods: {known}")
    settings = dict(settings or {})
    has_setting = bool(settings.get(SETTINGS_ONLY.get(method, "")))
    if (reference is None or not str(reference).strip()) and not has_setting:
        raise InvalidInput(f"reward method {method!r} needs a reference answer")
    return func(response or "", str(reference or ""), settings)


def score_or_error(method: str, response: str, reference: str | None, settings: dict | None = None) -> RewardResult:
    """`score` for use inside a run: a configuration problem becomes a 0.0 reward from source
    `error` with the reason, so one sample without a reference never stops a run."""
    try:
        return score(method, response, reference, settings)
    except ValueError as exc:
        return RewardResult(0.0, "error", str(exc))


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
