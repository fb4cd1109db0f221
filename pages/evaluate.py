"""Evaluate: score library versions on a split (Mean@k, Pass@k with 95% intervals), compare two
evaluations query by query, and promote the better version to `production`.

The worker executes queued evaluations; this page queues them (`core.evaluation.create_evaluation`),
resumes failed or stalled ones (`core.run_control.resume_evaluation`) and moves the label
(`core.versions.promote`). Two evaluations are compared by `core.comparison.compare_evaluations`.
Model output and names are shown as text or in tables through pages._display, never as Markdown.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from sqlmodel import Session

from core.comparison import compare_evaluations
from core.errors import StudioError
from core.evaluation import create_evaluation
from core.run_control import resume_evaluation
from core.versions import EMPTY, PRODUCTION, promote
from core.worker import job_health
from pages._common import (
    SCORE,
    Flash,
    Outcome,
    allowed,
    context,
    engine,
    keep_valid_choice,
    plain,
    require_task,
    role_note,
    run_action,
    run_page,
    start_worker_if_needed,
    status_label,
)
from pages._display import show_long, table
from storage import queries
from storage.models import Task
from storage.statuses import JobStatus

FLASH = Flash("eval_flash")
COST = st.column_config.NumberColumn(format="$%.4f")


def version_name(version_id: int | None, numbers: dict[int, int]) -> str:
    if version_id is None:
        return EMPTY
    number = numbers.get(version_id)
    return f"#{number}" if number is not None else f"id {version_id}"


def interval(metrics: dict, key: str) -> str:
    ci = metrics.get(key)
    return f"{ci[0]:.3f} – {ci[1]:.3f}" if ci and len(ci) == 2 else ""


def load_setup(task: Task, library_name: str) -> dict:
    """The task, its splits, and the current library's versions (newest first) with their labels."""
    with Session(engine()) as session:
        library = queries.library_by_name(session, task.id, library_name)
        versions = list(reversed(queries.versions(session, library.id))) if library else []
        labels: dict[int, list[str]] = {}
        for label in queries.labels(session, library.id) if library else []:
            labels.setdefault(label.version_id, []).append(label.name)
        production = queries.label_by_name(session, library.id, PRODUCTION) if library else None
        return {"task": task, "library": library, "splits": queries.count_samples(session, task.id),
                "versions": [{"id": v.id, "number": v.number, "labels": sorted(labels.get(v.id, []))}
                             for v in versions],
                "production": production.version_id if production else None}


def load_evaluations(task_id: int) -> tuple[list, dict[int, int]]:
    with Session(engine()) as session:
        evaluations = queries.evaluations(session, task_id)
        numbers = queries.version_numbers(session, sorted({e.version_id for e in evaluations if e.version_id}))
    return evaluations, numbers


def start_evaluation(task_name: str) -> None:
    """Queue an evaluation of the form's choices (the Start evaluation button's callback) for a worker."""
    state = st.session_state
    if state.get("eval_split") is None:
        FLASH.set("new", Outcome(False, "This task has no samples to evaluate on."))
        return
    evaluation_id = run_action(
        FLASH, "new", create_evaluation, engine(), task_name, state.get("eval_version") or EMPTY,
        split=state["eval_split"], k=int(state["eval_k"]), limit=int(state["eval_limit"]) or None,
        model=str(state["eval_model"]).strip() or None, temperature=float(state["eval_temperature"]),
        created_by=context().reviewer, report=lambda new_id: f"Evaluation #{new_id} queued.")
    if evaluation_id is not None:
        start_worker_if_needed()


def evaluation_form(setup: dict) -> None:
    """What to evaluate; Start evaluation queues it for the worker."""
    task = setup["task"]
    options = [str(v["id"]) for v in setup["versions"]] + [EMPTY]
    names = {str(v["id"]): f"#{v['number']} (id {v['id']}) {' '.join(v['labels'])}".strip()
             for v in setup["versions"]}
    names[EMPTY] = "empty (no library)"
    splits = sorted(setup["splits"])
    for key, offered in (("eval_version", options), ("eval_split", splits)):
        keep_valid_choice(key, offered)  # another task or library was chosen in the sidebar
    with st.form("eval_form"):
        c1, c2, c3 = st.columns(3)
        c1.selectbox("Version", options, format_func=lambda ref: names.get(ref, ref), key="eval_version")
        c2.selectbox("Split", splits, index=splits.index("test") if "test" in splits else 0,
                     format_func=lambda s: f"{s} ({setup['splits'].get(s, 0)} queries)", key="eval_split")
        c3.number_input("k (samples per query)", value=4, min_value=1, step=1, key="eval_k")
        c1.number_input("Queries limit (0 = all)", value=0, min_value=0, step=1, key="eval_limit")
        c2.text_input("Model", value=task.policy_model, key="eval_model")
        c3.number_input("Temperature", value=0.7, min_value=0.0, max_value=2.0, step=0.1, format="%.2f",
                        key="eval_temperature")
        st.form_submit_button("Start evaluation", key="eval_submit", type="primary", on_click=start_evaluation,
                              args=(task.name,))
    FLASH.show("new")


def scores_chart(completed: list, numbers: dict[int, int]) -> go.Figure:
    """Mean@k and Pass@k of every completed evaluation, with their 95% intervals as error bars."""
    names = [f"{version_name(e.version_id, numbers)} (eval {e.id}, k={e.k})" for e in completed]
    fig = go.Figure()
    for title, key in (("Mean@k", "mean_at_k"), ("Pass@k", "pass_at_k")):
        values = [getattr(e, key) or 0.0 for e in completed]
        cis = [(e.metrics or {}).get(f"{key}_ci") or [v, v] for e, v in zip(completed, values, strict=True)]
        fig.add_trace(go.Bar(name=title, x=names, y=values, error_y={
            "type": "data", "symmetric": False, "array": [max(0.0, hi - v) for (_, hi), v in zip(cis, values, strict=True)],
            "arrayminus": [max(0.0, v - lo) for (lo, _), v in zip(cis, values, strict=True)]}))
    fig.update_layout(barmode="group", height=360, yaxis={"range": [0, 1.05], "title": "score"},
                      margin={"l": 10, "r": 10, "t": 30, "b": 10}, legend={"orientation": "h"})
    return fig


def resume(evaluation_id: int) -> None:
    """Queue a failed or stalled evaluation again (a button's callback) and make sure a worker takes it."""
    if run_action(FLASH, "evaluations", resume_evaluation, engine(), evaluation_id, context().reviewer,
                  success=f"Evaluation #{evaluation_id} queued again") is not None:
        start_worker_if_needed()


@st.fragment(run_every=2)
def evaluations_view(task_id: int) -> None:
    """The task's evaluations with live progress, resume for failed or stalled ones, and the scores chart."""
    FLASH.show("evaluations")
    evaluations, numbers = load_evaluations(task_id)
    if not evaluations:
        st.info("No evaluations of this task yet: choose a version above and press Start evaluation.")
        return
    rows = []
    for e in evaluations:
        metrics, progress = e.metrics or {}, e.progress or {}
        rows.append({"id": e.id, "version": version_name(e.version_id, numbers), "split": e.split, "k": e.k,
                     "n": e.n, "Mean@k": e.mean_at_k, "Mean@k 95% CI": interval(metrics, "mean_at_k_ci"),
                     "Pass@k": e.pass_at_k, "Pass@k 95% CI": interval(metrics, "pass_at_k_ci"),
                     "errors": metrics.get("errors", 0), "cost": e.cost,
                     "status": status_label(e.status, e.heartbeat_at),
                     "progress": f"{progress.get('rollouts_done', 0)}/{progress.get('rollouts_total', '?')}",
                     "model": e.model, "created": e.created_at})
    table(rows, key="evaluations_table",
          column_config={"Mean@k": SCORE, "Pass@k": SCORE, "cost": COST,
                         "created": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm")})

    for e in evaluations:
        shown = job_health(e.status, e.heartbeat_at)
        if shown not in (JobStatus.FAILED, JobStatus.STALLED):
            continue
        st.caption(f"Evaluation #{e.id} is {shown}"
                   + (": its worker stopped beating; an idle worker takes it over, or resume it here."
                      if shown == JobStatus.STALLED else ". Error:"))
        if e.error:
            show_long(e.error, f"eval_error_{e.id}")
        st.button(f"Resume evaluation #{e.id}", key=f"eval_resume_{e.id}", icon=":material/play_arrow:",
                  on_click=resume, args=(e.id,))

    completed = [e for e in reversed(evaluations) if e.status == JobStatus.COMPLETED]
    if completed:
        st.plotly_chart(scores_chart(completed, numbers), key="eval_chart")


def evaluation_choice(e, numbers: dict[int, int]) -> str:
    return (f"#{e.id} · {version_name(e.version_id, numbers)} · {e.split} · k={e.k} · "
            f"Mean@k {e.mean_at_k or 0:.3f}")


def compare_section(completed: list, numbers: dict[int, int]) -> None:
    """B against A on the same queries (core.comparison): the paired difference with its interval, the
    tests, the verdict in words, and every query sorted by difference with both versions' outputs."""
    if len(completed) < 2:
        st.info("Two completed evaluations are needed to compare them.")
        return
    by_id = {e.id: e for e in completed}
    ids = list(by_id)  # newest first
    for key in ("eval_compare_a", "eval_compare_b"):
        keep_valid_choice(key, ids)
    left, right = st.columns(2)
    a_id = left.selectbox("Evaluation A", ids, index=1, key="eval_compare_a",
                          format_func=lambda i: evaluation_choice(by_id[i], numbers))
    b_id = right.selectbox("Evaluation B", ids, index=0, key="eval_compare_b",
                           format_func=lambda i: evaluation_choice(by_id[i], numbers))
    if a_id == b_id:
        st.warning("Choose two different evaluations.")
        return
    try:
        result = compare_evaluations(engine(), a_id, b_id)
    except StudioError as exc:
        st.error(plain(f"These two cannot be compared: {exc}"))
        return
    s = result.stats
    (st.success if s.decided and s.delta > 0 else st.error if s.decided else st.info)(plain(s.verdict))
    cols = st.columns(4)
    cols[0].metric("B − A (Mean@k)", f"{s.delta:+.3f}")
    cols[1].metric("95% interval", f"[{s.ci_low:+.3f}, {s.ci_high:+.3f}]" if s.n >= 2 else "–")
    cols[2].metric("Sign test p", f"{s.p_value:.3g}")
    cols[3].metric("Pass@k McNemar p", f"{s.mcnemar_p:.3g}")
    cols = st.columns(5)
    cols[0].metric("A wins", s.losses)
    cols[1].metric("B wins", s.wins)
    cols[2].metric("Ties", s.ties)
    cols[3].metric("Cost per query A", f"${result.cost_a:.4f}")
    cols[4].metric("Cost per query B", f"${result.cost_b:.4f}")
    st.caption(f"{s.n} queries answered by both, Mean@k A {s.mean_a:.3f} and B {s.mean_b:.3f}; paired bootstrap "
               f"interval over queries, exact sign test on per-query wins and losses. "
               f"Smallest difference this comparison could detect: about {s.detectable:.2f}."
               + (f" {plain(result.note.capitalize())}." if result.note else ""))
    frame = pd.DataFrame([{k: v for k, v in row.items() if k != "sample_id"} for row in result.rows])
    table(frame, key="compare_table",
          column_config={"mean reward A": SCORE, "mean reward B": SCORE, "difference": SCORE,
                         "cost A": COST, "cost B": COST})
    outputs_side_by_side(result)


def outputs_side_by_side(result) -> None:
    """One query's outputs under A and under B, next to each other (model text shown as text)."""
    rows = {row["sample_id"]: row for row in result.rows}
    chosen = st.selectbox("Open a query", list(rows), key="compare_query",
                          format_func=lambda i: f"{rows[i]['query id']} ({rows[i]['winner']}): {rows[i]['query'][:80]}")
    if chosen is None:
        return
    with Session(engine()) as session:
        outputs = {side: queries.evaluation_sample_rollouts(session, ev.id, chosen)
                   for side, ev in (("A", result.a), ("B", result.b))}
    for column, (side, rollouts) in zip(st.columns(2), outputs.items(), strict=True):
        with column:
            st.markdown(f"**{side}** (evaluation {result.a.id if side == 'A' else result.b.id})")
            for rollout in rollouts:
                st.caption(f"sample {rollout.group_index}: reward {rollout.reward if rollout.reward is not None else '–'}")
                show_long(rollout.response or rollout.error, f"eval_compare_{side}_{rollout.id}")


def promote_version(version_id: int, name: str) -> None:
    """Point `production` at the version (the Promote button's callback; core.versions.promote checks the role)."""
    run_action(FLASH, "promote", promote, engine(), version_id, context().reviewer,
               report=f"production now points at version {name} (id {version_id}).")


def promote_section(completed: list, numbers: dict[int, int], setup: dict) -> None:
    FLASH.show("promote")
    current = setup["production"]
    if current:
        library_numbers = {v["id"]: v["number"] for v in setup["versions"]}
        st.caption(f"production is version {version_name(current, library_numbers)} (id {current}).")
    else:
        st.caption("No version of this library is labelled production yet.")
    candidates = [e for e in completed if e.version_id is not None]
    if not candidates:
        st.info("Evaluate a version of the library first; the empty library cannot be promoted.")
        return
    by_id = {e.id: e for e in candidates}
    ids = sorted(by_id, key=lambda i: (by_id[i].mean_at_k or 0.0, i), reverse=True)  # best first
    if st.session_state.get("eval_promote_choice") not in by_id:
        st.session_state.pop("eval_promote_choice", None)
    chosen = st.selectbox("Evaluation to promote", ids, key="eval_promote_choice",
                          format_func=lambda i: evaluation_choice(by_id[i], numbers))
    version_id = by_id[chosen].version_id
    if not allowed("admin"):
        role_note("admin", "promoting a version to production")
        return
    st.button("Promote to production", key="eval_promote", type="primary", icon=":material/rocket_launch:",
              on_click=promote_version, args=(version_id, version_name(version_id, numbers)))


def page() -> None:
    st.title("Evaluate")
    ctx, task = require_task()
    setup = load_setup(task, ctx.library)
    st.header("New evaluation")
    if allowed("reviewer"):
        evaluation_form(setup)
    else:
        role_note("reviewer", "starting an evaluation")

    st.header("Evaluations")
    evaluations_view(setup["task"].id)

    evaluations, numbers = load_evaluations(setup["task"].id)
    completed = [e for e in evaluations if e.status == JobStatus.COMPLETED]

    st.header("Compare two evaluations")
    compare_section(completed, numbers)

    st.header("Promote")
    promote_section(completed, numbers, setup)


run_page(page)
