"""Train: start a run with its settings, follow it live (per-stage counters, reward per step, library
size, tokens and cost, time left) and pause, resume or cancel it.

Runs are executed by the worker; this page only queues them (`core.grpo.training.create_run`) and writes
a person's requests (`core.jobs.run_control`). Counters come from `run.progress`, which the worker keeps
up to date, so the live view costs a handful of small reads every two seconds. Time left, the estimate
before Start, a queued run's place in line and the status in words come from `core.records.runs.progress`; the model
choices from `core.records.models.options` (the task's models, the default, each connection's served models; a
name can be typed); the notice about an embedded learner from `core.records.models.learner_advice`.

The settings are plain widgets (no st.form), so a preset fills them and the estimate under them follows
every change. A preset is a button, not a choice that tracks the form: a widget that a callback rewrites
races the browser, which on a busy machine sends back the choice's old value with the next change and so
re-applies the old preset over everything typed. What the settings match is shown in words instead
(`preset_matched`). The Overview's Quick trial button asks for the quick preset through PRESET_REQUEST.
A preset never touches the Policy and Learner models: they start from the task's models, keep what the person
chose for this task (also across a page switch, ui.common.restore_model), and a preset sets everything else.

The learning switches (worked examples, lessons, learning from the reference) and the library's entry selection
start from the defaults core chooses for the run's learner with the measured reason for each
(`core.records.runs.defaults.chosen_defaults`, shown under the settings); the switches follow a change of the
learner or of ground truth while they still hold the defaults chosen before, and one a person changed stays.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots
from sqlmodel import Session

from core.errors import DuplicateJob, InvalidInput
from core.grpo.training import create_run_with_defaults
from core.jobs.run_control import cancel_run, pause_run, resume_run
from core.records.models.connections import failed_test_warning
from core.records.models.learner_advice import learner_advice
from core.records.review.gate_verdict import GateVerdict
from core.records.runs.defaults import Choice, chosen_defaults
from core.records.runs.outcome import learned_nothing, production_note, space_note
from core.records.runs.progress import (
    compact,
    duration,
    estimate_words,
    form_estimate,
    queue_position,
    queue_words,
    run_estimate,
    status_words,
)
from core.records.runs.settings import RunSettings, run_settings
from core.records.runs.workers import job_health
from storage import queries
from storage.statuses import (
    LEARNING_KINDS,
    PERSON_MAY_CANCEL,
    PERSON_MAY_PAUSE,
    PERSON_MAY_RESUME,
    GateRule,
    JobStatus,
)
from storage.tables import as_utc
from ui.common import (
    LIBRARY_KEY,
    Flash,
    allowed,
    context,
    engine,
    id_select,
    model_picker,
    models_note,
    offered_models,
    plain,
    require_task,
    restore_model,
    role_note,
    run_action,
    run_page,
    show_text,
    start_worker_if_needed,
    status_label,
)
from ui.display import table

FLASH = Flash("train_flash")
RUN_KEY = "train_run"
CONFIRM_KEY = "train_confirm"  # (action, run id) a control button asked to confirm
GOTO_KEY = "train_goto"  # a page to switch to, set by a button's callback (switching needs the script)
EVAL_HANDOFF_KEY = "eval_version"  # the Evaluate page selects the version id it finds here
EVAL_MODEL_HANDOFF_KEY = "eval_model"  # ... and the model the run learned with
PRESET_REQUEST = "train_preset_request"  # another page (Overview's Quick trial) asks for a preset here
CHOSEN_KEY = "train_chosen"  # the learning switches' widget values core last chose for the form's learner
PRESET_SWITCHES_KEY = "train_preset_switches"  # the learning switches the last preset sets itself (not defaults)
# The settings core chooses a default for (core.records.runs.defaults), by the widget that holds each.
CHOSEN_WIDGETS = {"examples": "train_examples", "lessons": "train_lessons",
                  "reference_when_all_fail": "train_reference_when_all_fail"}
# A quick trial: 4 queries, G=4, one epoch, one step. Manual review, so the person sees what the learner
# proposes and decides it. The validation gate is off: the few queries a trial can hold out measure noise,
# not effect, and the gate's two evaluations would cost more calls than the trial itself; Evaluate measures
# the result on held-out queries afterwards. A group where every attempt failed learns from the reference, so a
# task the agent fails completely (the shop-policies demo before it knows the policies) still shows proposals.
# Everything else is what core chooses for the form's learner, as for any run; the models stay as chosen.
QUICK_TRIAL = {"limit": 4, "batch_size": 4, "group_size": 4, "epochs": 1, "review_mode": "manual",
               "gate": GateRule.OFF.value, "reference_when_all_fail": True}
PRESETS = {"quick": "Quick trial (4 queries, G=4, 1 epoch)", "full": "Full run (defaults)"}
PRESET_NAMES = {"quick": "the quick trial", "full": "the defaults of a full run"}


def fraction(done: int, total: int) -> str:
    return f"{done} / {total if total else '?'}"


def elapsed(run, shown: str) -> float | None:
    """Seconds since the run started: to now while it runs, else to when it last did something."""
    started = as_utc(run.started_at)
    if started is None:
        return None
    if shown == JobStatus.RUNNING:
        end = datetime.now(UTC)
    else:
        end = as_utc(run.finished_at) or as_utc(run.heartbeat_at) or datetime.now(UTC)
    return max(0.0, (end - started).total_seconds())


def time_left(run, shown: str) -> tuple[float | None, str]:
    """Seconds left over all stages (core.records.runs.progress) and what the figure rests on, for the metric's help."""
    if shown == JobStatus.COMPLETED:
        return 0.0, "The run is completed."
    if shown == JobStatus.CANCELLED:
        return None, "The run is cancelled: nothing more is planned."
    if shown == JobStatus.FAILED:
        return None, "The run failed: nothing is planned until it is resumed."
    with Session(engine()) as session:
        estimate = run_estimate(session, run)
    if estimate is None:
        return None, "Nothing can be said yet."
    waiting = "" if shown in (JobStatus.RUNNING, JobStatus.QUEUED) else \
        " Model time once it goes on; the time a person takes is not counted."
    return estimate.seconds, f"All stages still to come, {estimate.basis}.{waiting}"


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
        pending = sum(queries.pending_operations_by_step(session, run_id).values())
        library = next((lib.name for lib in queries.libraries(session, run.task_id) if lib.id == run.library_id), None)
        place = queue_position(session, run)
    gates = [{"step": i + 1, "epoch": s.epoch + 1, "batch": s.batch_index + 1,
              "decision": gate.decision or "", "gate": gate.line}
             for i, s in enumerate(steps) if (gate := GateVerdict.of(s))]
    return {"run": run, "rewards": rewards, "sizes": sorted(set(sizes)), "gates": gates,
            "validation": validation_by_version(steps, numbers), "steps": steps, "numbers": numbers,
            "pending": pending, "library": library, "place": place}


def validation_by_version(steps, numbers: dict[int, int]) -> list[tuple[int, float]]:
    """The gate's validation mean of each version the run went through (its starting library and each
    candidate that landed), in version order."""
    means: dict[int, float] = {}
    for step in steps:
        gate = GateVerdict.of(step)
        if gate is None or not gate.measured:
            continue
        if step.version_before_id in numbers:
            means.setdefault(numbers[step.version_before_id], gate.mean_before)
        if step.version_after_id in numbers and step.version_after_id != step.version_before_id:
            means.setdefault(numbers[step.version_after_id], gate.mean_after)
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
    """Pause, resume or cancel the run (the confirmation's callback); a run queued again needs a worker."""
    st.session_state.pop(CONFIRM_KEY, None)
    if run_action(FLASH, "control", change, engine(), run_id, context().reviewer, success=done) is not None \
            and change is resume_run:
        start_worker_if_needed()


def ask(action: str, run_id: int) -> None:
    """A control button's callback: the next redraw asks for a confirmation instead of acting at once."""
    st.session_state[CONFIRM_KEY] = (action, run_id)


def keep_running() -> None:
    st.session_state.pop(CONFIRM_KEY, None)


CONTROLS = {
    "pause": (pause_run, PERSON_MAY_PAUSE, "Pause run {id}? The call in flight finishes; resume continues where "
              "it stopped.", "Keep running", "Run {id} paused"),
    "resume": (resume_run, PERSON_MAY_RESUME, "Resume run {id}? It is queued again, and a worker continues it "
               "where it stopped; what is stored is kept.", "Leave it as it is", "Run {id} queued again"),
    "cancel": (cancel_run, PERSON_MAY_CANCEL, "Cancel run {id} for good? Versions it already created stay; a "
               "cancelled run cannot be resumed.", "Keep the run", "Run {id} cancelled"),
}


def toggle_action(shown: str) -> str | None:
    """The one primary button: Resume when the run may resume (a stalled one too), else Pause when it may pause."""
    if shown in PERSON_MAY_RESUME:
        return "resume"
    return "pause" if shown in PERSON_MAY_PAUSE else None


def control_buttons(run_id: int, shown: str) -> None:
    """One primary toggle (Pause or Resume) and Cancel; pressing either asks for a confirmation first."""
    asked = st.session_state.get(CONFIRM_KEY)
    if asked and asked[1] == run_id and shown in CONTROLS[asked[0]][1]:
        confirm(asked[0], run_id)
        return
    if asked and asked[1] == run_id:  # the run moved on meanwhile: the question no longer applies
        keep_running()
    left, right, _ = st.columns([1, 1, 5])
    toggle = toggle_action(shown)
    if toggle:
        left.button(toggle.capitalize(), key=f"train_{toggle}", type="primary", on_click=ask, args=(toggle, run_id),
                    icon=":material/play_arrow:" if toggle == "resume" else ":material/pause:")
    if shown in PERSON_MAY_CANCEL:
        right.button("Cancel", key="train_cancel", icon=":material/stop:", on_click=ask, args=("cancel", run_id))


def confirm(action: str, run_id: int) -> None:
    """The question, with Confirm (acts through core.jobs.run_control) and a way back that does nothing."""
    change, _allowed, question, back, done = CONTROLS[action]
    st.warning(question.format(id=run_id))
    left, right, _ = st.columns([1, 1, 5])
    left.button("Confirm", key="train_confirm_yes", type="primary", on_click=request,
                args=(change, run_id, done.format(id=run_id)))
    right.button(back, key="train_confirm_no", on_click=keep_running)


def go_evaluate(version_id: int, library: str | None, model: str) -> None:
    """The Evaluate this version button's callback: the Evaluate page picks the version and the model the run
    learned with up from its handoff keys, in the run's library; the switch itself happens in the script
    (next_steps)."""
    st.session_state[EVAL_HANDOFF_KEY] = str(version_id)
    st.session_state[EVAL_MODEL_HANDOFF_KEY] = model
    if library:
        st.session_state[LIBRARY_KEY] = library
    st.session_state[GOTO_KEY] = "pages/evaluate.py"


def next_steps(view: dict) -> None:
    """After a run completes: evaluate the version it made, or open it in the Library."""
    run = view["run"]
    nothing = learned_nothing(view["steps"])
    if nothing:
        st.warning(f"Run {run.id} is completed, and learned nothing: {nothing}")
        return
    st.success(f"Run {run.id} is completed. Next: measure its version on held-out queries, or read it.")
    if space := space_note(view["steps"]):
        st.warning(space)
    left, right, _ = st.columns([1, 1, 3])
    if run.current_version_id is not None:
        left.button("Evaluate this version", key="train_evaluate", type="primary", icon=":material/leaderboard:",
                    on_click=go_evaluate, args=(run.current_version_id, view["library"],
                                                run_settings(run).policy_model))
    right.page_link("pages/library.py", label="Open in Library", icon=":material/library_books:")
    target = st.session_state.get(GOTO_KEY)  # kept until Evaluate has drawn (it pops it): a switch lost in a
    if target:  # rerun merged with another (a timed fragment's, on a busy machine) is asked again at the next tick
        st.switch_page(target)


def run_metrics(run, shown: str, progress: dict, settings: RunSettings) -> None:
    """The counters, tokens, cost, elapsed time and the time left over all stages."""
    left, basis = time_left(run, shown)
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
    row2[3].metric("Elapsed", duration(elapsed(run, shown)))
    row2[4].metric("Time left", duration(left), help=plain(basis))


@st.fragment(run_every=2)
def live_progress(run_id: int) -> None:
    """Everything that moves while a run executes; redrawn on its own every two seconds."""
    view = load_run_view(run_id)
    if view is None:
        st.warning(f"Run {run_id} no longer exists.")
        return
    run = view["run"]
    shown = job_health(run.status, run.heartbeat_at)
    progress = run.progress or {}
    settings = run_settings(run)

    words = status_words(run, view["steps"], view["numbers"], shown, view["pending"])
    st.markdown(f"**Status:** {plain(words)}")
    st.caption(f"Stored status: {status_label(run.status, run.heartbeat_at)}")
    if view["place"] is not None:
        st.info(queue_words(view["place"]))
    if shown == JobStatus.STALLED:
        st.warning(f"The worker executing run {run_id} stopped beating: the run is not moving. "
                   "Resume it to queue it again for a live worker (what is stored is kept).")
    FLASH.show("control")
    if allowed("reviewer"):
        control_buttons(run_id, shown)
    if shown == JobStatus.COMPLETED:
        next_steps(view)
    if shown == JobStatus.AWAITING_REVIEW:
        st.info(f"Run {run_id} waits for a reviewer: decide its proposed operations, then it goes on.")
        st.page_link("pages/review.py", label="Open Review", icon=":material/rate_review:")
    if shown == JobStatus.AWAITING_LABELS:
        st.info(f"Run {run_id} waits for labels: score its rollouts in the labeling queue, then it goes on.")
        st.page_link("pages/labeling.py", label="Open Labeling", icon=":material/label:")
    if run.error:
        st.caption("Error" if shown == JobStatus.FAILED else "Why it stopped")
        show_text(run.error)

    run_metrics(run, shown, progress, settings)
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
    with Session(engine()) as session:
        from_production = production_note(session, run, view["steps"])
    if from_production:
        st.info(from_production)
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
        review_mode=state["train_review_mode"], policy_model=str(state["train_policy_model"] or "").strip(),
        learner_model=str(state["train_learner_model"] or "").strip(), max_tokens=int(state["train_max_tokens"]),
        budget_usd=float(state["train_budget"]) or None, gate=state["train_gate"],
        validation_size=optional_int(state.get("train_validation_size")), gate_k=int(state["train_gate_k"]),
        max_operations=optional_int(state.get("train_max_operations")),
        max_experiences=int(state["train_max_experiences"]), hold_flagged=bool(state["train_hold_flagged"]),
        examples=bool(state["train_examples"]), lessons=bool(state["train_lessons"]),
        max_examples=int(state["train_max_examples"]),
        reference_when_all_fail=bool(state["train_reference_when_all_fail"]))


def optional_int(value) -> int | None:
    """An empty number box means the setting's automatic default."""
    return None if value is None else int(value)


def chosen_for(task, given: dict) -> tuple[RunSettings, list[Choice]]:
    """A new run's settings with the defaults core chooses where `given` sets nothing, and the reasons."""
    with Session(engine()) as session:
        return chosen_defaults(session, task, given, library_name=context().library)


def widget_values(settings: RunSettings) -> dict:
    """Every form widget's value for these settings (an empty box or 0 is the automatic default), but the models:
    a preset or a default never replaces the model a person or the task chose."""
    return {"train_epochs": settings.epochs, "train_batch_size": settings.batch_size,
            "train_group_size": settings.group_size, "train_temperature": settings.temperature,
            "train_concurrency": settings.concurrency, "train_limit": settings.limit or 0, "train_seed": settings.seed,
            "train_max_tokens": settings.max_tokens, "train_ground_truth": settings.ground_truth,
            "train_review_mode": settings.review_mode, "train_budget": settings.budget_usd or 0.0,
            "train_gate": settings.gate.value, "train_validation_size": settings.validation_size,
            "train_gate_k": settings.gate_k, "train_max_operations": settings.max_operations,
            "train_max_experiences": settings.max_experiences, "train_hold_flagged": settings.hold_flagged,
            "train_max_examples": settings.max_examples,
            **{widget: getattr(settings, name) for name, widget in CHOSEN_WIDGETS.items()}}


def form_learner(task) -> str:
    """The learner the form holds (the task's until one is chosen)."""
    return str(st.session_state.get("train_learner_model") or "").strip() or task.learner_model


def form_defaults(task) -> dict:
    """Every form widget's starting value but the models': the defaults core chooses for the form's learner."""
    settings, _choices = chosen_for(task, {"learner_model": form_learner(task)})
    return widget_values(settings)


def preset_values(task, preset: str) -> dict:
    """Every form widget's value under a preset but the models': the defaults, or the quick trial's settings with
    the defaults core chooses for the form's learner. The models stay as the person or the task chose them."""
    if preset != "quick":
        return form_defaults(task)
    settings, _choices = chosen_for(task, {**QUICK_TRIAL, "learner_model": form_learner(task)})
    return widget_values(settings)


def apply_preset(task, preset: str) -> None:
    """A preset button's callback: fill the form with the preset's values."""
    st.session_state.update(preset_values(task, preset))
    st.session_state[PRESET_SWITCHES_KEY] = {name: value for name, value in QUICK_TRIAL.items()
                                             if name in CHOSEN_WIDGETS} if preset == "quick" else {}


def preset_matched(task) -> str | None:
    """The preset whose values the form holds now, or None when the settings were changed by hand."""
    for preset in PRESETS:
        if all(st.session_state.get(key) == value for key, value in preset_values(task, preset).items()):
            return preset
    return None


def prepare_form(task) -> list[Choice]:
    """Before the widgets: the models last chosen for this task (else the task's), a preset another page asked
    for, else the defaults for widgets not yet drawn; then the learning switches follow the defaults chosen for
    the form's learner. Returns those choices."""
    for key, task_model in (("train_policy_model", task.policy_model), ("train_learner_model", task.learner_model)):
        restore_model(key, task.id, task_model)
    requested = st.session_state.pop(PRESET_REQUEST, None)
    if requested in PRESETS:
        apply_preset(task, requested)
    for key, value in form_defaults(task).items():
        st.session_state.setdefault(key, value)
    return follow_chosen(task)


def follow_chosen(task) -> list[Choice]:
    """The defaults core chooses for the form's learner and ground truth, with their reasons. When either changed,
    each switch that still holds the default chosen before takes the new one; a switch a person changed stays
    (the notice under the settings then says so, with a button to take the defaults)."""
    state = st.session_state
    given = {"learner_model": form_learner(task), "ground_truth": bool(state["train_ground_truth"])}
    try:  # a preset's own switch (the quick trial learns from the reference) is no default to follow
        settings, choices = chosen_for(task, {**state.get(PRESET_SWITCHES_KEY, {}), **given})
    except InvalidInput:  # it does not fit the form any more (ground truth off)
        settings, choices = chosen_for(task, given)
    values = {widget: getattr(settings, name) for name, widget in CHOSEN_WIDGETS.items()}
    before = state.get(CHOSEN_KEY) or values
    state.update({widget: value for widget, value in values.items()
                  if value != before[widget] and state.get(widget) == before[widget]})
    state[CHOSEN_KEY] = values
    return [choice for choice in choices if choice.field in CHOSEN_WIDGETS]  # the selection follows the form's switches


def take_chosen(values: dict) -> None:
    """The notice's button: put the chosen defaults in the switches."""
    st.session_state.update(values)


def queue_run(task_name: str, library: str, actor: str) -> int:
    """Queue the form's run (create_run refuses a model that cannot be called here). Empty model fields mean
    the task's models; the library's selection takes the default core chooses where it applies."""
    try:
        run_id, _choices = create_run_with_defaults(engine(), task_name, form_settings(), library_name=library,
                                                    created_by=actor)
    except DuplicateJob as exc:  # the form sent twice: Runs below shows the run already queued
        st.session_state[RUN_KEY] = exc.existing_id
        raise
    return run_id


def start_run(task) -> None:
    """Queue a run with the form's settings (the Start run button's callback); a worker takes it. The switches
    follow the learner first, as a redraw would have (a change and the click can arrive together)."""
    ctx = context()
    follow_chosen(task)
    run_id = run_action(FLASH, "new run", queue_run, task.name, ctx.library, ctx.reviewer, success="Run queued")
    if run_id is not None:
        st.session_state[RUN_KEY] = run_id
        start_worker_if_needed()


def model_fields(task) -> None:
    """Policy and Learner: the task's models, the default, each connection's served models and the rest
    (core.records.models.options); a preset never changes them."""
    options = offered_models(task)
    m1, m2 = st.columns(2)
    for column, label, key, task_model, role in (
            (m1, "Policy model", "train_policy_model", task.policy_model, "The model that answers the queries."),
            (m2, "Learner model", "train_learner_model", task.learner_model,
             "The model that summarises attempts and proposes experiences.")):
        chosen = model_picker(column, label, key, options, task_id=task.id, start=task_model,
                     help=role + " The task's models, the studio's default, each model connection's models (as its "
                                 "server lists them), the embedded models and those of every provider whose API key "
                                 "is set; type another name (connection/model or a litellm name) if you need one. "
                                 "The presets never change it.")
        with Session(engine()) as session:
            untested = failed_test_warning(session, chosen)
        if untested:
            column.warning(plain(untested), icon=":material/cloud_off:")
    models_note("train_refresh_models")


def settings_widgets(task) -> None:
    """The run settings, filled from the session (a preset or the defaults)."""
    c1, c2, c3, c4 = st.columns(4)
    c1.number_input("Epochs", step=1, key="train_epochs")
    c2.number_input("Batch size", step=1, key="train_batch_size", help="Training queries per step.")
    c3.number_input("Group size (G)", step=1, key="train_group_size",
                    help="Attempts per query; their differences teach the learner.")
    c4.number_input("Temperature", step=0.1, format="%.2f", key="train_temperature")
    c1.number_input("Concurrency", step=1, key="train_concurrency", help="Model calls in flight at once.")
    c2.number_input("Training queries limit (0 = all)", min_value=0, step=1, key="train_limit")
    c3.number_input("Seed", step=1, key="train_seed")
    c4.number_input("Max tokens per answer", min_value=16, step=64, key="train_max_tokens")
    model_fields(task)
    o1, o2, o3 = st.columns(3)
    o1.checkbox("Ground truth", key="train_ground_truth",
                help="Score answers against the reference; off: the group's majority answer.")
    o2.radio("Review mode", ["auto", "manual"], horizontal=True, key="train_review_mode",
             help="manual: every proposed library change waits for a person.")
    o2.checkbox("Refuse flagged operations in auto mode", key="train_hold_flagged",
                help="In auto mode, an operation flagged as cut off, a near-duplicate, naming a query's numbers "
                     "or too long is refused before the validation gate (invalid, the flag as the reason, shown "
                     "on Review); unchecked, it is measured and approved like the others. In manual mode every "
                     "operation waits for the reviewer, with its flags.")
    o3.number_input("Budget USD (0 = none)", min_value=0.0, step=0.5, format="%.2f", key="train_budget",
                    help="The run pauses when its cost reaches the budget.")
    g1, g2, g3, g4, g5 = st.columns(5)
    g1.selectbox("Validation gate", [rule.value for rule in GateRule], key="train_gate",
                 help=RunSettings.model_fields["gate"].description)
    g2.number_input("Validation queries", value=None, min_value=0, step=1, key="train_validation_size",
                    placeholder="automatic", help=RunSettings.model_fields["validation_size"].description
                    + ". A task with a validation split uses all of it.")
    g3.number_input("Gate samples per query", min_value=1, step=1, key="train_gate_k")
    g4.number_input("Operations per step", value=None, min_value=1, step=1, key="train_max_operations",
                    placeholder="automatic", help=RunSettings.model_fields["max_operations"].description)
    g5.number_input("Max experiences", min_value=1, step=1, key="train_max_experiences",
                    help=RunSettings.model_fields["max_experiences"].description)
    w1, w2, w3, w4 = st.columns(4)
    w1.checkbox("Worked examples", key="train_examples", help=RunSettings.model_fields["examples"].description
                + ". A small agent learns from worked examples where abstract lessons do not move it.")
    w2.number_input("Max worked examples", min_value=1, step=1, key="train_max_examples",
                    help=RunSettings.model_fields["max_examples"].description)
    w3.checkbox("Lessons", key="train_lessons", help=RunSettings.model_fields["lessons"].description)
    w4.checkbox("Learn from the reference when every attempt failed", key="train_reference_when_all_fail",
                help=RunSettings.model_fields["reference_when_all_fail"].description
                + ". The paper skips such groups; turn this on when the agent lacks knowledge (a company's "
                  "policies, formats, names) that only the reference answers hold.")


def chosen_notice(task, choices: list[Choice]) -> None:
    """The defaults core chose for this run and why (the figure behind each), the library's selection among them
    where it applies to the form's settings; a switch changed by hand is named, with a button to take them."""
    state = st.session_state
    try:
        with Session(engine()) as session:
            _settings, selection = chosen_defaults(session, task, form_settings(), library_name=context().library)
    except InvalidInput:
        selection = []
    learner = form_learner(task)
    lines = "\n".join(f"- {plain(choice.line())}" for choice in [*choices, *selection])
    st.info(f"Defaults chosen for the learner {plain(learner)}:\n{lines}", icon=":material/tune:")
    changed = [choice for choice in choices if state.get(CHOSEN_WIDGETS[choice.field]) != choice.value]
    if changed:
        left, right = st.columns([3, 1], vertical_alignment="center")
        left.caption("Changed here: " + "; ".join(f"{choice.label} {'on' if state.get(CHOSEN_WIDGETS[choice.field]) else 'off'}"
                                                  f" (default {choice.words()})" for choice in changed) + ".")
        right.button("Use the defaults", key="train_use_chosen", on_click=take_chosen,
                     args=({CHOSEN_WIDGETS[choice.field]: choice.value for choice in changed},))


def use_learner(model: str) -> None:
    """The learner notice's button: put the offered hosted learner in the Learner model field."""
    st.session_state["train_learner_model"] = model


def learner_notice(task) -> None:
    """With the embedded model as learner, say plainly that it rarely writes a usable lesson (the measured figures),
    name model connections as the way to a capable one and offer a hosted learner where a provider's key is set
    (core.records.models.learner_advice)."""
    try:
        settings = form_settings()
    except InvalidInput:
        return
    with Session(engine()) as session:
        advice = learner_advice(session, task, settings)
    if advice is None:
        return
    st.warning(plain(advice.text), icon=":material/school:")
    if advice.hosted:
        st.button(f"Use {advice.hosted} as the learner", key="train_use_hosted_learner", on_click=use_learner,
                  args=(advice.hosted,), help="Puts it in the Learner model field; the estimate below shows its cost.")


def run_estimate_line(task) -> None:
    """Calls, tokens and time of a run with the form's settings, before it is queued (core.records.runs.progress)."""
    try:
        settings = form_settings()
    except InvalidInput:
        st.caption("Estimate: the settings above are not valid yet (Start run says why).")
        return
    with Session(engine()) as session:
        estimate = form_estimate(session, task, settings)
    st.markdown(f"**Estimate:** {plain(estimate_words(estimate))}",
                help="Calls per stage from these settings; tokens and seconds per call from the ledger's "
                     "measured calls of the chosen models, else an assumed default speed of the embedded model. "
                     "The learner's summaries assume half the groups have mixed rewards. With a hosted model, "
                     "its API cost from litellm's price list for those tokens.")


def settings_form(task) -> None:
    """The preset, the run settings, the estimate; Start run queues the run (or says why it cannot be)."""
    choices = prepare_form(task)
    matched = preset_matched(task)
    buttons = st.columns([1, 1, 3], vertical_alignment="center")
    for column, preset in zip(buttons, PRESETS, strict=False):
        column.button(PRESETS[preset], key=f"train_preset_{preset}", on_click=apply_preset, args=(task, preset),
                      type="primary" if matched == preset else "secondary",
                      help="Fill the settings below with this preset's values.")
    buttons[2].caption(f"The settings below are {PRESET_NAMES[matched]}." if matched
                       else "The settings below were changed by hand (custom).")
    settings_widgets(task)
    chosen_notice(task, choices)
    learner_notice(task)
    run_estimate_line(task)
    st.button("Start run", key="train_submit", type="primary", on_click=start_run, args=(task,))
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
    labels = {r.id: f"run {r.id} · started {r.created_at:%Y-%m-%d %H:%M} by {r.created_by}" for r in runs}
    selected = id_select("Run", list(labels), RUN_KEY, "run", default=runs[0].id,
                         format_func=lambda run_id: labels.get(run_id, f"run {run_id}"))
    live_progress(selected)
    chosen = next(r for r in runs if r.id == selected)
    with st.expander("Settings of this run"):
        table(pd.DataFrame({"setting": list(chosen.settings),
                            "value": [None if v is None else str(v) for v in chosen.settings.values()]}),
              key="train_settings_table")


run_page(page)
