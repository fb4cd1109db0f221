"""What a rewrite of the library is checked against: the task's references and the operation's sources (issue 52).

Auto review mode applies no MODIFY or MERGE that drops a fact its predecessor states and a reference verifies, or
states a fact none of its sources holds (core.domain.facts); the validation gate measures a mean on a few queries
and passed such a rewrite. This reads what the pure check needs from what is stored, for the engine (which holds
the rewrite before the gate) and for the Review page (which flags it for a reviewer in manual mode).
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlmodel import Session, col, select

from core.domain.coverage import Need, needs_of
from core.domain.facts import RewriteCheck
from storage import queries
from storage.tables import Advantage, Sample, Task


def train_references(session: Session, task: Task) -> list[str]:
    """Every reference of the task's train split: what verifies a fact an entry states."""
    return [s.reference for s in queries.samples(session, task.id, "train") if (s.reference or "").strip()]


def rewrite_check(session: Session, task: Task, advantage_ids: Iterable[int],
                  references: list[str] | None = None) -> RewriteCheck:
    """The check of a rewrite whose sources are the groups `advantage_ids` (Operation.source_advantage_ids): their
    messages and references, and the task's instructions, are what it may state; the task's train references
    (`references`, read when not given) verify its predecessors' facts."""
    ids = list(advantage_ids) or [-1]
    sample_ids = list(session.exec(select(Advantage.sample_id).where(col(Advantage.id).in_(ids))))
    references = train_references(session, task) if references is None else references
    return sample_check(task, queries.samples_by_ids(session, [i for i in sample_ids if i is not None]), references)


def sample_check(task: Task, samples: Iterable[Sample], references: list[str],
                 needs: frozenset[Need] | None = None) -> RewriteCheck:
    """The check of a rewrite whose sources are `samples`, verified by `references` (with their reward `needs`,
    computed when not given)."""
    known = [text for s in samples for text in (s.query, s.reference or "")]
    known += [task.instructions or "", task.answer_format or ""]
    if needs is None:
        needs = frozenset().union(*(needs_of(task.reward_method, r, task.reward_settings) for r in references))
    return RewriteCheck(tuple(references), tuple(known), needs)
