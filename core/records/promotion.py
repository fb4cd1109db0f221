"""What promoting a version to `production` would change, and what the evidence says, before anyone confirms.

Promote moves the label a live agent reads, so the Evaluate page and `core promote --dry-run` show this
preview first: the experiences that change against the current production version and the paired
comparison of the two versions' newest completed evaluations on the same split and k (core.records.comparison).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.domain.library import diff
from core.errors import NotFound
from core.records.comparison import EvaluationComparison, compare_evaluations
from core.records.versions import PRODUCTION
from storage import queries
from storage.models import Evaluation, Library
from storage.statuses import EvaluationPurpose, JobStatus


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

    @property
    def already_production(self) -> bool:
        return self.production_id == self.version_id

    @property
    def worse(self) -> bool:
        """The paired comparison says the candidate is significantly worse than production."""
        stats = self.comparison.stats if self.comparison else None
        return bool(stats and stats.decided and stats.delta < 0)


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
            raise NotFound(f"no version {version_id}")
        library = session.get(Library, version.library_id)
        label = queries.label_by_name(session, version.library_id, PRODUCTION)
        current = queries.version_by_id(session, label.version_id) if label else None
        evaluations = queries.evaluations(session, library.task_id) if library else []
    preview = PromotionPreview(version_id=version.id, version_number=version.number,
                               production_id=current.id if current else None,
                               production_number=current.number if current else None,
                               changes=diff(current.experiences if current else [], version.experiences))
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
