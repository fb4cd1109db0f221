"""The Production page's A/B section: the experiment's figures as core.records.production.ab_verdict.ab_status gives them (the
same `core ab --status` prints), the difference planned for, why traces were left out, how the last experiments
ended, and Promote (the guarded dialog) once the candidate is decided better.

Not a page itself (ui/, not pages/); state changes go through `core`.
"""

from __future__ import annotations

import streamlit as st
from sqlmodel import Session

from core.domain.sequential import MIN_PER_ARM
from core.records.library.promotion import PRODUCTION
from core.records.production.ab_experiments import MIN_SHARE, experiments
from core.records.production.ab_verdict import EFFECT, AbStatus, ab_status
from core.records.production.serving import set_ab_split
from storage import queries
from storage.tables import as_utc
from ui.common import Flash, allowed, context, engine, plain, role_note, run_action
from ui.display import table
from ui.promote import PromoteDialog

FLASH = Flash("production_ab_flash")
PROMOTE = PromoteDialog("production_ab", FLASH, "ab")


def ask_promote(version_id: int, reason: str) -> None:
    """Open the guarded dialog with the A/B verdict as the reason it asks for when no offline comparison exists."""
    PROMOTE.ask(version_id)
    st.session_state[PROMOTE.reason_key] = reason


def start_split(task_name: str, library_name: str) -> None:
    label = st.session_state.get("production_ab_label")
    share = float(st.session_state.get("production_ab_share") or 0.1)
    run_action(FLASH, "ab", set_ab_split, engine(), task_name, library_name, label, share, context().reviewer,
               success=f"{share:.0%} of users are served {label!r}; an experiment starts now")


def end_split(task_name: str, library_name: str) -> None:
    run_action(FLASH, "ab", set_ab_split, engine(), task_name, library_name, None, 0.0, context().reviewer,
               success="The split ended: every user gets production")


def split_controls(task_name: str, library_name: str, running_label: str | None) -> None:
    """An admin starts a split (a candidate label and the share of users it serves) or ends it, as
    `python -m core ab` does (core.records.production.serving.set_ab_split)."""
    if not allowed("admin"):
        role_note("admin", "splitting production traffic")
        return
    with Session(engine()) as session:
        task = queries.task_by_name(session, task_name)
        library = queries.library_by_name(session, task.id, library_name) if task else None
        names = sorted(label.name for label in queries.labels(session, library.id)
                       if label.name != PRODUCTION) if library else []
    if running_label:
        st.button("End the split (serve everyone production)", key="production_ab_end", on_click=end_split,
                  args=(task_name, library_name))
        return
    if not names:
        st.caption("To split traffic, put a label on the candidate version first (Library page), e.g. candidate.")
        return
    left, middle, right = st.columns([2, 2, 1], vertical_alignment="bottom")
    left.selectbox("Candidate label", names, key="production_ab_label",
                   help="its version is served to the share of users below; the rest get production")
    middle.number_input("Share of users", min_value=MIN_SHARE, max_value=1 - MIN_SHARE, value=0.1, step=0.05,
                        key="production_ab_share", help="a stable share of user ids (a hash of the id): each user "
                        "keeps their arm; the verdict's error rate is measured from 0.05 to 0.95")
    right.button("Start the split", key="production_ab_start", on_click=start_split, args=(task_name, library_name))


def ab_section(task_name: str, library_name: str) -> None:
    """The library's running (or newest) A/B experiment, and the controls to start or end a split; an admin can
    start one before any trace has arrived."""
    effect = st.session_state.get("production_ab_effect") or EFFECT
    with Session(engine()) as session:
        status = ab_status(session, task_name, library_name, effect=float(effect))
        task = queries.task_by_name(session, task_name)
        library = queries.library_by_name(session, task.id, library_name) if task else None
        past = experiments(session, library.id) if library else []
        numbers = queries.version_numbers(session, sorted({v for e in past for v in (e.production_version_id,
                                                                                      e.candidate_version_id)}))
    if status.experiment is None:
        st.subheader("A/B experiment", anchor=False)
        FLASH.show("ab")
        if library is not None and library.ab_label:
            st.info(plain(f"The split serves {library.ab_label!r}, but no experiment runs: production or that label "
                          "points at no version yet, or both point at the same version (the candidate was "
                          "promoted). Move the label to a new candidate, or end the split."))
        split_controls(task_name, library_name, library.ab_label if library is not None else None)
        return
    st.subheader(f"A/B experiment {status.experiment}: production vs {status.candidate_label}", anchor=False)
    FLASH.show("ab")
    started = f"{as_utc(status.started_at):%Y-%m-%d %H:%M} UTC"
    if status.running:
        st.caption(f"Since {started}: {status.share:.0%} of user ids are served {status.candidate_label!r}, by a stable "
                   "hash of the id. Only traces sent after the start, with the user id the library was fetched with "
                   "and the version that user's arm serves, count; a label move ends the experiment and starts the "
                   "next. The interval is anytime-valid: it may be read at any time, as often as you like.")
    else:
        st.warning(plain(f"Experiment {status.experiment} (since {started}) ended "
                         f"{as_utc(status.ended_at):%Y-%m-%d %H:%M} UTC: {status.end_reason}"))
    _figures(status)
    _promote(status)
    split_controls(task_name, library_name, status.candidate_label if status.running else None)
    if len(past) > 1:
        st.caption("Earlier experiments")
        table([{"experiment": e.id, "production": f"#{numbers.get(e.production_version_id, '?')}",
                "candidate": f"{e.candidate_label} #{numbers.get(e.candidate_version_id, '?')}",
                "started": f"{as_utc(e.started_at):%Y-%m-%d %H:%M}",
                "ended": f"{as_utc(e.ended_at):%Y-%m-%d %H:%M}" if e.ended_at else "running",
                "verdict": verdict_words(e.decided or e.final),
                "why it ended": e.end_reason or ""} for e in past if e.id != status.experiment],
              key="production_ab_past")


def verdict_words(figures: dict | None) -> str:
    """An ended experiment's verdict in a few words: decided better or worse, or the interval as it stood."""
    if not figures or figures.get("low") is None:
        return "no verdict (too few users)"
    interval = f"{figures['difference']:+.3f} [{figures['low']:+.3f}, {figures['high']:+.3f}]"
    if figures.get("better"):
        return f"candidate better {interval}"
    if figures.get("worse"):
        return f"candidate worse {interval}"
    return f"no difference shown {interval}"


def _figures(status: AbStatus) -> None:
    table([{**{key: arm[key] for key in ("arm", "label", "version", "users", "scored traces", "mean per user")},
            **{f"scored by {source}": count for source, count in arm["scored by"].items()}}
           for arm in status.arms], key="production_arms_table")
    st.caption("Each user counts once (the mean of their scored traces): the split randomises users, so the "
               f"interval, *Decided* and the minimum of {MIN_PER_ARM} per arm count users, not traces.")
    found = status.verdict
    left, middle, right = st.columns(3)
    left.metric("Candidate − production", "-" if found.difference is None else f"{found.difference:+.3f}")
    middle.metric(f"{1 - found.alpha:.0%} anytime-valid interval",
                  "-" if found.low is None else f"[{found.low:+.3f}, {found.high:+.3f}]")
    right.metric("Decided", "yes" if found.decided else "no")
    shown = st.success if found.better else st.error if found.worse else st.info
    shown(plain(status.words))
    if status.excluded:
        st.caption("Left out of the comparison (stored, and counted everywhere else): " + "; ".join(
            f"{count} {reason}" for reason, count in sorted(status.excluded.items())))
    if status.running:
        st.number_input("Difference to plan for", min_value=0.01, max_value=0.5, value=EFFECT, step=0.01,
                        key="production_ab_effect",
                        help="How many more users with a scored trace a true difference of this size needs, at the "
                             "current rate of new users")


def _promote(status: AbStatus) -> None:
    if not (status.running and status.verdict.better):
        return
    candidate = next(arm for arm in status.arms if arm["arm"] != PRODUCTION)
    if not allowed("admin"):
        role_note("admin", "promoting the candidate")
        return
    if PROMOTE.pending() == candidate["version_id"]:
        PROMOTE.draw(candidate["version_id"], candidate["version"])
        return
    st.button(f"Promote {candidate['version']}", key="production_ab_promote", type="primary", on_click=ask_promote,
              args=(candidate["version_id"], f"A/B experiment {status.experiment}: {status.words}"))
