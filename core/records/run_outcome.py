"""Whether a finished run learned anything, in words: a run in which every group was skipped (each group's
answers all got the same reward, so there was nothing to compare) completes without a library change, and
"completed. Next: measure" would send a person to measure a version identical to the one they started from."""

from __future__ import annotations

from collections.abc import Iterable

from storage.statuses import GroupStatus, StepStatus
from storage.tables import Step


def learned_nothing(steps: Iterable[Step]) -> str | None:
    """The sentence for a run none of whose groups reached the learner, or None when some did (or nothing
    ran). Read from each step's stats (groups, ok, skipped, failed: core.grpo.training._run_step)."""
    steps = [s for s in steps if s.status == StepStatus.COMPLETED]
    stats = [s.stats or {} for s in steps]
    groups = sum(int(s.get("groups") or 0) for s in stats)
    skipped = sum(int(s.get(GroupStatus.SKIPPED) or 0) for s in stats)
    if not groups or skipped < groups:
        return None
    return (f"every group of this run was skipped ({skipped} of {groups}): in each, all answers got the same "
            "reward, so there was nothing to compare and the library did not change. The questions were all "
            "answered right (too easy) or all wrong (too hard) for this model: try harder or easier queries, a "
            "larger group size or a higher temperature, or learn from all-failed groups against the reference "
            "(reference_when_all_fail).")
