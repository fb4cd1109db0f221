"""Train: start a run with its settings, follow it live (per-stage counters, reward per step, library
size, tokens and cost, time left) and pause, resume or cancel it.

Runs are executed by the worker; this page only queues them (`core.training.create_run`) and writes
a person's requests (`core.run_control`). Counters come from `run.progress`, which the worker keeps
up to date, so the live view costs a handful of small reads every two seconds.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots
from sqlmodel import Session

from core.run_control import cancel_run, pause_run, resume_run
from core.run_settings import RunSettings
from core.training import create_run
from core.worker import job_health
from pages._common import (
    Flash,
    allowed,
    context,
    engine,
    require_task,
    role_note,
    run_action,
    run_page,
    show_text,
    start_worker_if_needed,
    status_label,
)
from storage import queries
from storage.models import as_utc
from storage.statuses import (
    LEARNING_KINDS,
    PERSON_MAY_CANCEL,
    PERSON_MAY_PAUSE,
    PERSON_MAY_RESUME,
    GateRule,
    JobStatus,
)

FLASH = Flash("train_flash")
RUN_KEY = "train_run"
DEFAULTS = RunSettings()


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def compact(n: int) -> str:
    """Token counts in a metric: 950, 12.3k, 4.1M."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 1_000:
        return f"{n / 1_000:.1f}k"
    return str(n)


def fraction(done: int, total: int) -> str:
    return f"{done} / {total if total else '?'}"


def elapsed_and_left(run, shown: str, progress: dict) -> tuple[float | None, float | None]:
    """Seconds since the run started (to now while it runs, else to when it last did something) and an
    estimate of the seconds left from the rollout rate so far."""
    started = as_utc(run.started_at)
    if started is None:
        return None, None
    if shown == JobStatus.RUNNING:
        end = datetime.now(UTC)
    else:
        end = as_utc(run.finished_at) or as_utc(run.heartbeat_at) or datetime.now(UTC)
    elapsed = max(0.0, (end - started).total_seconds())
    if shown == JobStatus.COMPLETED:
        return elapsed, 0.0
    done, total = progress.get("rollouts_done", 0), progress.get("rollouts_total", 0)
    if shown != JobStatus.RUNNING or not done or not total or elapsed <= 0:
        return elapsed, None
    return elapsed, max(0, total - done) * elapsed / done


def load_run_view(run_id: int) -> dict | None:
    """The run, its steps' mean rewards and the sizes of the versions it went through, in one session."""
    with Session(engine()) as session:
        run = queries.run_by_id(session, run_id)
        if run is None:
            return None
        steps = queries.steps(session, run_id)
        rewards = [(i + 1, s.reward_mean) for i, s in enumerate(steps) if s.reward_mean is not None]
        versions = queries.run_versions(session, run_id)
        start = queries.version_by_id(session, run.start_version_id) if run.start_version_id else None
        numbers = {v.id: v.number for v in ([start] if start else []) + versions}
        sizes = [(v.number, len(v.experiences)) for v in ([start] if start else []) + versions]
    gates = [{"step": i + 1, "epoch": s.epoch + 1, "batch": s.batch_index + 1,
              "decision": s.gate.get("decision", ""), "gate": s.gate.get("line", "")}
             for i, s in enumerate(steps) if s.gate]
    return {"run": run, "rewards": rewards, "sizes": sorted(set(sizes)), "gates": gates,
            "validation": validation_by_version(steps, numbers)}


def validation_by_version(steps, numbers: dict[int, int]) -> list[tuple[int, float]]:
    """The gate's validation mean of each version the run went through (its starting library and each
    candidate that landed), in version order."""
    means: dict[int, float] = {}
    for step in steps:
        gate = step.gate or {}
        if "mean_before" not in gate:
            continue
        if step.version_before_id in numbers:
            means.setdefault(numbers[step.version_before_id], gate["mean_before"])
        if step.version_after_id in numbers and step.version_after_id != step.version_before_id:
            means.setdefault(numbers[step.version_after_id], gate["mean_after"])
    return sorted(means.items())


def progress_chart(rewards: list[tuple[int, float]], sizes: list[tuple[int, int]],
                   validation: list[tuple[int, float]]) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, subplot_titles=("Mean reward per step", "Library size per version",
                                                        "Validation mean per version"))
    fig.add_trace(go.Scatter(x=[s for s, _ in rewards], y=[r for _, r in rewards], mode="lines+markers",
                             name="mean reward"), row=1, col=1)
    fig.add_trace(go.Scatter(x=[n for n, _ in sizes], y=[k for _, k in sizes], mode="lines+markers",
                             line_shape="hv", name="experiences"), row=1, col=2)
    fig.update_xaxes(title_text="step", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="mean reward", range=[-0.05, 1.05], row=1, col=1)
    fig.add_trace(go.Scatter(x=[n for n, _ in validation], y=[m for _, m in validation], mode="lines+markers",
                             name="validation mean"), row=1, col=3)
    fig.update_xaxes(title_text="version", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="experiences", rangemode="tozero", row=1, col=2)
    fig.update_xaxes(title_text="version", dtick=1, row=1, col=3)
    fig.update_yaxes(title_text="validation mean", range=[-0.05, 1.05], row=1, col=3)
    fig.update_layout(height=320, showlegend=False, margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig


def request(change, run_id: int, done: str) -> None:
    """Pause, resume or cancel the run (a button's callback); a run queued again needs a worker."""
    if run_action(FLASH, "control", change, engine(), run_id, context().reviewer, success=done) is not None \
            and change is resume_run:
        start_worker_if_needed()


def control_buttons(run_id: int, shown: str) -> None:
    """Only the requests that make sense for the run's (shown) status."""
    left, middle, right, _ = st.columns([1, 1, 1, 4])
    if shown in PERSON_MAY_PAUSE:
        left.button("Pause", key="train_pause", icon=":material/pause:", on_click=request,
                    args=(pause_run, run_id, f"Run #{run_id} paused"))
    if shown in PERSON_MAY_RESUME:
        middle.button("Resume", key="train_resume", icon=":material/play_arrow:", on_click=request,
                      args=(resume_run, run_id, f"Run #{run_id} queued again"))
    if shown in PERSON_MAY_CANCEL:
        right.button("Cancel", key="train_cancel", icon=":material/stop:", on_click=request,
                     args=(cancel_run, run_id, f"Run #{run_id} cancelled"))


@st.fragment(run_every=2)
def live_progress(run_id: int) -> None:
    """Everything that moves while a run executes; redrawn on its own every two seconds."""
    view = load_run_view(run_id)
    if view is None:
        st.warning(f"Run #{run_id} no longer exists.")
        return
    run = view["run"]
    shown = job_health(run.status, run.heartbeat_at)
    progress = run.progress or {}
    settings = RunSettings.from_dict(run.settings or {})

    st.markdown(f"**Status:** {status_label(run.status, run.heartbeat_at)}")
    if shown == JobStatus.STALLED:
        st.warning(f"The worker executing run #{run_id} stopped beating: the run is not moving. "
                   "Resume it to queue it again for a live worker (what is stored is kept).")
    FLASH.show("control")
    if allowed("reviewer"):
        control_buttons(run_id, shown)
    if shown == JobStatus.AWAITING_REVIEW:
        st.info(f"Run #{run_id} waits for a reviewer: decide its proposed operations, then it goes on.")
        st.page_link("pages/review.py", label="Open Review", icon=":material/rate_review:")
    if shown == JobStatus.AWAITING_LABELS:
        st.info(f"Run #{run_id} waits for labels: score its rollouts in the labeling queue, then it goes on.")
        st.page_link("pages/labeling.py", label="Open Labeling", icon=":material/label:")
    if run.error:
        st.caption("Error" if shown == JobStatus.FAILED else "Why it stopped")
        show_text(run.error)

    elapsed, left = elapsed_and_left(run, shown, progress)
    cost = progress.get("cost", 0.0)
    budget = f" of ${settings.budget_usd:.2f}" if settings.budget_usd else ""
    row1 = st.columns(5)
    row1[0].metric("Steps", fraction(progress.get("steps_done", 0), progress.get("steps_total", 0)))
    row1[1].metric("Rollouts", fraction(progress.get("rollouts_done", 0), progress.get("rollouts_total", 0)))
    row1[2].metric("Rewards", progress.get("rewards", 0))
    row1[3].metric("Summaries", progress.get("summaries", 0))
    row1[4].metric("Advantages", progress.get("advantages", 0),
                   help="Groups whose semantic advantage was extracted.")
    row2 = st.columns(5)
    row2[0].metric("Operations", progress.get("operations", 0), help="Library operations the learner proposed.")
    tokens_in, tokens_out = progress.get("tokens_in", 0), progress.get("tokens_out", 0)
    row2[1].metric("Tokens", compact(tokens_in + tokens_out),
                   help=f"{tokens_in:,} in (prompts) · {tokens_out:,} out (completions)")
    row2[2].metric("Cost", f"${cost:.4f}{budget}")
    row2[3].metric("Elapsed", duration(elapsed))
    row2[4].metric("Time left", duration(left), help="Estimated from the rollout rate so far.")
    st.caption(
        f"Groups skipped (all rewards equal): {progress.get('groups_skipped', 0)} · "
        f"groups failed: {progress.get('groups_failed', 0)} · "
        f"operations applied: {progress.get('operations_applied', 0)} · "
        f"invalid: {progress.get('operations_invalid', 0)} · "
        f"rollout errors: {progress.get('rollout_errors', 0)} · "
        f"model calls: {progress.get('calls', 0)} (cache hits {progress.get('cache_hits', 0)})"
    )
    st.plotly_chart(progress_chart(view["rewards"], view["sizes"], view["validation"]), key="train_chart")
    if settings.gate == GateRule.OFF:
        st.caption("Validation gate: off (every approved operation lands).")
    else:
        st.caption(f"Validation gate: {settings.gate} on {progress.get('validation_queries', '?')} "
                   f"{progress.get('validation_split', 'validation')} queries x {settings.gate_k}")
    if view["gates"]:
        st.dataframe(pd.DataFrame(view["gates"]), hide_index=True, key="train_gates_table")


def form_settings() -> RunSettings:
    """The run settings as the form holds them (its widgets' values, by key)."""
    state = st.session_state
    return RunSettings.build(
        epochs=int(state["train_epochs"]), batch_size=int(state["train_batch_size"]),
        group_size=int(state["train_group_size"]), temperature=float(state["train_temperature"]),
        concurrency=int(state["train_concurrency"]), limit=int(state["train_limit"]) or None,
        seed=int(state["train_seed"]), ground_truth=bool(state["train_ground_truth"]),
        review_mode=state["train_review_mode"], policy_model=state["train_policy_model"].strip(),
        learner_model=state["train_learner_model"].strip(), max_tokens=int(state["train_max_tokens"]),
        budget_usd=float(state["train_budget"]) or None, gate=state["train_gate"],
        validation_size=optional_int(state.get("train_validation_size")), gate_k=int(state["train_gate_k"]),
        max_operations=optional_int(state.get("train_max_operations")),
        max_experiences=int(state["train_max_experiences"]))


def optional_int(value) -> int | None:
    """An empty number box means the setting's automatic default."""
    return None if value is None else int(value)


def start_run(task_name: str) -> None:
    """Queue a run with the form's settings (the Start run button's callback); a worker takes it."""
    ctx = context()
    run_id = run_action(FLASH, "new run", lambda: create_run(engine(), task_name, form_settings(),
                                                             library_name=ctx.library, created_by=ctx.reviewer),
                        success="Run queued")
    if run_id is not None:
        st.session_state[RUN_KEY] = run_id
        start_worker_if_needed()


def settings_form(task) -> None:
    """The run settings; Start run queues the run (or says why it cannot be)."""
    with st.form("train_form"):
        c1, c2, c3, c4 = st.columns(4)
        c1.number_input("Epochs", value=DEFAULTS.epochs, step=1, key="train_epochs")
        c2.number_input("Batch size", value=DEFAULTS.batch_size, step=1, key="train_batch_size",
                        help="Training queries per step.")
        c3.number_input("Group size (G)", value=DEFAULTS.group_size, step=1, key="train_group_size",
                        help="Attempts per query; their differences teach the learner.")
        c4.number_input("Temperature", value=DEFAULTS.temperature, step=0.1, format="%.2f",
                        key="train_temperature")
        c1.number_input("Concurrency", value=DEFAULTS.concurrency, step=1, key="train_concurrency",
                        help="Model calls in flight at once.")
        c2.number_input("Training queries limit (0 = all)", value=0, min_value=0, step=1, key="train_limit")
        c3.number_input("Seed", value=DEFAULTS.seed, step=1, key="train_seed")
        c4.number_input("Max tokens per answer", value=DEFAULTS.max_tokens, min_value=16, step=64,
                        key="train_max_tokens")
        m1, m2 = st.columns(2)
        m1.text_input("Policy model", value=task.policy_model, key="train_policy_model",
                      help="The model that answers the queries.")
        m2.text_input("Learner model", value=task.learner_model, key="train_learner_model",
                      help="The model that summarises attempts and proposes experiences.")
        o1, o2, o3 = st.columns(3)
        o1.checkbox("Ground truth", value=True, key="train_ground_truth",
                    help="Score answers against the reference; off: the group's majority answer.")
        o2.radio("Review mode", ["auto", "manual"], horizontal=True, key="train_review_mode",
                 help="manual: every proposed library change waits for a person.")
        o3.number_input("Budget USD (0 = none)", value=0.0, min_value=0.0, step=0.5, format="%.2f",
                        key="train_budget", help="The run pauses when its cost reaches the budget.")
        g1, g2, g3, g4, g5 = st.columns(5)
        g1.selectbox("Validation gate", [rule.value for rule in GateRule], index=list(GateRule).index(DEFAULTS.gate),
                     key="train_gate", help=RunSettings.model_fields["gate"].description)
        g2.number_input("Validation queries", value=None, min_value=0, step=1, key="train_validation_size",
                        placeholder="automatic", help=RunSettings.model_fields["validation_size"].description
                        + ". A task with a validation split uses all of it.")
        g3.number_input("Gate samples per query", value=DEFAULTS.gate_k, min_value=1, step=1, key="train_gate_k")
        g4.number_input("Operations per step", value=None, min_value=1, step=1, key="train_max_operations",
                        placeholder="automatic", help=RunSettings.model_fields["max_operations"].description)
        g5.number_input("Max experiences", value=DEFAULTS.max_experiences, min_value=1, step=1,
                        key="train_max_experiences", help=RunSettings.model_fields["max_experiences"].description)
        st.form_submit_button("Start run", key="train_submit", type="primary", on_click=start_run,
                              args=(task.name,))
    FLASH.show("new run")


def page() -> None:
    st.title("Train")
    _ctx, task = require_task()
    st.header("New run")
    if allowed("reviewer"):
        settings_form(task)
    else:
        role_note("reviewer", "starting a run")

    st.header("Runs")
    with Session(engine()) as session:
        runs = queries.runs(session, task.id, kinds=LEARNING_KINDS)
    if not runs:
        st.info("No runs of this task yet: set the run above and press Start run.")
        return
    # the status is live, below
    labels = {r.id: f"#{r.id} · started {r.created_at:%Y-%m-%d %H:%M} by {r.created_by}" for r in runs}
    if st.session_state.get(RUN_KEY) not in labels:
        st.session_state[RUN_KEY] = runs[0].id
    selected = st.selectbox("Run", list(labels), format_func=lambda run_id: labels.get(run_id, f"#{run_id}"),
                            key=RUN_KEY)
    live_progress(selected)
    chosen = next(r for r in runs if r.id == selected)
    with st.expander("Settings of this run"):
        st.dataframe(pd.DataFrame({"setting": list(chosen.settings),
                                   "value": [str(v) for v in chosen.settings.values()]}),
                     hide_index=True, key="train_settings_table")


run_page(page)
