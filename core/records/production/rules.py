"""A task's production rules, checked in one place: which traces go to people (`below`: every trace scored under
it; `share`: a stable share of the rest) and which the task's judge scores (`judge_share`: a stable share of all
traces; `judge_ab`: every A/B arm's trace without feedback; `judge_since`: when judging was turned on, which
set_rules writes). The Production page, `python -m core production-rules` and a task file all pass through
check_rules; `label_status` applies the labelling rules to a trace as it arrives or changes (both doors, an update),
and core.records.production.scoring applies the judge's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from core.domain.draws import stable_fraction
from core.errors import InvalidInput
from core.records.production.scores import sent_score
from storage.statuses import LabelStatus

SHARE, FLAG, TIME = "a number from 0 to 1", "true or false", "a time such as 2026-11-28T20:00:00+00:00"
RULES = {"below": SHARE, "share": SHARE, "judge_share": SHARE, "judge_ab": FLAG, "judge_since": TIME}


def _checked(name: str, kind: str, value: object) -> object:
    if kind == SHARE and not isinstance(value, bool) and isinstance(value, int | float) and 0 <= value <= 1:
        return float(value)
    if kind == FLAG and isinstance(value, bool):
        return value
    if kind == TIME:
        try:
            datetime.fromisoformat(str(value))
            return str(value)
        except ValueError:
            pass
    raise InvalidInput(f"the production rule {name!r} must be {kind}")


def check_rules(rules: dict) -> dict:
    """The rules as stored, each checked; an unknown name or a value of the wrong kind is InvalidInput naming it.
    Empty: no trace goes to people and the judge scores none."""
    unknown = set(rules) - set(RULES)
    if unknown:
        raise InvalidInput(f"unknown production rule {sorted(unknown)[0]!r}; use below, share, judge_share "
                           "and judge_ab")
    return {name: _checked(name, kind, rules[name]) for name, kind in RULES.items() if rules.get(name) is not None}


def needs_label(rules: dict, trace: Any) -> bool:
    """Whether the labelling rules send the trace to people: its sent score is under `below`, or its sender's id
    falls in the stable `share`. `trace` is a Trace or anything with its score, thumbs and client_id."""
    score = sent_score(trace)
    below = rules.get("below")
    if below is not None and score is not None and score < below:
        return True
    share = rules.get("share") or 0.0
    return share > 0 and stable_fraction(trace.client_id) < share


def label_status(rules: dict | None, trace: Any) -> LabelStatus | None:
    """The label status the rules give a trace: NEEDED, or None."""
    return LabelStatus.NEEDED if needs_label(rules or {}, trace) else None
