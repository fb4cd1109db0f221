"""What promoting a version to `production` would change, what the evidence says, and whether it may move.

Promote moves the label a live agent reads, so every way of moving it (the Evaluate page's Promote, the
Library page's Labels, `core promote`, `core label production`, core.records.library.versions.set_label and
promote) goes through one flow: this preview first (the experiences that change against the current
production version and the paired comparison of the two versions' newest completed evaluations on the
same split and k, core.records.evaluation.comparison), then `PromotionPreview.approve`, then the move in
core.records.library.versions. Without a paired comparison the move needs a written reason; with the setting
`promotion_requires_comparison` (TFGRPO_PROMOTION_REQUIRES_COMPARISON) it needs the comparison itself; a
candidate the comparison finds worse needs a reason too. The first production version and the version
already in production need neither. The audit event of the move holds the evidence and the reason.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from core.domain.library import diff
from core.errors import InvalidInput, NotFound
from core.records.evaluation.comparison import EvaluationComparison, compare_evaluations
from core.settings import get_settings
from storage import queries
from storage.statuses import EvaluationPurpose, JobStatus
from storage.tables import Evaluation, Library, LibraryVersion, Task

PRODUCTION = "production"  # the label a live agent reads (core.records.library.versions re-exports it)
MAX_REASON = 2000


@dataclass
class PromotionPreview:
    """The candidate, the version it replaces, the experiences that change and the comparison, if one exists."""

    version_id: int
    version_number: int
    production_id: int | None
    production_number: int | None
    changes: list[dict] = field(default_factory=list)
    comparison: EvaluationComparison | None = None
    evidence: str = ""  # the comparison's verdict in words, or why there is none

    comparison_required: bool = False  # the setting promotion_requires_comparison, read with the preview
    task: str = ""
    library: str = "default"

    @property
    def already_production(self) -> bool:
        return self.production_id == self.version_id

    @property
    def worse(self) -> bool:
        """The paired comparison says the candidate is significantly worse than production."""
        stats = self.comparison.stats if self.comparison else None
        return bool(stats and stats.decided and stats.delta < 0)

    @property
    def unguarded(self) -> bool:
        """Nothing to compare with: no version is in production yet, or this one already is."""
        return self.production_id is None or self.already_production

    @property
    def blocked(self) -> bool:
        """No paired comparison, and the setting makes one mandatory: no reason can stand in for it."""
        return not self.unguarded and self.comparison is None and self.comparison_required

    @property
    def undecided(self) -> str:
        """Why the paired comparison refuses to decide (too many queries without answers), or ""."""
        return self.comparison.stats.undecided if self.comparison else ""

    @property
    def needs_reason(self) -> bool:
        """Moving production needs a written reason: there is no paired comparison, it refuses to decide, or it
        finds the candidate worse."""
        return not self.unguarded and (self.comparison is None or bool(self.undecided) or self.worse)

    @property
    def compare_command(self) -> str:
        """The command that compares production with this version, as a person pastes it: versions by their numbers
        in the library (what `compare` takes and every page shows)."""
        library = "" if self.library == "default" else f" --library {shlex.quote(self.library)}"
        return (f"python -m core compare --task {shlex.quote(self.task or 'TASK')}{library} "
                f"{self.production_number} {self.version_number}")

    @property
    def how_to_compare(self) -> str:
        return (f"evaluate both on the same split with the same k on the Evaluate page, or with "
                f"`{self.compare_command}`")

    def refusal(self, reason: str = "") -> str | None:
        """Why production may not move to this version with this reason, and what to do instead; None if it may."""
        candidate, current = f"version #{self.version_number}", f"production #{self.production_number}"
        if self.blocked:
            return (f"{candidate} has no paired comparison with {current}, and this studio requires one before a "
                    f"promotion (TFGRPO_PROMOTION_REQUIRES_COMPARISON), so a reason is not enough: "
                    f"{self.how_to_compare}, then promote")
        if not self.needs_reason or (reason or "").strip():
            return None
        if self.comparison is not None:
            a, b, stats = self.comparison.a, self.comparison.b, self.comparison.stats
            which = f"the paired comparison (evaluation {a.id} vs {b.id}, {a.split}, k={a.k})"
            if self.undecided:
                return (f"{which} cannot decide ({self.undecided}); retry the evaluations' failed rollouts, or give "
                        "a reason for promoting without a decided comparison")
            figures = stats.verdict.split(": ", 1)[-1]
            return f"{which} finds {candidate} worse than {current} ({figures}); to promote it anyway, give a reason"
        return (f"{candidate} has no paired comparison with {current}; compare them first ({self.how_to_compare}), "
                "or give a reason for promoting without one")

    def diff_lines(self) -> str:
        """The experiences that change, as diff lines (- production, + candidate)."""
        lines = []
        for change in self.changes:
            if change["before"] is not None:
                lines.append(f"- [{change['id']}] {change['before']}")
            if change["after"] is not None:
                lines.append(f"+ [{change['id']}] {change['after']}")
        return "\n".join(lines)

    def approve(self, reason: str = "") -> Approval:
        """What the audit event of the move records, or InvalidInput saying what to do first."""
        reason = (reason or "").strip()
        if len(reason) > MAX_REASON:
            raise InvalidInput(f"the reason has {len(reason)} characters; keep it under {MAX_REASON}")
        refusal = self.refusal(reason)
        if refusal:
            raise InvalidInput(f"production was not moved: {refusal}")
        record: dict = {"from_version_id": self.production_id, "evidence": self.evidence, "reason": reason or None,
                        "comparison": None}
        if self.comparison is not None:
            stats, a, b = self.comparison.stats, self.comparison.a, self.comparison.b
            record["comparison"] = {
                "evaluations": [a.id, b.id], "split": a.split, "k": a.k, "queries": stats.n,
                "delta": _finite(stats.delta), "ci": [_finite(stats.ci_low), _finite(stats.ci_high)],
                "verdict": stats.verdict, "worse": self.worse}
        return Approval(version_id=self.version_id, production_id=self.production_id, record=record)


@dataclass(frozen=True)
class Approval:
    """A promotion that passed its guard: the version, the production it replaces (checked again when the label
    moves) and what the audit event records (evidence, comparison, reason)."""

    version_id: int
    production_id: int | None
    record: dict


def production_version(session: Session, library: Library) -> LibraryVersion | None:
    """The version production serves: the label's, else, for a library never promoted, its first version (what the
    API serves it as, core.records.production.serving). The one rule the API and "Update from production" share."""
    found = queries.label_by_name(session, library.id, PRODUCTION)
    if found is not None:
        return session.get(LibraryVersion, found.version_id)
    return session.exec(select(LibraryVersion).where(LibraryVersion.library_id == library.id,
                                                     LibraryVersion.number == 1)).first()


def _finite(value: float) -> float | None:
    """A figure for the audit event's JSON: an interval of fewer than two queries is infinite, stored as null."""
    return float(value) if math.isfinite(value) else None


def _newest_completed(evaluations: list[Evaluation], version_id: int) -> list[Evaluation]:
    return [e for e in evaluations if e.version_id == version_id and e.status == JobStatus.COMPLETED
            and e.purpose == EvaluationPurpose.EVALUATION]


def _paired_evaluations(evaluations: list[Evaluation], production_id: int,
                        candidate_id: int) -> tuple[Evaluation, Evaluation] | None:
    """The newest pair (production, candidate) that share split and k, so they can be compared query by query."""
    production = _newest_completed(evaluations, production_id)
    for candidate in _newest_completed(evaluations, candidate_id):
        for current in production:
            if (current.split, current.k) == (candidate.split, candidate.k):
                return current, candidate
    return None


def preview_promotion(engine: Engine, version_id: int) -> PromotionPreview:
    """Everything a person should see before `production` moves to this version."""
    with Session(engine) as session:
        version = queries.version_by_id(session, version_id)
        if version is None:
            raise NotFound("that version no longer exists")
        library = session.get(Library, version.library_id)
        label = queries.label_by_name(session, version.library_id, PRODUCTION)
        current = queries.version_by_id(session, label.version_id) if label else None
        evaluations = queries.evaluations(session, library.task_id) if library else []
        task = session.get(Task, library.task_id) if library else None
        task_name = task.name if task else ""
    preview = PromotionPreview(version_id=version.id, version_number=version.number,
                               production_id=current.id if current else None,
                               production_number=current.number if current else None,
                               changes=diff(current.experiences if current else [], version.experiences),
                               comparison_required=get_settings().promotion_requires_comparison, task=task_name,
                               library=library.name if library else "default")
    if current is None:
        preview.evidence = "No version is in production yet: this one becomes the first."
    elif preview.already_production:
        preview.evidence = "This version is already in production."
    else:
        pair = _paired_evaluations(evaluations, current.id, version.id)
        if pair is None:
            preview.evidence = (f"No paired comparison with production: evaluate version #{current.number} and "
                                f"#{version.number} on the same split with the same k, then compare.")
        else:
            preview.comparison = compare_evaluations(engine, pair[0].id, pair[1].id)
            stats = preview.comparison.stats
            preview.evidence = (f"Against production (evaluation {pair[0].id} vs {pair[1].id}, {pair[0].split}, "
                                f"k={pair[0].k}): " + stats.verdict.replace("B is", "the candidate is"))
    return preview
