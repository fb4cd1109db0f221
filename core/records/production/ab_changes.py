"""What ends an A/B experiment from outside and starts the next: the split changed (its label, its share, on or
off: core.records.production.serving.set_ab_split) or a label moved (registered on the library's hook,
core/records/library/events.py). Each ends the running experiment with its verdict as it stood, audited with the
reason, and starts the next while the split is on. The verdict's statistics (numpy) are imported where an experiment
ends, so the API and the worker start without them (tests/test_cli_imports.py)."""

from __future__ import annotations

from sqlmodel import Session

from core.records.library.events import LabelMoved, on_label_moved
from core.records.library.promotion import PRODUCTION
from core.records.production.ab_experiments import CANDIDATE, arm_versions, end, open_experiment, start
from storage import queries
from storage.tables import AbExperiment, Library


def restart(session: Session, library: Library, reason: str, actor: str) -> AbExperiment | None:
    """End the running experiment (if any) for `reason`, and start the next one if the split is still on."""
    running = open_experiment(session, library.id)
    if running is not None and not end(session, running, reason, actor, final=_figures(session, running)):
        return None  # another transaction ended it, and starts the next
    return start(session, library, actor)


def split_changed(session: Session, library: Library, before: dict, actor: str) -> None:
    """The split's label or share changed, or it was turned on or off (core.records.production.serving.set_ab_split)."""
    after = {"label": library.ab_label, "share": library.ab_share}
    if after == before and open_experiment(session, library.id) is not None:
        return
    if not library.ab_label:
        reason = "the split was turned off"
    elif not before.get("label"):
        reason = "the split was turned on"
    else:
        reason = (f"the split changed from {before.get('label')!r} at {before.get('share') or 0:.0%} to "
                  f"{library.ab_label!r} at {library.ab_share:.0%}")
    restart(session, library, f"{reason} by {actor}", actor)


@on_label_moved
def end_on_label_move(event: LabelMoved) -> None:
    """Production's or the split's label moved: end the running experiment and start the next. When production moves
    onto the candidate's version, the experiment's verdict goes into the promotion's audit record."""
    session, version, name = event.session, event.version, event.name
    library = session.get(Library, version.library_id)
    if library is None or name not in (PRODUCTION, library.ab_label):
        return
    running = open_experiment(session, library.id)
    if running is not None and name == PRODUCTION:
        event.record["ab"] = {"experiment": running.id,
                              "candidate_version": queries.version_number(session, running.candidate_version_id),
                              "promoted_candidate": version.id == running.candidate_version_id,
                              "verdict": _figures(session, running), "decided_by_guard": running.decided}
    was = (event.before or {}).get("number")
    if running is not None and version.id == arm_versions(running)[PRODUCTION if name == PRODUCTION else CANDIDATE]:
        return  # the label moved onto the version its arm already serves: the arms are unchanged
    restart(session, library, f"{name} moved from {f'#{was}' if was else 'no version'} to #{version.number} by "
                              f"{event.actor}", event.actor)


def _figures(session: Session, experiment: AbExperiment) -> dict:
    from core.records.production.ab_verdict import experiment_figures

    return experiment_figures(session, experiment)
