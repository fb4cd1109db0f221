"""Overview: what the studio is and the path through it, then tasks, libraries with their versions, runs,
evaluations, and what waits for a person.

A first visit reads "What this is" and three steps, each a button: a quick trial (Train with its preset),
the review, and the evaluation. Empty sections offer a button to the page that fills them.

Each to-do row has its own button, which opens that row's task and library (in the sidebar) and its run and
step (in the address) on Review, or its task on Labeling (the Agreement tab for disputes), whatever the
sidebar had chosen: runs whose step waits for review, runs waiting for labels, and per task the rollouts
waiting for a label and the disputes waiting for a reviewer (core.records.review.labeling.progress).

Read-only but for Resume. Everything comes through `storage.queries` and core's read functions; text written
by a model or a person (experiences, notes, errors) is shown as code or in tables (ui.display), never as
Markdown; task, library and label names in headings, expander and button labels are escaped with plain().
"""

from __future__ import annotations

from dataclasses import dataclass, field

import streamlit as st
from sqlmodel import Session

from core.jobs.run_control import resume_run
from core.records.evaluation.figures import score_text
from core.records.notifications.webhooks import given_up_notice
from core.records.review import labeling
from core.records.runs.workers import job_health
from core.records.tasks.demos import quick_trial_task
from core.settings import get_settings
from storage import queries
from storage.statuses import LEARNING_KINDS, JobStatus
from storage.tables import Run, Step
from ui.common import (
    DATETIME,
    LABEL_TAB_KEY,
    Flash,
    context,
    engine,
    experience_lines,
    follow_open_request,
    open_in_context,
    plain,
    run_action,
    run_page,
    start_worker_if_needed,
)
from ui.display import show_long, table

FLASH = Flash("overview_flash")
TRAIN_COMMAND = 'python -m core train --task "arithmetic word problems" --limit 4 --group-size 2 --epochs 1'
EVAL_COMMAND = 'python -m core eval --task "arithmetic word problems" --version latest --limit 20'
PRESET_REQUEST = "train_preset_request"  # the Train page selects the preset it finds here (pages/train.py)
WHAT_THIS_IS = (
    "A frozen model gets better without any change to its weights: it answers each training query several "
    "times, and a learner model turns what the better attempts did differently into a small library of "
    "experiences that goes into its prompt. People review every proposed change before it lands, and every "
    "claim of improvement is measured on held-out queries the model never trained on.")
ATTENTION_STATUSES = (JobStatus.AWAITING_REVIEW, JobStatus.AWAITING_LABELS, JobStatus.FAILED, JobStatus.STALLED)


def steps_label(progress: dict) -> str:
    total = progress.get("steps_total")
    return f"{progress.get('steps_done', 0)}/{total}" if total else "–"


def next_action(status: str, pending: int) -> str:
    if status == JobStatus.FAILED:
        return "read the error, then resume"
    if status == JobStatus.STALLED:
        return "its worker stopped beating: an idle worker takes it over, or resume"
    if status == JobStatus.AWAITING_REVIEW or pending:
        return "review the proposed operations"
    if status == JobStatus.AWAITING_LABELS:
        return "label its rollouts"
    return ""


def load_overview() -> dict:
    """Everything the page shows, as plain rows, read in one session."""
    with Session(engine()) as session:
        tasks = queries.list_tasks(session)
        task_names = {t.id: t.name for t in tasks}

        task_rows = []
        for task in tasks:
            counts = queries.count_samples(session, task.id)
            task_rows.append({"name": task.name, "agent mode": task.agent_mode, "reward method": task.reward_method,
                              "policy model": task.policy_model, "train samples": counts.get("train", 0),
                              "test samples": counts.get("test", 0)})

        library_blocks = []
        for lib in queries.libraries(session):
            labels_by_version: dict[int, list[str]] = {}
            for label in queries.labels(session, lib.id):
                labels_by_version.setdefault(label.version_id, []).append(label.name)
            versions = list(reversed(queries.versions(session, lib.id)))  # newest first
            library_blocks.append({
                "id": lib.id,
                "title": f"{task_names.get(lib.task_id, '?')} · {lib.name}",
                "rows": [{"version": f"#{v.number}", "source": v.source, "size": len(v.experiences),
                          "labels": ", ".join(sorted(labels_by_version.get(v.id, []))), "note": v.note,
                          "created": v.created_at} for v in versions],
                "versions": [{"id": v.id, "number": v.number, "labels": sorted(labels_by_version.get(v.id, [])),
                              "experiences": list(v.experiences)} for v in versions],
            })

        run_rows, attention_rows, actions, pending_total = [], [], [], 0
        pending_by_run = queries.pending_operations_by_run(session)
        library_names = {lib.id: lib.name for lib in queries.libraries(session)}
        waiting_steps: dict[int, Step] = {}
        for step in queries.steps_waiting_for_review(session, kinds=LEARNING_KINDS):
            waiting_steps.setdefault(step.run_id, step)
        runs = queries.runs(session)
        evaluations = queries.evaluations(session)
        numbers = queries.version_numbers(session, sorted({r.current_version_id for r in runs if r.current_version_id}
                                                          | {e.version_id for e in evaluations if e.version_id}))
        for run in runs:
            status = job_health(run.status, run.heartbeat_at)
            run_rows.append({"id": run.id, "task": task_names.get(run.task_id, "?"), "kind": run.kind,
                             "status": status, "steps": steps_label(run.progress or {}),
                             "current version": f"#{numbers[run.current_version_id]}"
                             if run.current_version_id in numbers else "", "created": run.created_at,
                             "error": run.error or ""})
            pending = pending_by_run.get(run.id, 0)
            pending_total += pending
            if status in ATTENTION_STATUSES or pending:
                attention_rows.append({"run": run.id, "task": task_names.get(run.task_id, "?"),
                                       "status": status, "pending operations": pending,
                                       "what to do": next_action(status, pending),
                                       "error": run.error or ""})
                action = run_action_of(run, status, pending, task_names.get(run.task_id),
                                       library_names.get(run.library_id), waiting_steps.get(run.id))
                if action is not None:
                    actions.append(action)

        eval_rows = [{"id": ev.id, "task": task_names.get(ev.task_id, "?"),
                      "version": f"#{numbers.get(ev.version_id, '?')}" if ev.version_id is not None else "empty",
                      "split": ev.split,
                      "k": ev.k, "n": ev.n, "Mean@k": score_text(ev, "mean_at_k"), "Pass@k": score_text(ev, "pass_at_k"),
                      "errors": (ev.metrics or {}).get("errors", 0),  # rollouts without a reward, left out of both
                      "status": job_health(ev.status, ev.heartbeat_at)}
                     for ev in evaluations]

        waiting_labels = queries.rollouts_waiting_for_labels(session)
        labelling_rows = []
        for task in tasks:
            counts = labeling.progress(session, task)
            if counts.needed or counts.disputed:
                labelling_rows.append({"task": task.name, "task id": task.id,
                                       "rollouts waiting for a label": counts.needed,
                                       "disputes waiting for a reviewer": counts.disputed})

    return {"tasks": task_rows, "libraries": library_blocks, "runs": run_rows, "attention": attention_rows,
            "actions": actions, "labelling": labelling_rows, "pending_operations": pending_total,
            "evaluations": eval_rows, "waiting_labels": waiting_labels}


@dataclass(frozen=True)
class ToDo:
    """A to-do row's button: what it says and the view it opens (page, task, library, ids in the address,
    session state such as the Labeling tab)."""

    key: str
    label: str
    page: str
    task: str
    library: str | None = None
    params: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)


def run_action_of(run: Run, status: str, pending: int, task: str | None, library: str | None,
                  step: Step | None) -> ToDo | None:
    """The button of a run's to-do row: Review on its run and the step that waits, or Labeling on its task."""
    if task is None:
        return None
    if status == JobStatus.AWAITING_REVIEW or pending:
        where = f" · epoch {step.epoch + 1} · batch {step.batch_index + 1}" if step is not None else ""
        params = {"run": run.id, **({"step": step.id} if step is not None else {})}
        return ToDo(f"todo_review_{run.id}", f"Review run {run.id} · {task}{where}", "pages/review.py", task,
                    library, params)
    if status == JobStatus.AWAITING_LABELS:
        return ToDo(f"todo_label_run_{run.id}", f"Label run {run.id}'s rollouts · {task}", "pages/labeling.py",
                    task, state={LABEL_TAB_KEY: "Queue"})
    return None


def labelling_actions(row: dict) -> list[ToDo]:
    """A task's labelling to-do row: its queue, and its disputes on the Agreement tab."""
    task, task_id = row["task"], row["task id"]
    found = []
    needed, disputed = row["rollouts waiting for a label"], row["disputes waiting for a reviewer"]
    if needed:
        found.append(ToDo(f"todo_label_{task_id}", f"Label {needed} rollout{'s' if needed != 1 else ''} · {task}",
                          "pages/labeling.py", task, state={LABEL_TAB_KEY: "Queue"}))
    if disputed:
        found.append(ToDo(f"todo_disputes_{task_id}",
                          f"Settle {disputed} dispute{'s' if disputed != 1 else ''} · {task}", "pages/labeling.py",
                          task, state={LABEL_TAB_KEY: "Agreement"}))
    return found


def open_todo(todo: ToDo) -> None:
    """A to-do button's callback: its own task, library, run and step, not the sidebar's."""
    open_in_context(todo.page, todo.task, todo.library, todo.params, todo.state)


def todo_buttons(todos: list[ToDo]) -> None:
    for todo in todos:
        st.button(plain(todo.label), key=todo.key, on_click=open_todo, args=(todo,))


def resume(run_id: int) -> None:
    """Queue a failed or stalled run again (a button's callback) and make sure a worker takes it."""
    if run_action(FLASH, "attention", resume_run, engine(), run_id, context().reviewer,
                  success=f"Run {run_id} queued") is not None:
        start_worker_if_needed()


def quick_trial() -> None:
    """Step 1 (a button's callback): Train with the quick-trial preset selected (a small run whose changes a
    person reviews), on the task core.records.tasks.demos.quick_trial_task chooses for the default model (the
    shop-policies demo on the embedded model, where a library visibly helps), else the sidebar's task."""
    st.session_state[PRESET_REQUEST] = "quick"
    ctx = context()
    task = quick_trial_task(engine(), get_settings().model) or ctx.task
    open_in_context("pages/train.py", task, ctx.library if task == ctx.task else "default")


STEPS = (
    ("1 · Try it", "4 queries, 4 attempts each, one step; a few minutes on the embedded model, which trains on the "
     "shop-policies demo (where a library visibly helps), another model on the chosen task.",
     "Quick trial", None, ":material/model_training:"),
    ("2 · Review", "Approve, edit or reject each change the learner proposed; approved ones make a new version.",
     "Review", "pages/review.py", ":material/rate_review:"),
    ("3 · Evaluate and compare", "Score versions on held-out queries and compare them query by query before "
     "promoting one.", "Evaluate and compare", "pages/evaluate.py", ":material/leaderboard:"),
)


def first_steps() -> None:
    """What this is, in three sentences, and the path through the studio as three buttons."""
    st.subheader("What this is", anchor=False)
    st.write(WHAT_THIS_IS)
    for column, (title, caption, label, target, icon) in zip(st.columns(3), STEPS, strict=True):
        with column:
            st.markdown(f"**{title}**")
            st.caption(caption)
            pressed = st.button(label, key=f"overview_step_{label.split()[0].lower()}", icon=icon,
                                type="primary" if target is None else "secondary",
                                on_click=quick_trial if target is None else None)
            if pressed and target is not None:
                st.switch_page(target)


def page() -> None:
    follow_open_request()
    data = load_overview()
    st.title("Overview")
    first_steps()

    st.header("What needs a person")
    FLASH.show("attention")
    with Session(engine()) as session:
        given_up = given_up_notice(session)
    if given_up:
        st.warning(plain(given_up), icon=":material/notifications_off:")
        st.page_link("pages/notifications.py", label="Open Notifications", icon=":material/notifications:")
    left, middle, right = st.columns(3)
    left.metric("Operations waiting for review", data["pending_operations"])
    middle.metric("Rollouts waiting for a label", data["waiting_labels"])
    right.metric("Runs waiting or failed",
                 sum(1 for row in data["attention"] if row["status"] in ATTENTION_STATUSES))
    if data["attention"]:
        table(data["attention"], key="attention_table")
        todo_buttons(data["actions"])
        resumable = [row["run"] for row in data["attention"] if row["status"] in (JobStatus.FAILED, JobStatus.STALLED)]
        for run_id in resumable:
            st.button(f"Resume run {run_id}", key=f"resume_{run_id}", on_click=resume, args=(run_id,))
    if data["labelling"]:
        table([{k: v for k, v in row.items() if k != "task id"} for row in data["labelling"]],
              key="labelling_todo_table")
        todo_buttons([todo for row in data["labelling"] for todo in labelling_actions(row)])
    if not data["attention"] and not data["labelling"] and not data["waiting_labels"]:
        st.success("Nothing waits for a person.")

    st.header("Tasks")
    if data["tasks"]:
        table(data["tasks"], key="tasks_table")
    else:
        st.info("No tasks yet: create one, with its data, on the Tasks page.")
        st.page_link("pages/tasks.py", label="Open Tasks", icon=":material/edit_note:")

    st.header("Libraries")
    if not data["libraries"]:
        st.info("No libraries yet: a task gets its first when a run starts or a library is imported.")
        st.page_link("pages/library.py", label="Open Library", icon=":material/library_books:")
    for block in data["libraries"]:
        st.subheader(plain(block["title"]), anchor=False)
        table(block["rows"], column_config={"created": DATETIME}, key=f"versions_table_{block['id']}")
        for version in block["versions"]:
            labels = f" · {plain(', '.join(version['labels']))}" if version["labels"] else ""
            size = len(version["experiences"])
            with st.expander(f"Version #{version['number']} · {size} experiences{labels}"):
                if version["experiences"]:
                    show_long(experience_lines(version["experiences"]), f"overview_version_{version['id']}")
                else:
                    st.caption("No experiences: the agent runs without a library.")

    st.header("Runs")
    if data["runs"]:
        table(data["runs"], column_config={"created": DATETIME}, key="runs_table")
    else:
        st.info("No runs yet: start a quick trial, or set a run of your own on the Train page.")
        st.button("Start a quick trial", key="overview_runs_quick_trial", on_click=quick_trial)
        st.caption(f"From a terminal in the project folder: `{TRAIN_COMMAND}`")

    st.header("Evaluations")
    if data["evaluations"]:
        table(data["evaluations"], key="evaluations_table")
    else:
        st.info("No evaluations yet: score a version on the test split on the Evaluate page.")
        st.page_link("pages/evaluate.py", label="Open Evaluate", icon=":material/leaderboard:")
        st.caption(f"From a terminal: `{EVAL_COMMAND}`")


run_page(page)
