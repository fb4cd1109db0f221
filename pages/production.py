"""Production: what live agents sent back through the API (core/records/production/traces.py).

Traces per day and version, the mean score per version over time with its 95% interval, the share with
a score, the lowest-scored traces as text (never Markdown or HTML: an agent's input and output are
untrusted), filters; the task's labelling rules; the A/B experiment (ui/ab.py: its arms compared with an
anytime-valid interval on the difference, and the guard); and the way back into training: harvest failures into train samples and start an update
from production. All of it calls core; the page only draws.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, time, timedelta

import plotly.graph_objects as go
import streamlit as st
from sqlmodel import Session

from core.grpo.training import create_run
from core.records.library.versions import PRODUCTION
from core.records.production.otlp import map_service, other_spans, service_map, span_detail
from core.records.production.otlp_held import UNREADABLE, held_services, held_spans
from core.records.production.scores import score_source, thumbs_word, trace_score
from core.records.production.scoring import (
    SOURCES,
    cannot_score,
    judge_suggestion_shown,
    judge_summary,
    rules_words,
)
from core.records.production.trace_views import (
    LOWEST,
    PAGE_SIZE,
    daily_rows,
    lowest_traces,
    oldest_waiting,
    totals,
)
from core.records.production.traces import (
    TraceFilter,
    any_trace,
    find_trace,
    harvest,
    label_trace,
    set_rules,
    task_traces,
    trace_output,
    trace_rows,
    version_name,
)
from core.records.runs.settings import RunSettings
from storage import queries
from storage.statuses import TraceJudgeStatus
from ui.ab import ab_section
from ui.common import (
    Flash,
    Outcome,
    allowed,
    context,
    engine,
    plain,
    require_task,
    role_note,
    run_action,
    run_page,
    start_worker_if_needed,
)
from ui.display import show_long, table

FLASH = Flash("production_flash")
OLD_SHARE = 0.3


def score_chart(rows: list[dict]) -> go.Figure:
    figure = go.Figure()
    for version in sorted({row["version"] for row in rows}):
        mine = [row for row in rows if row["version"] == version and row["mean score"] is not None]
        if not mine:
            continue
        figure.add_trace(go.Scatter(
            x=[row["day"] for row in mine], y=[row["mean score"] for row in mine], mode="lines+markers",
            name=f"version {version}",
            error_y={"type": "data", "symmetric": False,
                     "array": [row["high"] - row["mean score"] for row in mine],
                     "arrayminus": [row["mean score"] - row["low"] for row in mine]}))
    figure.update_layout(height=320, margin={"l": 10, "r": 10, "t": 30, "b": 10}, yaxis={"range": [0, 1]},
                         title="Mean score per day and version (95% interval)")
    return figure


def do_harvest(task_name: str, chosen: dict) -> None:
    """Harvest exactly the traces the filters above show (every filter, not only the days and the score)."""
    run_action(FLASH, "harvest", harvest, engine(), task_name, context().reviewer, **chosen,
               report=lambda r: f"Added {r[0]} train samples from production; {r[1]} skipped (a sample has that input).")


def start_update(task_name: str, library: str) -> None:
    settings = RunSettings(start_label=PRODUCTION, old_share=OLD_SHARE, review_mode="manual")
    run_action(FLASH, "harvest", create_run, engine(), task_name, settings, library_name=library,
               created_by=context().reviewer,
               success=lambda run_id: f"Run {run_id} queued: from production, on the harvested samples and "
                                      f"{OLD_SHARE:.0%} of the old train split, every change reviewed.")


def save_rules(task_name: str) -> None:
    rules = {"below": st.session_state.get("production_below"), "share": st.session_state.get("production_share"),
             "judge_share": st.session_state.get("production_judge_share"),
             "judge_ab": bool(st.session_state.get("production_judge_ab"))}
    run_action(FLASH, "rules", set_rules, engine(), task_name, {k: v for k, v in rules.items() if v},
               context().reviewer, success="Rules saved; later traces follow them.")
    if rules["judge_share"] or rules["judge_ab"]:
        start_worker_if_needed()  # the worker scores the traces the judge's rules choose


SCALE = {"1": 0.0, "2": 0.25, "3": 0.5, "4": 0.75, "5": 1.0}


def save_label(trace_id: int) -> None:
    point = st.session_state.get(f"production_label_{trace_id}")
    if point is None:
        FLASH.set("labels", Outcome(False, "Choose a score from 1 to 5 first."))
        return
    run_action(FLASH, "labels", label_trace, engine(), trace_id, SCALE[point], context().reviewer,
               success=f"Trace labelled {point}.")


def labelling_section(trace, waiting: int) -> None:
    """The traces the task's rules sent to people, one at a time, the oldest first: input and output as text, a
    1-5 score."""
    st.subheader(f"Waiting for a person ({waiting})", anchor=False)
    FLASH.show("labels")
    if trace is None:
        st.caption("No trace waits: the labelling rules below choose which ones do.")
        return
    if not allowed("labeler"):
        role_note("labeler", "labelling production traces")
        return
    st.caption(f"Trace {trace.client_id} · sent score {trace.score if trace.score is not None else '-'} · "
               f"thumbs {thumbs_word(trace) or '-'} · {trace.segment or 'no segment'}")
    show_long(trace.input, f"production_label_in_{trace.id}")
    show_long(trace_output(trace), f"production_label_out_{trace.id}")
    sent_feedback(trace)
    left, right = st.columns([3, 1], vertical_alignment="bottom")
    left.radio("Score (1 wrong or unusable ... 5 fully right)", list(SCALE), horizontal=True, index=None,
               key=f"production_label_{trace.id}")
    right.button("Save label", key="production_save_label", type="primary", on_click=save_label, args=(trace.id,))


def sent_feedback(trace) -> None:
    """What the trace's user and the task's judge said about it, beside the answer a person scores: the comment
    the agent sent (as text: it is the user's), and an unsure judge's suggestion with its reason."""
    if trace.comment:
        st.caption(f"Comment the agent sent (thumbs {thumbs_word(trace) or '-'})")
        show_long(trace.comment, f"production_label_comment_{trace.id}")
    if judge_suggestion_shown(trace):
        suggestion = "-" if trace.judge_score is None else f"{trace.judge_score:.2f}"
        st.caption(f"The task's judge was unsure (its suggestion {suggestion}); its reason:")
        show_long(trace.judge_detail or "", f"production_label_judge_{trace.id}")
    elif trace.judge_status == TraceJudgeStatus.UNSURE:
        st.caption("The task's judge was unsure; its suggestion is not shown on a trace of an A/B experiment, so "
                   "your label is your own.")


def traces_page(pages: int) -> int:
    """Which page of the traces table to show (0-based): a number box when there is more than one."""
    if pages <= 1:
        return 0
    return int(st.number_input(f"Page of the traces table (of {pages})", min_value=1, max_value=pages, value=1,
                               step=1, key="production_page")) - 1


def filters(task_id: int, versions: dict[int, int]) -> dict:
    left, middle, right, far = st.columns(4)
    version = left.selectbox("Version", [None, *sorted(versions, reverse=True)], key="production_version",
                             format_func=lambda v: "all" if v is None else f"#{versions[v]}")
    with Session(engine()) as session:
        segments = queries.trace_segments(session, task_id)
    segment = middle.selectbox("Segment", [None, *segments], key="production_segment",
                               format_func=lambda s: "all" if s is None else s)
    days = right.number_input("Last days", min_value=1, value=30, step=1, key="production_days")
    max_score = far.number_input("Score at most", min_value=0.0, max_value=1.0, value=None, step=0.1,
                                 key="production_max_score", placeholder="any")
    since = datetime.combine(datetime.now(UTC).date() - timedelta(days=int(days) - 1), time.min, tzinfo=UTC)
    sender, user, thumbs, comment = st.columns(4)
    found = {"sender_id": sender.text_input("Sender id", key="production_sender", placeholder="any"),
             "user_id": user.text_input("User", key="production_user", placeholder="any"),
             "thumbs": thumbs.selectbox("Thumbs", [None, "up", "down", "none"], key="production_thumbs",
                                        format_func=lambda t: "any" if t is None else t),
             "comment": comment.text_input("Comment contains", key="production_comment", placeholder="any")}
    return {"version_id": version, "segment": segment, "since": since, "max_score": max_score,
            **{name: value for name, value in found.items() if value}}


def opened_trace(task_name: str, versions: dict[int, int]) -> None:
    """The trace named by `?trace=<sender id>` (a link an engineer shares, or the box here), in full."""
    sender_id = st.text_input("Open a trace by its sender id", value=st.query_params.get("trace", ""),
                              key="production_open", placeholder="the id your agent gave the trace")
    if not sender_id:
        st.query_params.pop("trace", None)
        return
    st.query_params["trace"] = sender_id
    with Session(engine()) as session:
        trace = find_trace(session, task_name, sender_id.strip())
    if trace is None:
        st.warning("This task has no trace with that sender id.")
        return
    [row] = trace_rows([trace], versions)
    table([row], key="production_opened_table")
    st.caption("Input")
    show_long(trace.input, f"production_open_in_{trace.id}")
    st.caption("Output")
    show_long(trace_output(trace), f"production_open_out_{trace.id}")
    span_attributes(trace, f"production_open_attributes_{trace.id}")


def span_attributes(trace, key: str) -> None:
    """An OTLP trace's span as received (ids, scope, model, tokens, its attributes and resource), as text."""
    with Session(engine()) as session:
        otlp = span_detail(session, trace)
    if otlp is not None:
        st.caption(f"Span attributes (from {otlp.get('scope') or 'an unnamed scope'}; version from "
                   f"{otlp.get('version_from')})")
        show_long(json.dumps(otlp, indent=2, ensure_ascii=False, default=str), key, language="json")


def map_selected(task_name: str) -> None:
    service = st.session_state.get("production_map_service") or ""
    library = st.session_state.get("production_map_library") or "default"
    run_action(FLASH, "otlp", map_service, engine(), service, task_name, library, context().reviewer,
               success=lambda mapped: mapped.words(service, task_name))


def otlp_section(task_name: str, library: str) -> None:
    """Spans received over OTLP held by service (their service maps to no task yet, or their messages cannot be
    read), the newest unreadable ones as received, and the map from services to tasks. An admin sees every held
    span; anyone else those sent by a key bound to this task."""
    admin = allowed("admin")
    with Session(engine()) as session:
        task = queries.task_by_name(session, task_name)
        seen = {"task_id": task.id if task else None, "admin": admin}
        held, mapped, other = held_services(session, **seen), service_map(session), other_spans(session)
        unreadable = held_spans(session, reason=UNREADABLE, limit=5, **seen)
        session.expunge_all()
    waiting = [row for row in held if row["held (not mapped)"]]
    if not (held or mapped or other):
        return
    st.subheader("OpenTelemetry services", anchor=False)
    st.caption("Spans sent to /otlp/v1/traces that name no task (tfgrpo.task) go to the task their service.name is "
               f"mapped to. {other} span(s) held no model call with a user message and were counted, not stored.")
    FLASH.show("otlp")
    if held:
        st.warning(f"{sum(row['held (not mapped)'] for row in held)} span(s) are held because their service maps "
                   "to no task: map the service and they land in the task. "
                   f"{sum(row['held (unreadable)'] for row in held)} model call(s) carried no message the studio "
                   "reads (shown below). Past the bound the oldest are dropped and counted.")
        table(held, key="production_unmapped_table")
    for span in unreadable:
        st.caption(f"Unreadable model call from {span.service} ({span.span.get('why') or UNREADABLE})")
        show_long(json.dumps(span.span, indent=2, ensure_ascii=False, default=str),
                  f"production_held_{span.id}", language="json")
    if mapped:
        table(mapped, key="production_services_table")
    if not allowed("admin"):
        role_note("admin", "mapping OpenTelemetry services to tasks")
        return
    left, middle, right = st.columns([3, 2, 1], vertical_alignment="bottom")
    left.text_input("service.name", key="production_map_service",
                    value=waiting[0]["service"] if waiting else "")
    middle.text_input("Library of this task", key="production_map_library", value=library)
    right.button("Map to this task", key="production_map", on_click=map_selected, args=(task_name,))


def page() -> None:
    st.title("Production")
    current = require_task()
    ctx, task = current.ctx, current.task
    st.caption("Traces live agents posted to the HTTP API (`python -m core serve`, the client in client/). "
               "A trace's score is a person's label if it has one, else the score or thumbs the agent sent, else "
               "the task's judge's (the column *score by* says whose).")
    with Session(engine()) as session:
        versions = queries.trace_versions(session, task.id)
        library = queries.library_by_name(session, task.id, ctx.library)
        session.expunge_all()
    otlp_section(task.name, ctx.library)
    with Session(engine()) as session:
        has_traces = any_trace(session, task.id)
    if not has_traces:  # the split and the rules can be set before the first trace arrives
        st.info("No trace yet. Create an ingest key on the People page, start the API with `python -m core serve` "
                "(`make run` starts it too), and log traces from your agent with the client (client/README.md), "
                "or point an OpenTelemetry exporter at /otlp (docs/traces-otlp.md).")
        if library is not None:
            ab_section(task.name, ctx.library)
        rules_section(task)
        return
    opened_trace(task.name, versions)
    chosen = filters(task.id, versions)
    window = TraceFilter(**chosen)
    with Session(engine()) as session:
        counted = totals(session, task.name, window)
        rows = daily_rows(session, task.name, window, versions)
        lowest = lowest_traces(session, task.name, window, LOWEST)
        waiting = oldest_waiting(session, task.name, window)
        session.expunge_all()
    a, b, c = st.columns(3)
    a.metric("Traces", counted.traces)
    b.metric("With a score", "-" if counted.scored_share is None else f"{counted.scored_share:.0%}")
    c.metric("Waiting for a person", counted.waiting)
    if library is not None:  # the experiment beside the figures, above the rows of traces
        ab_section(task.name, ctx.library)
    if rows:
        st.plotly_chart(score_chart(rows), key="production_chart")
        table(rows, columns=["day", "version", "traces", "scored share", "mean score", "low", "high"],
              key="production_daily_table")
    if counted.traces:
        st.subheader("Traces", anchor=False)
        pages = -(-counted.traces // PAGE_SIZE)
        page_number = traces_page(pages)
        with Session(engine()) as session:
            listed = task_traces(session, task.name, limit=PAGE_SIZE, offset=page_number * PAGE_SIZE, **chosen)
            session.expunge_all()
        first = page_number * PAGE_SIZE + 1
        st.caption(f"{first}-{first + len(listed) - 1} of {counted.traces}, newest first, by what their sender gave "
                   "(page "
                   f"{page_number + 1} of {pages}); open one by its sender id above (or link to it: this page's "
                   "address with ?trace=<sender id>).")
        table(trace_rows(listed, versions), key="production_traces_table")
    if lowest:
        st.subheader("Lowest scored", anchor=False)
        for trace in lowest:
            with st.expander(f"{trace_score(trace):.2f} · {trace.client_id} · "
                             f"{version_name(trace.version_id, versions)} · {trace.segment or 'no segment'} · "
                             f"score by {SOURCES[score_source(trace)]}"):
                st.caption("Input")
                show_long(trace.input, f"production_in_{trace.id}")
                st.caption("Output")
                show_long(trace_output(trace), f"production_out_{trace.id}")
                if trace.comment:
                    st.caption("Comment")
                    show_long(trace.comment, f"production_comment_{trace.id}")
                span_attributes(trace, f"production_low_attributes_{trace.id}")
    labelling_section(waiting, counted.waiting)
    rules_section(task)
    harvest_section(task.name, ctx.library, chosen)


def rules_section(task) -> None:
    st.subheader("Which traces go to people, and which the judge scores", anchor=False)
    rules = task.production_rules or {}
    st.caption(f"Now: every trace scored under {rules.get('below', '-')} and {rules.get('share', 0):.0%} of the "
               "rest are marked for labelling.")
    judge_section(task, rules)
    FLASH.show("rules")
    if not allowed("admin"):
        role_note("admin", "changing the labelling rules")
        return
    left, right, share, arms, button = st.columns([2, 2, 2, 2, 1], vertical_alignment="bottom")
    left.number_input("Every trace scored under", min_value=0.0, max_value=1.0, step=0.1, key="production_below",
                      value=rules.get("below"), placeholder="none")
    right.number_input("Share of the rest", min_value=0.0, max_value=1.0, step=0.05, key="production_share",
                       value=float(rules.get("share", 0.0)))
    share.number_input("Judge scores this share", min_value=0.0, max_value=1.0, step=0.05,
                       key="production_judge_share", value=float(rules.get("judge_share", 0.0)),
                       help="of every trace received from now on, a minute after it arrives; each call is in the "
                            "ledger")
    arms.checkbox("Judge every A/B trace without feedback", key="production_judge_ab",
                  value=bool(rules.get("judge_ab")))
    button.button("Save rules", key="production_save_rules", on_click=save_rules, args=(task.name,))


def judge_section(task, rules: dict) -> None:
    """What the task's judge does with production traces, and what it has cost so far (the ledger's figure)."""
    st.caption(rules_words(rules))
    with Session(engine()) as session:
        summary = judge_summary(session, task.id)
    if summary.calls or summary.scored or summary.unsure or summary.retrying:
        st.caption(summary.words())
    if summary.unavailable:
        st.warning(plain(summary.unavailable))
    if reason := cannot_score(task):
        st.caption(f"The task's reward cannot score production traces: {reason}.")


def harvest_section(task_name: str, library: str, chosen: dict) -> None:
    st.subheader("Failures back into training", anchor=False)
    st.caption("Harvest adds the traces the filters above select (the last days, the score at most) as train "
               "samples, skipping any whose input a sample already has. An update from production starts a run "
               f"from the production version on those samples and {OLD_SHARE:.0%} of the old train split, with every "
               "change reviewed; its gate compares each step with the version before it on validation queries (the "
               "validation split's, else old train samples': never a harvested one, each of which it trains on). "
               "Compare its result with production on the Evaluate page before you promote it.")
    FLASH.show("harvest")
    if not allowed("admin"):
        role_note("admin", "harvesting traces")
        return
    left, right = st.columns(2)
    left.button("Harvest these traces", key="production_harvest", on_click=do_harvest, args=(task_name, chosen))
    right.button("Update from production", key="production_update", type="primary", on_click=start_update,
                 args=(task_name, library))


run_page(page)
