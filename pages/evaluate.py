"""Evaluate: score library versions on a split (Mean@k, Pass@k with 95% intervals), compare two
evaluations query by query, and promote the better version to `production`.

The form's widgets are keyed by task and library, so after a switch in the sidebar it never shows one
task's version and split while queuing another's; the queued message echoes what was queued. The two
compared evaluations are in the URL (?a=&b=). Promote first shows what changes against production and
the paired comparison's verdict (core.records.library.promotion), then asks for a confirmation.

The worker executes queued evaluations; this page queues them (`core.grpo.evaluation.create_evaluation`),
cancels queued or running ones (`core.jobs.run_control.cancel_evaluation`: the worker stops within seconds and
keeps every answered rollout), resumes failed, stalled or cancelled ones (`resume_evaluation`) and moves the label
(`core.records.library.versions.promote`). Two evaluations are compared by `core.records.evaluation.comparison.compare_evaluations`.
Model output and names are shown as text or in tables through ui.display, never as Markdown. The Model picker
offers core.records.models.options' models (a connection's as its server lists them) and keeps what was last chosen
for the task, across page switches and finished evaluations (ui.common.model_picker); a new session starts
from the model of the task's newest run or evaluation a person chose (core.records.models.options.chosen_model, as
`compare` does). The form sent again (Enter in a box) once an identical evaluation has ended within the last
minute queues nothing and says so; Evaluate again queues it on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from sqlmodel import Session

from core.errors import DuplicateJob, StudioError
from core.grpo.evaluation import create_evaluation
from core.jobs.run_control import cancel_evaluation, resume_evaluation
from core.records.evaluation.comparison import compare_evaluations
from core.records.evaluation.counts import Counts, evaluation_counts
from core.records.evaluation.figures import (
    NO_FIGURE,
    answered_words,
    figure,
    interval_text,
    score,
    score_text,
)
from core.records.library.segments import paired_by_segment, segment_libraries
from core.records.library.versions import EMPTY, PRODUCTION
from core.records.models.connections import failed_test_warning
from core.records.models.options import chosen_model
from core.records.runs.workers import job_health
from core.records.tasks.scenarios import is_conversation
from storage import queries
from storage.statuses import ACTIVE, EVALUATION_HAS_FIGURES, EVALUATION_MAY_CANCEL, JobStatus
from storage.tables import Evaluation, Task
from ui.common import (
    SCORE,
    Flash,
    Outcome,
    allowed,
    choose_model,
    context,
    engine,
    keep_valid_choice,
    model_picker,
    models_note,
    offered_models,
    plain,
    require_task,
    role_note,
    run_action,
    run_page,
    show_in_url,
    start_worker_if_needed,
    status_label,
    url_choice,
)
from ui.display import show_long, table
from ui.messages import message_markdown
from ui.promote import PromoteDialog

FLASH = Flash("eval_flash")
HANDOFF_KEY = "eval_version"  # another page sets a version's id here before it switches to Evaluate
MODEL_HANDOFF_KEY = "eval_model"  # ... and the model that version was learned with
ARRIVAL_KEY = "train_goto"  # Train's request to open this page, asked again until this page has drawn
PROMOTE = PromoteDialog("eval", FLASH, "promote")  # the guarded dialog, shared with the Library page's Labels
COST = st.column_config.NumberColumn(format="$%.4f")
AGAIN_KEY = "eval_again_scope"  # the form refused as identical to one that just ended: Evaluate again sends it
RECENT_S = 60.0  # an evaluation identical to one that ended this recently is queued only on purpose
DRAWN_KEY = "eval_drawn_with_figures"  # the evaluations the whole page was drawn with; the live table reruns it


def version_name(version_id: int | None, numbers: dict[int, int]) -> str:
    if version_id is None:
        return EMPTY
    number = numbers.get(version_id)
    return f"#{number}" if number is not None else "?"


def evaluated_name(e, numbers: dict[int, int]) -> str:
    """What an evaluation played: a version, or a version with each segment's own library."""
    name = version_name(e.version_id, numbers)
    return f"{name} + a library per segment" if e.routes else name


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
        bound = {segment: lib.name for segment, lib in segment_libraries(session, task).items()}
        return {"task": task, "library": library, "library_name": library_name, "splits": queries.count_samples(session, task.id),
                "segment_libraries": bound,
                "versions": [{"id": v.id, "number": v.number, "labels": sorted(labels.get(v.id, []))}
                             for v in versions],
                "production": production.version_id if production else None}


def load_evaluations(task_id: int) -> tuple[list, dict[int, int]]:
    with Session(engine()) as session:
        evaluations = queries.evaluations(session, task_id)
        numbers = queries.version_numbers(session, sorted({e.version_id for e in evaluations if e.version_id}))
    return evaluations, numbers


def form_key(name: str, setup: dict) -> str:
    """A form widget's key for this task and library: options that depend on the task (its versions, its
    splits, its model) must never carry over to another task, where they would queue something else than
    what the form shows."""
    library = setup["library"].id if setup["library"] else "none"
    return f"eval_{name}_{setup['task'].id}_{library}"


@dataclass(frozen=True)
class FormScope:
    """What the Start button's callback needs to know about the form it was drawn for (plain values)."""

    task: str
    library: str
    keys: dict[str, str]
    split_sizes: dict[str, int]
    names: dict[str, str]
    default_model: str
    routed_key: str | None = None


def queued_words(evaluation_id: int, version: str, split: str, queries: int, k: int, model: str) -> str:
    """What was queued, echoed back so the person sees it is what the form showed."""
    return (f"Evaluation {evaluation_id} queued: version {version} on the {split} split ({queries} queries, "
            f"k={k}), model {model}.")


def start_evaluation(scope: FormScope, again: bool = False) -> None:
    """Queue an evaluation of the form's choices (the Start evaluation button's callback) for a worker. One
    identical to an evaluation that ended in the last minute is refused, saying so, unless `again` (the Evaluate
    again button under that message): Enter in a box of the form sends it once more."""
    st.session_state.pop(AGAIN_KEY, None)
    state, keys = st.session_state, scope.keys
    version, split = state.get(keys["version"]) or EMPTY, state.get(keys["split"])
    if split is None:
        FLASH.set("new", Outcome(False, "This task has no samples to evaluate on."))
        return
    k, limit = int(state[keys["k"]]), int(state[keys["limit"]]) or None
    routed = bool(scope.routed_key and state.get(scope.routed_key))
    model = str(state[keys["model"]] or "").strip() or scope.default_model
    size = min(limit or scope.split_sizes.get(split, 0), scope.split_sizes.get(split, 0))
    refused: list[DuplicateJob] = []

    def queue(*args, **kwargs) -> int:
        try:
            return create_evaluation(*args, **kwargs)
        except DuplicateJob as exc:
            refused.append(exc)
            raise

    evaluation_id = run_action(
        FLASH, "new", queue, engine(), scope.task, version, split=split, k=k, limit=limit,
        model=model, temperature=float(state[keys["temperature"]]), route_segments=routed,
        created_by=context().reviewer, library_name=scope.library, ended_within_s=None if again else RECENT_S,
        report=lambda new_id: plain(queued_words(new_id, scope.names.get(version, version)
                                                 + (" with a library per segment" if routed else ""),
                                                 split, size, k, model)))
    if evaluation_id is not None:
        start_worker_if_needed()
    elif refused and not again and ended(refused[0].existing_id):
        st.session_state[AGAIN_KEY] = scope


def ended(evaluation_id: int) -> bool:
    with Session(engine()) as session:
        return getattr(session.get(Evaluation, evaluation_id), "status", None) not in ACTIVE


def evaluation_form(setup: dict) -> None:
    """What to evaluate; Start evaluation queues it for the worker. Every widget is keyed by task and library."""
    task = setup["task"]
    # A version is chosen, queued and echoed by its number in the library (core.records.library.versions.resolve_version)
    options = [str(v["number"]) for v in setup["versions"]] + [EMPTY]
    names = {str(v["number"]): f"#{v['number']} {' '.join(v['labels'])}".strip() for v in setup["versions"]}
    names[EMPTY] = "empty (no library)"
    splits = sorted(setup["splits"])
    version_key, split_key = form_key("version", setup), form_key("split", setup)
    handed = st.session_state.pop(HANDOFF_KEY, None)  # "Evaluate this version" on Train or Library: its id
    numbers = {str(v["id"]): str(v["number"]) for v in setup["versions"]}
    if handed is not None and str(handed) in numbers:
        st.session_state[version_key] = numbers[str(handed)]
    model_key = form_key("model", setup)
    handed_model = st.session_state.pop(MODEL_HANDOFF_KEY, None)  # the model the run learned with
    if handed_model:
        choose_model(model_key, task.id, handed_model)
    with Session(engine()) as session:  # a new session starts from the model of the newest run or evaluation a person chose
        start = chosen_model(session, task).model
    for key, offered in ((version_key, options), (split_key, splits)):
        keep_valid_choice(key, offered)
    if splits:
        st.session_state.setdefault(split_key, "test" if "test" in splits else splits[0])
    models = offered_models(task)
    with st.form(f"eval_form_{task.id}"):
        c1, c2, c3 = st.columns(3)
        c1.selectbox("Version", options, format_func=lambda ref: names.get(ref, ref), key=version_key)
        c2.selectbox("Split", splits,
                     format_func=lambda s: f"{s} ({setup['splits'].get(s, 0)} queries)", key=split_key)
        c3.number_input("k (samples per query)", value=4, min_value=1, step=1, key=form_key("k", setup))
        c1.number_input("Queries limit (0 = all)", value=0, min_value=0, step=1, key=form_key("limit", setup))
        picked_model = model_picker(c2, "Model", model_key, models, task_id=task.id, start=start,
                     help="What was last chosen here for this task (else the model of its newest run or "
                          "evaluation a person chose, else its policy model); offered: the task's models, the studio's default, each model "
                          "connection's models (as its server lists them), the embedded models and the configured "
                          "providers; type another name (connection/model or a litellm name) if you need one.")
        c3.number_input("Temperature", value=0.7, min_value=0.0, max_value=2.0, step=0.1, format="%.2f",
                        key=form_key("temperature", setup))
        routed_key = None
        if setup["segment_libraries"]:
            routed_key = form_key("routed", setup)
            c1.checkbox("A library per segment", key=routed_key,
                        help="Play each scenario with the library bound to its persona's segment ("
                             + ", ".join(f"{seg}: {name}" for seg, name in setup["segment_libraries"].items())
                             + "; production version, else the newest) and the version above for the rest; "
                             "compare it with an evaluation of the version alone.")
        scope = FormScope(task=task.name, library=setup["library_name"], names=names, split_sizes=dict(setup["splits"]),
                          default_model=start, routed_key=routed_key,
                          keys={name: form_key(name, setup) for name in ("version", "split", "k", "limit", "model",
                                                                        "temperature")})
        st.form_submit_button("Start evaluation", key="eval_submit", type="primary", on_click=start_evaluation,
                              args=(scope,))
    models_note("eval_refresh_models")
    with Session(engine()) as session:
        untested = failed_test_warning(session, picked_model)
    if untested:
        st.warning(plain(untested), icon=":material/cloud_off:")
    FLASH.show("new")
    again = st.session_state.get(AGAIN_KEY)
    if again is not None and again.task == task.name:
        st.button("Evaluate again", key="eval_again", icon=":material/replay:", on_click=start_evaluation,
                  args=(again, True), help="Queue the same evaluation once more, on purpose.")


def scores_chart(completed: list, numbers: dict[int, int]) -> go.Figure:
    """Mean@k and Pass@k of every evaluation with figures, with their 95% intervals as error bars; one whose
    figures count only some rollouts says "of N answered" under its bar, one with no answer has no bar."""
    scored = [e for e in completed if score(e, "mean_at_k") is not None]
    names = [f"{evaluated_name(e, numbers)} (eval {e.id}, k={e.k}" + (f", {answered_words(e)})" if answered_words(e)
                                                                       else ")") for e in scored]
    fig = go.Figure()
    for title, key in (("Mean@k", "mean_at_k"), ("Pass@k", "pass_at_k")):
        values = [score(e, key) for e in scored]
        cis = [(e.metrics or {}).get(f"{key}_ci") or [v, v] for e, v in zip(scored, values, strict=True)]
        fig.add_trace(go.Bar(name=title, x=names, y=values, error_y={
            "type": "data", "symmetric": False, "array": [max(0.0, hi - v) for (_, hi), v in zip(cis, values, strict=True)],
            "arrayminus": [max(0.0, v - lo) for (lo, _), v in zip(cis, values, strict=True)]}))
    fig.update_layout(barmode="group", height=360, yaxis={"range": [0, 1.05], "title": "score"},
                      margin={"l": 10, "r": 10, "t": 30, "b": 10}, legend={"orientation": "h"})
    return fig


def resume(evaluation_id: int) -> None:
    """Queue a failed, stalled or cancelled evaluation again (a button's callback) and make sure a worker takes it."""
    if run_action(FLASH, "evaluations", resume_evaluation, engine(), evaluation_id, context().reviewer,
                  success=f"Evaluation {evaluation_id} queued again") is not None:
        start_worker_if_needed()


def cancel(evaluation_id: int) -> None:
    """Stop a queued or running evaluation (a button's callback); its worker stops within seconds."""
    run_action(FLASH, "evaluations", cancel_evaluation, engine(), evaluation_id, context().reviewer,
               success=f"Evaluation {evaluation_id} cancelled; its answered rollouts are kept (Resume continues it)")


def job_buttons(e, counts: Counts) -> None:
    """Below the table, for each evaluation that needs it: Cancel while it is queued or running, Retry or Resume
    when it is incomplete, failed, stalled or cancelled, each with a line saying why (and how many answers a
    cancelled one keeps: core.records.evaluation.counts)."""
    shown = job_health(e.status, e.heartbeat_at)
    if shown in EVALUATION_MAY_CANCEL:
        if allowed("reviewer"):
            st.button(f"Cancel evaluation {e.id}", key=f"eval_cancel_{e.id}", icon=":material/stop:",
                      on_click=cancel, args=(e.id,),
                      help="The worker stops within seconds; answered rollouts are kept and Resume continues it.")
        if shown != JobStatus.STALLED:
            return
    if shown == JobStatus.INCOMPLETE:
        st.warning(f"Evaluation {e.id} is incomplete: " + message_markdown(e.error))
        st.button(f"Retry the failed rollouts of evaluation {e.id}", key=f"eval_retry_{e.id}",
                  icon=":material/replay:", on_click=resume, args=(e.id,),
                  help="Runs only the rollouts without a reward; answered ones come from the ledger, unpaid.")
        return
    if shown == JobStatus.CANCELLED:
        planned = f" of {counts.planned}" if counts.planned is not None else ""
        st.caption(f"Evaluation {e.id} was cancelled with {counts.stored}{planned} rollouts stored "
                   f"({counts.answered} answered); Resume continues it and pays only for the rollouts without an "
                   "answer.")
    elif shown in (JobStatus.FAILED, JobStatus.STALLED):
        st.caption(f"Evaluation {e.id} is {shown}"
                   + (": its worker stopped beating; an idle worker takes it over, or resume it here."
                      if shown == JobStatus.STALLED else ". Error:"))
        if e.error:
            show_long(e.error, f"eval_error_{e.id}")
    else:
        return
    st.button(f"Resume evaluation {e.id}", key=f"eval_resume_{e.id}", icon=":material/play_arrow:",
              on_click=resume, args=(e.id,))


@st.fragment(run_every=2)
def evaluations_view(task_id: int) -> None:
    """The task's evaluations with live progress, cancel for queued or running ones, resume for failed, stalled
    or cancelled ones, and the scores chart."""
    FLASH.show("evaluations")
    evaluations, numbers = load_evaluations(task_id)
    if not evaluations:
        st.info("No evaluations of this task yet: choose a version above and press Start evaluation.")
        return
    with Session(engine()) as session:
        counts = evaluation_counts(session, evaluations)
    rows = []
    for e in evaluations:
        metrics = e.metrics or {}
        rows.append({"id": e.id, "version": evaluated_name(e, numbers), "split": e.split, "k": e.k,
                     "n": e.n, "Mean@k": score_text(e, "mean_at_k"), "Mean@k 95% CI": interval_text(e, "mean_at_k"),
                     "Pass@k": score_text(e, "pass_at_k"), "Pass@k 95% CI": interval_text(e, "pass_at_k"),
                     "answered": counts[e.id].answered_text,
                     "errors": metrics.get("errors", 0), "cost": e.cost,
                     "status": status_label(e.status, e.heartbeat_at),
                     "progress": counts[e.id].progress_text,
                     "model": e.model, "created": e.created_at})
    table(rows, key="evaluations_table",
          column_config={"cost": COST, "created": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm")})

    for e in evaluations:
        job_buttons(e, counts[e.id])

    completed = [e for e in reversed(evaluations) if e.status in EVALUATION_HAS_FIGURES]
    if completed:
        st.plotly_chart(scores_chart(completed, numbers), key="eval_chart")
    if with_figures(evaluations) != st.session_state.get(DRAWN_KEY, with_figures(evaluations)):
        st.rerun(scope="app")  # an evaluation finished: the compare and promote sections below need it too


def with_figures(evaluations: list) -> list[int]:
    """The ids of the evaluations that have figures to compare (complete or incomplete)."""
    return sorted(e.id for e in evaluations if e.status in EVALUATION_HAS_FIGURES)


def segments_section(completed: list, numbers: dict[int, int]) -> None:
    """A conversation task's scores per segment, per persona and per rubric criterion, for each completed
    evaluation (core.records.library.segments.breakdown, stored with the evaluation)."""
    with_segments = [e for e in completed if (e.metrics or {}).get("segments")]
    if not with_segments:
        st.info("No completed evaluation of this conversation task yet.")
        return
    segment_rows, persona_rows, criterion_rows = [], [], []
    for e in with_segments:
        name = f"#{e.id} {evaluated_name(e, numbers)}"
        for segment, row in e.metrics["segments"].items():
            segment_rows.append({"evaluation": name, "segment": segment, "queries": row["n"],
                                 "Mean@k": row["mean_at_k"], "95% CI": interval(row, "mean_at_k_ci"),
                                 "Pass@k": row["pass_at_k"], "unscored": row.get("unscored", 0)})
        for persona, row in (e.metrics.get("personas") or {}).items():
            persona_rows.append({"evaluation": name, "persona": persona, "segment": row["segment"],
                                 "queries": row["n"], "Mean@k": row["mean_at_k"],
                                 "95% CI": interval(row, "mean_at_k_ci")})
        for criterion, row in (e.metrics.get("criteria") or {}).items():
            criterion_rows.append({"evaluation": name, "criterion": criterion, "mean score": row["mean"],
                                   "conversations": row["n"]})
    st.subheader("Per segment")
    table(segment_rows, key="segment_table", column_config={"Mean@k": SCORE, "Pass@k": SCORE})
    st.subheader("Per criterion")
    table(criterion_rows, key="criterion_table", column_config={"mean score": SCORE})
    with st.expander("Per persona"):
        table(persona_rows, key="persona_table", column_config={"Mean@k": SCORE})


def segment_comparison(a_id: int, b_id: int) -> None:
    """B − A per segment, with the same paired statistics as overall."""
    by_segment = paired_by_segment(engine(), a_id, b_id)
    if not by_segment:
        return
    st.subheader("B − A per segment")
    table([{"segment": segment, "queries": s.n, "Mean@k A": s.mean_a, "Mean@k B": s.mean_b, "B − A": s.delta,
            "95% interval": f"[{s.ci_low:+.3f}, {s.ci_high:+.3f}]" if s.n >= 2 else "–", "verdict": s.verdict}
           for segment, s in by_segment.items()], key="segment_compare_table",
          column_config={"Mean@k A": SCORE, "Mean@k B": SCORE, "B − A": SCORE})


def evaluation_choice(e, numbers: dict[int, int]) -> str:
    return (f"evaluation {e.id} · {evaluated_name(e, numbers)} · {e.split} · k={e.k} · "
            f"Mean@k {score_text(e, 'mean_at_k')}")


def default_pair(evaluations: list, production: int | None) -> tuple[int, int]:
    """Compare's first choice (A, B), so that "B − A" reads as the change: B is the newest evaluation of the newest
    version evaluated; A the newest evaluation of production's version when B is not of it, else of the newest
    older version (the empty library is the oldest), else the evaluation before B. A of B's split and k first."""
    def age(e) -> int:  # version ids grow as versions are made; the empty library comes before every version
        return e.version_id if e.version_id is not None else -1

    b = max(evaluations, key=lambda e: (age(e), e.id))
    others = [e for e in evaluations if e.id != b.id]
    others = [e for e in others if (e.split, e.k) == (b.split, b.k)] or others
    chosen = ([e for e in others if production is not None and e.version_id == production != b.version_id]
              or [e for e in others if age(e) < age(b)] or others)
    return max(chosen, key=lambda e: (age(e), e.id)).id, b.id


def compare_section(completed: list, numbers: dict[int, int], production: int | None = None) -> None:
    """B against A on the same queries (core.records.evaluation.comparison): the paired difference with its interval, the
    tests, the verdict in words, and every query sorted by difference with both versions' outputs. A is first the
    older version's (or production's) evaluation and B the newer's (default_pair)."""
    if len(completed) < 2:
        st.info("Two evaluations with figures (complete, or incomplete with their errors left out) are needed "
                "to compare them.")
        return
    by_id = {e.id: e for e in completed}
    ids = list(by_id)  # newest first
    first_a, first_b = default_pair(completed, production)
    for key, param, default in (("eval_compare_a", "a", first_a), ("eval_compare_b", "b", first_b)):
        keep_valid_choice(key, ids)
        url_choice(key, param, ids)
        st.session_state.setdefault(key, default)
    left, right = st.columns(2)
    a_id = left.selectbox("Evaluation A", ids, key="eval_compare_a",
                          format_func=lambda i: evaluation_choice(by_id[i], numbers))
    b_id = right.selectbox("Evaluation B", ids, key="eval_compare_b",
                           format_func=lambda i: evaluation_choice(by_id[i], numbers))
    show_in_url("a", a_id)
    show_in_url("b", b_id)
    if a_id == b_id:
        st.warning("Choose two different evaluations.")
        return
    try:
        result = compare_evaluations(engine(), a_id, b_id)
    except StudioError as exc:
        st.error("These two cannot be compared: " + message_markdown(exc))
        return
    s = result.stats
    shown = st.warning if s.undecided else st.success if s.decided and s.delta > 0 else st.error if s.decided else st.info
    shown(plain(s.verdict))
    comparison_figures(result)
    frame = pd.DataFrame([{k: v for k, v in row.items() if k != "sample_id"} for row in result.rows])
    table(frame, key="compare_table",
          column_config={"mean reward A": SCORE, "mean reward B": SCORE, "difference": SCORE,
                         "cost A": COST, "cost B": COST})
    segment_comparison(a_id, b_id)
    outputs_side_by_side(result)


def comparison_figures(result) -> None:
    """The figures of B − A that the comparison could compute (Paired.figure): none without a query answered k
    times under both, no interval and no smallest detectable difference with fewer than two."""
    s = result.stats
    note = f" {plain(result.note.capitalize())}." if result.note else ""
    if s.n == 0:
        st.caption("No query was answered k times under both A and B, so there is no difference, interval or test "
                   f"to show; the table below says what each query lacks.{note}")
        return
    # Two columns for the figures a decision rests on, so the interval is never cut off.
    cols = st.columns(2)
    cols[0].metric("B − A (Mean@k)", figure(s.figure("delta"), "+.3f"))
    cols[1].metric("95% interval", f"[{s.ci_low:+.3f}, {s.ci_high:+.3f}]" if s.n >= 2 else NO_FIGURE)
    cols = st.columns(2)
    cols[0].metric("Sign test p", figure(s.figure("p_value"), ".3g"))
    cols[1].metric("Pass@k McNemar p", figure(s.figure("mcnemar_p"), ".3g"))
    cols = st.columns(5)
    cols[0].metric("A wins", s.losses)
    cols[1].metric("B wins", s.wins)
    cols[2].metric("Ties", s.ties)
    cols[3].metric("Cost per query A", f"${result.cost_a:.4f}")
    cols[4].metric("Cost per query B", f"${result.cost_b:.4f}")
    detectable = s.figure("detectable")
    st.caption(f"{s.n} queries answered k times by both, Mean@k A {s.mean_a:.3f} and B {s.mean_b:.3f}; paired "
               f"bootstrap interval over queries, exact sign test on per-query wins and losses; a difference is "
               f"called real only when the interval excludes 0 and the sign test agrees (p < 0.05)."
               + (f" Smallest difference this comparison could detect: about {detectable:.2f}."
                  if detectable is not None else "") + note)


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


def promote_section(completed: list, numbers: dict[int, int], setup: dict) -> None:
    """Choose an evaluated version; Promote shows the diff against production and the verdict, then asks."""
    FLASH.show("promote")
    current = setup["production"]
    if current:
        library_numbers = {v["id"]: v["number"] for v in setup["versions"]}
        st.caption(f"production is version {version_name(current, library_numbers)}.")
    else:
        st.caption("No version of this library is labelled production yet.")
    candidates = [e for e in completed if e.version_id is not None]
    if not candidates:
        st.info("Evaluate a version of the library first; the empty library cannot be promoted.")
        return
    by_id = {e.id: e for e in candidates}
    ids = sorted(by_id, key=lambda i: (by_id[i].mean_at_k or 0.0, i), reverse=True)  # best first
    key = f"eval_promote_choice_{setup['task'].id}"
    keep_valid_choice(key, ids)
    chosen = st.selectbox("Evaluation to promote", ids, key=key,
                          format_func=lambda i: evaluation_choice(by_id[i], numbers))
    version_id = by_id[chosen].version_id
    if not allowed("admin"):
        role_note("admin", "promoting a version to production")
        return
    if PROMOTE.pending() != version_id:
        st.button("Promote to production…", key="eval_promote", type="primary", icon=":material/rocket_launch:",
                  on_click=PROMOTE.ask, args=(version_id,), disabled=version_id == current,
                  help="Shows what changes against production and the comparison's verdict before anything moves.")
        return
    PROMOTE.draw(version_id, version_name(version_id, numbers))


def page() -> None:
    st.session_state.pop(ARRIVAL_KEY, None)
    st.title("Evaluate")
    ctx, task = require_task()
    setup = load_setup(task, ctx.library)
    st.header("New evaluation")
    if allowed("reviewer"):
        evaluation_form(setup)
    else:
        role_note("reviewer", "starting an evaluation")

    evaluations, numbers = load_evaluations(setup["task"].id)
    st.session_state[DRAWN_KEY] = with_figures(evaluations)
    st.header("Evaluations")
    evaluations_view(setup["task"].id)

    measured = [e for e in evaluations if e.status in EVALUATION_HAS_FIGURES]
    if is_conversation(setup["task"]):
        st.header("Segments, personas and criteria")
        segments_section(measured, numbers)

    st.header("Compare two evaluations")  # only those with a figure: one nothing answered is never A or B
    compare_section([e for e in measured if score(e, "mean_at_k") is not None], numbers, setup["production"])

    st.header("Promote")
    promote_section([e for e in measured if e.status == JobStatus.COMPLETED], numbers, setup)


run_page(page)
