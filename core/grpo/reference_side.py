"""Groups where every attempt failed, learned from the reference answer (issue 27; off by default).

The paper's group filter skips a group whose G rewards are all equal: nothing in it tells a better attempt
from a worse one. With ground truth, a group where every attempt failed still holds a contrast, the reference
answer, and when the agent lacks knowledge (a company's policies, formats, names) every group is such a group,
so without this the studio could never learn that knowledge. With RunSettings.reference_when_all_fail the
learner compares the failed attempts with the reference as the successful side (core.domain.prompts.
advantage_messages), and with worked examples on, the reference itself becomes the group's worked example.
"""

from __future__ import annotations

from core.records.runs.settings import RunSettings
from storage.statuses import GroupStatus
from storage.tables import Advantage

REFERENCE_SIDE_NOTE = ("Every attempt failed ({n} attempts, reward {reward:g}); the reference answer was the "
                       "successful side.")
_NOTE_START = REFERENCE_SIDE_NOTE.split(" (")[0]


def learns_from_reference(settings: RunSettings, rewards: list[float], reference: str | None) -> bool:
    """Whether a group of equal rewards goes to the learner with the reference as the successful side: only
    with the run's option on, when every attempt failed (below full reward) and the sample has a reference."""
    return (settings.reference_when_all_fail and bool(reference and reference.strip())
            and max(rewards) < 1.0)


def reference_note(n: int, reward: float) -> str:
    """The first sentence of such a group's advantage, so Review and the counters can tell it apart."""
    return REFERENCE_SIDE_NOTE.format(n=n, reward=reward)


def learned_from_reference(advantage: Advantage) -> bool:
    """Whether this group's advantage compared failed attempts with the reference (its analysis says so first)."""
    return advantage.status == GroupStatus.OK and (advantage.text or "").startswith(_NOTE_START)
