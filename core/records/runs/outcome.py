"""What a run's summary says beyond its figures, in words: whether a finished run learned anything (a run in which
every group was skipped, each group's answers all got the same reward, completes without a library change, and
"completed. Next: measure" would send a person to measure a version identical to the one they started from), and
whether worked examples were refused because the library was full (issue 44: a need left without its example)."""

from __future__ import annotations

from collections.abc import Iterable

from sqlmodel import Session, select

from core.domain.held_out import VALIDATION_SPLIT
from core.records.runs.settings import run_settings
from storage.statuses import GroupStatus, StepStatus
from storage.tables import Run, Sample, Step


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


def refused_for_space(step: Step) -> int:
    """How many of a step's worked examples were refused because the library was full, each of its examples the
    only one of its need (core.grpo.worked_examples.store_examples counts them in the step's stats)."""
    return int(((step.stats or {}).get("examples") or {}).get("full") or 0)


def space_note(steps: Iterable[Step]) -> str | None:
    """The sentence for steps whose new worked examples did not fit, or None: Review says it per step, the run's
    summary (the Train page, `python -m core report`) for the whole run."""
    refused = sum(refused_for_space(step) for step in steps)
    if not refused:
        return None
    examples = "worked example was" if refused == 1 else "worked examples were"
    return (f"{refused} new {examples} refused for space: the library held its most worked examples, each the "
            "only one of its need, so a need stays without its example. Raise the run's max_examples, or merge or "
            "delete examples on the Library page.")


def is_harvested(sample: Sample) -> bool:
    """A train sample made from a production trace by harvest (core.records.production.traces.harvest keeps its trace)."""
    return "source_trace" in (sample.meta or {})


def production_note(session: Session, run: Run, steps: Iterable[Step]) -> str | None:
    """For a run from production (issue 50: a harvested failure was once held out of its own training): how
    many harvested samples its steps trained on, and where its validation queries came from, never from them.
    None for any other run."""
    if run_settings(run).old_share is None:
        return None
    harvested = {sample.id for sample in session.exec(select(Sample).where(
        Sample.task_id == run.task_id, Sample.split == "train")) if is_harvested(sample)}
    trained = harvested & {sample_id for step in steps for sample_id in (step.sample_ids or [])}
    progress = run.progress or {}
    held = len(run.validation_ids or [])
    if run.validation_ids is None:
        source = "validation queries not chosen yet (never harvested samples)"
    elif not held:
        source = "no validation queries (the gate had none to read)"
    elif progress.get("validation_split") == VALIDATION_SPLIT:
        source = f"{held} validation queries from the task's validation split"
    else:
        source = f"{held} validation queries from the old train samples (harvested samples are never held out)"
    return (f"From production: trained on {len(trained)} of the {len(harvested)} samples harvested from "
            f"production traces; {source}.")
