"""No number without answers: an evaluation none of whose rollouts was answered has no Mean@k or Pass@k (None in
core, null in JSON and the API, "—" on the pages, no bar in the chart), an incomplete one's figures say "of N
answered", and a comparison against it shows no figure it could not compute."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.records.evaluation.comparison import compare_evaluations, paired
from core.records.evaluation.figures import (
    NO_FIGURE,
    evaluation_report,
    figures_line,
    read_evaluation_report,
    score_text,
)
from core.records.keys.api_keys import create_key
from core.records.library.versions import import_library
from core.records.tasks.demos import DEMO_TASK
from storage.db import session_scope
from storage.tables import Evaluation
from tests.ui_support import run_app, scripted_gateway, table_with

PAGE = "pages/evaluate.py"


def unanswered(engine, version: str = "empty") -> Evaluation:
    """An evaluation of 2 queries x k=2 whose every model call failed: 0 of 4 answered."""
    eval_id = create_evaluation(engine, DEMO_TASK, version, k=2, limit=2, created_by="test")
    _model, gateway = scripted_gateway(engine, rollout=RuntimeError("503 Service Unavailable"))
    gateway.max_retries = 0
    return execute_evaluation(engine, eval_id, gateway=gateway)


def answered(engine, version: str, fail_first: int = 0) -> Evaluation:
    """The same queries answered (scripted: right, then wrong, per query), the first `fail_first` calls failed."""
    failures = iter([True] * fail_first)

    eval_id = create_evaluation(engine, DEMO_TASK, version, k=2, limit=2, created_by="test")
    model, gateway = scripted_gateway(engine)
    right_then_wrong = model.replies["rollout"]
    model.replies["rollout"] = lambda messages: (RuntimeError("503") if next(failures, False)
                                                 else right_then_wrong(messages))
    gateway.max_retries = 0
    return execute_evaluation(engine, eval_id, gateway=gateway)


def test_an_evaluation_without_answers_has_no_figures_in_core_or_json(engine, demo_task):
    ev = unanswered(engine)
    assert ev.status == "incomplete" and ev.metrics["answered"] == 0 and ev.metrics["errors"] == 4
    assert (ev.mean_at_k, ev.pass_at_k, ev.metrics["mean_at_k_ci"], ev.metrics["pass_at_k_ci"]) == (None,) * 4
    report = json.loads(json.dumps(read_evaluation_report(engine, ev.id)))
    assert {key: report[key] for key in ("mean_at_k", "pass_at_k", "mean_at_k_ci", "pass_at_k_ci", "answered")} == {
        "mean_at_k": None, "pass_at_k": None, "mean_at_k_ci": None, "pass_at_k_ci": None, "answered": 0}
    assert score_text(ev, "mean_at_k") == NO_FIGURE
    assert figures_line(ev) == "Mean@2 —  Pass@2 — (no rollout was answered)  rollout errors 4"


def test_a_row_stored_with_a_zero_beside_no_answer_reads_as_no_figure(engine, demo_task):
    """Evaluations stored before this rule hold Mean@k 0.0 beside "answered": 0; they are read as no figure."""
    ev = unanswered(engine)
    with session_scope(engine) as session:
        row = session.get(Evaluation, ev.id)
        row.mean_at_k, row.pass_at_k = 0.0, 0.0
        row.metrics = {**row.metrics, "mean_at_k": 0.0, "mean_at_k_ci": [0.0, 0.0]}
        session.add(row)
    report = read_evaluation_report(engine, ev.id)
    assert report["mean_at_k"] is None and report["mean_at_k_ci"] is None


def test_an_incomplete_evaluation_says_how_many_answers_its_figures_count(engine, demo_task):
    ev = answered(engine, "empty", fail_first=1)
    assert ev.status == "incomplete" and ev.metrics["answered"] == 3
    assert score_text(ev, "mean_at_k") == f"{ev.mean_at_k:.3f} (of 3 answered)"
    assert "(of 3 answered rollouts)  rollout errors 1" in figures_line(ev)
    assert evaluation_report(ev)["mean_at_k"] == ev.mean_at_k


def test_an_unfinished_evaluation_reports_no_figures(engine, demo_task):
    eval_id = create_evaluation(engine, DEMO_TASK, "empty", k=1, limit=1, created_by="test")
    report = read_evaluation_report(engine, eval_id)
    assert report["status"] == "queued" and report["mean_at_k"] is None and report["pass_at_k"] is None


def test_the_api_answers_null_where_nothing_was_answered(engine, demo_task):
    ev = unanswered(engine)
    client = TestClient(create_app(engine), headers={"Authorization": f"Bearer {create_key(engine, 'a', 'read', 'cli').secret}"})
    body = client.get(f"/v1/evaluations/{ev.id}").json()
    assert (body["status"], body["mean_at_k"], body["pass_at_k"], body["answered"], body["errors"]) == (
        "incomplete", None, None, 0, 4)
    assert client.get("/v1/evaluations/9999").status_code == 404
    assert TestClient(create_app(engine)).get(f"/v1/evaluations/{ev.id}").status_code == 401


def test_a_comparison_against_it_refuses_and_computes_no_figure(engine, demo_task):
    a = answered(engine, "empty")
    b = unanswered(engine, str(import_library(engine, DEMO_TASK, "- Check the units.", "u.md").number))
    result = compare_evaluations(engine, a.id, b.id)
    s = result.stats
    assert s.n == 0 and not s.decided and s.verdict.startswith("cannot decide: 2 of the 2 queries")
    figures = s.as_dict()
    assert [figures[name] for name in ("mean_a", "mean_b", "delta", "ci_low", "ci_high", "p_value", "mcnemar_p",
                                       "detectable")] == [None] * 8
    assert "inf" not in s.verdict and "inf" not in json.dumps(figures)
    one = paired({1: [1.0]}, {1: [0.0]})  # one query: a difference, but no interval and no detectable size
    assert one.figure("delta") == -1.0 and one.figure("detectable") is None and one.figure("ci_low") is None
    assert paired({}, {}).verdict == "cannot decide: no query was answered k times under both"


@pytest.fixture
def page_engine(app_engine):
    return app_engine


def test_the_evaluate_page_shows_no_mean_bar_or_difference_for_it(page_engine):
    engine = page_engine
    a = answered(engine, "empty")
    partial = answered(engine, str(import_library(engine, DEMO_TASK, "- Re-read it.", "r.md").number), fail_first=1)
    b = unanswered(engine, str(import_library(engine, DEMO_TASK, "- Check the units.", "u.md").number))
    at = run_app(page=PAGE, session_state={"eval_compare_a": a.id, "eval_compare_b": b.id})

    rows = table_with(at, "Mean@k").set_index("id")
    assert rows.loc[b.id, ["Mean@k", "Mean@k 95% CI", "Pass@k", "Pass@k 95% CI"]].tolist() == [NO_FIGURE] * 4
    assert rows.loc[b.id, "answered"] == "0/4"
    assert rows.loc[partial.id, "Mean@k"] == f"{partial.mean_at_k:.3f} (of 3 answered)"
    (chart,) = at.get("plotly_chart")
    bars = json.loads(chart.proto.spec)["data"][0]["x"]
    assert not any(f"eval {b.id}," in name for name in bars)  # no bar at all, not a 0
    assert any(f"eval {partial.id}, k=2, of 3 answered" in name for name in bars)
    box = at.selectbox(key="eval_compare_b")
    assert b.id not in box.options  # nothing answered: never offered to Compare (issue 41), not even as B asked for
    assert box.format_func(partial.id).endswith("(of 3 answered)")
    at = run_app(page=PAGE, session_state={"eval_compare_a": a.id, "eval_compare_b": partial.id})
    assert any(w.value.startswith("cannot decide: 1 of the 2 queries") for w in at.warning)
    assert not any("inf" in c.value for c in at.caption)
    compare = table_with(at, "mean reward B")
    assert list(compare["winner"]).count("left out (errors)") == 1  # the query B lacks an answer for: not a loss


def test_missing_values_in_any_table_show_as_a_dash_with_their_column_format():
    import pandas as pd
    import streamlit as st

    from ui.display import shown_missing

    frame = pd.DataFrame([{"p": 0.0123, "when": pd.Timestamp("2026-01-02 03:04"), "name": "a", "n": 3},
                          {"p": None, "when": None, "name": None, "n": 4}])
    shown, config = shown_missing(frame, {"p": st.column_config.NumberColumn(format="%.3g"),
                                          "when": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm")})
    assert shown.to_dict("list") == {"p": ["0.0123", "—"], "when": ["2026-01-02 03:04", "—"], "name": ["a", "—"],
                                     "n": [3, 4]}
    assert config["p"]["type_config"]["type"] == "text" and "n" not in config


def test_the_command_line_prints_null_and_no_comparison_figure_where_nothing_was_answered(
        engine, database_url, demo_task, unreachable_model, capsys, monkeypatch):
    """`eval --json` on a model that answers nothing prints null figures; `compare`'s lines leave out every figure
    the comparison could not compute (none without a query in common, no interval with one)."""
    from core.cli import main
    from core.cli.jobs import comparison_lines

    model, api_base = unreachable_model
    monkeypatch.setenv("OPENAI_API_BASE", api_base)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    code = main(["--db", database_url, "eval", "--task", DEMO_TASK, "--version", "empty", "--limit", "2", "--k", "2",
                 "--model", model, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["answered"] == 0 and report["mean_at_k"] is None and report["pass_at_k"] is None

    a = answered(engine, "empty")
    b = unanswered(engine, str(import_library(engine, DEMO_TASK, "- Check the units.", "u.md").id))
    assert comparison_lines(compare_evaluations(engine, a.id, b.id).stats) == []
    one = comparison_lines(paired({1: [1.0]}, {1: [0.0]}))
    assert one[0] == "Mean@k  A 1.000  B 0.000  B - A -1.000" and not any("inf" in line for line in one)
