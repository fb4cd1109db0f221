"""UI tests of the Evaluate page (Streamlit AppTest): queue, scores table and chart, compare, promote."""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session, col, select

from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.jobs.run_control import cancel_evaluation
from core.records.library.versions import import_library, set_label
from core.records.tasks.demos import DEMO_TASK, SUPPORT_TASK
from core.records.tasks.lookup import get_task
from storage import db, queries
from storage.tables import AuditEvent, Evaluation, LibraryVersion
from tests.ui_support import incomplete_evaluation, run_app, scripted_gateway, table_with

PAGE = "pages/evaluate.py"


@pytest.fixture
def engine(app_engine):
    """The app's database with the demo task (shadows the conftest engine on purpose)."""
    return app_engine


def imported_version(engine) -> int:
    return import_library(engine, DEMO_TASK, "- Re-read the question.", "lib.md").id


def typed(engine, version_id: int) -> str:
    """The version as a person types it and the form holds it: its number in its library (the app's demo tasks
    make the database ids differ from the numbers)."""
    with Session(engine) as session:
        return str(session.get(LibraryVersion, version_id).number)


def executed_evaluation(engine, version: str, k: int, limit: int = 3) -> Evaluation:
    evaluation_id = create_evaluation(engine, DEMO_TASK, version, k=k, limit=limit, created_by="test")
    _model, gateway = scripted_gateway(engine)
    evaluation = execute_evaluation(engine, evaluation_id, gateway=gateway)
    assert evaluation.status == "completed", evaluation.error
    return evaluation


def task_id(engine, name: str = DEMO_TASK) -> int:
    with Session(engine) as session:
        return get_task(session, name).id


def form_key(engine, name: str, task: str = DEMO_TASK) -> str:
    """The evaluation form's widget key: keyed by task and library (pages/evaluate.py form_key)."""
    with Session(engine) as session:
        task_row = get_task(session, task)
        library = queries.library_by_name(session, task_row.id, "default")
    return f"eval_{name}_{task_row.id}_{library.id if library else 'none'}"


def all_evaluations(engine) -> list[Evaluation]:
    with Session(engine) as session:
        return queries.evaluations(session)


def test_submit_queues_an_evaluation_of_the_chosen_version(engine):
    version_id = imported_version(engine)
    at = run_app(page=PAGE, session_state={"ctx_reviewer": "alice"})
    assert [t.value for t in at.title] == ["Evaluate"]
    version_box = at.selectbox(key=form_key(engine, "version"))
    assert version_box.options[-1] == "empty (no library)"
    assert version_id != 2 and version_box.value == "2"  # the newest version is the default, by its number

    at.number_input(key=form_key(engine, "k")).set_value(3)
    at.number_input(key=form_key(engine, "limit")).set_value(5)
    at.button(key="eval_submit").click()
    at.run()

    assert not at.exception, [e.value for e in at.exception]
    assert not at.error
    (evaluation,) = all_evaluations(engine)
    assert (evaluation.version_id, evaluation.k, evaluation.limit, evaluation.split) == (version_id, 3, 5, "test")
    assert evaluation.status == "queued"
    assert evaluation.created_by == "alice"
    table = table_with(at, "Mean@k")
    assert table["id"].tolist() == [evaluation.id]
    assert table.iloc[0]["version"] == "#2"
    assert table.iloc[0]["progress"] == "0/15"  # queued: 5 queries x k 3 planned, not "0/?"
    assert "queued" in table.iloc[0]["status"]


def test_empty_library_and_all_queries(engine):
    at = run_app(page=PAGE)
    at.selectbox(key=form_key(engine, "version")).set_value("empty")
    at.number_input(key=form_key(engine, "k")).set_value(1)
    at.button(key="eval_submit").click()
    at.run()

    (evaluation,) = all_evaluations(engine)
    assert evaluation.version_id is None
    assert evaluation.limit is None
    assert table_with(at, "Mean@k").iloc[0]["version"] == "empty"


def test_executed_evaluations_appear_in_the_table_and_the_chart(engine):
    version_id = imported_version(engine)
    first = executed_evaluation(engine, "empty", k=2)
    second = executed_evaluation(engine, typed(engine, version_id), k=1)
    at = run_app(page=PAGE)

    table = table_with(at, "Mean@k").set_index("id")
    assert sorted(table.index) == sorted([first.id, second.id])
    assert table.loc[first.id, "version"] == "empty"
    assert table.loc[second.id, "version"] == "#2"
    assert table.loc[first.id, "Mean@k"] == "0.500"  # scripted: right, wrong for each query
    assert table.loc[first.id, "Pass@k"] == "1.000"
    assert table.loc[second.id, "Mean@k"] == f"{second.mean_at_k:.3f}"
    assert table.loc[first.id, "n"] == 3
    assert table.loc[first.id, "progress"] == "6/6"
    lo, hi = first.metrics["mean_at_k_ci"]
    assert table.loc[first.id, "Mean@k 95% CI"] == f"{lo:.3f} – {hi:.3f}"
    assert all("completed" in status for status in table["status"])

    (chart,) = at.get("plotly_chart")
    traces = {trace["name"]: trace for trace in json.loads(chart.proto.spec)["data"]}
    assert set(traces) == {"Mean@k", "Pass@k"}
    assert traces["Mean@k"]["y"] == pytest.approx([0.5, second.mean_at_k])
    assert traces["Mean@k"]["x"][0].startswith(f"empty (eval {first.id}")
    assert traces["Mean@k"]["x"][1].startswith(f"#2 (eval {second.id}")


def test_comparing_two_evaluations_shows_the_paired_difference_and_one_row_per_query(engine):
    version_id = imported_version(engine)
    first = executed_evaluation(engine, "empty", k=2)
    second = executed_evaluation(engine, typed(engine, version_id), k=2)
    at = run_app(page=PAGE)

    assert at.selectbox(key="eval_compare_a").value == first.id
    assert at.selectbox(key="eval_compare_b").value == second.id
    compare = table_with(at, "mean reward A")
    assert len(compare) == 3
    with Session(engine) as session:
        test_queries = queries.samples(session, get_task(session, DEMO_TASK).id, "test", limit=3)
    assert sorted(compare["query"].tolist()) == sorted(s.query for s in test_queries)
    assert compare["difference"].tolist() == sorted(compare["difference"].tolist())  # worst for B first
    assert (compare["difference"] == compare["mean reward B"] - compare["mean reward A"]).all()
    expected = ["B" if d > 0 else "A" if d < 0 else "tie" for d in compare["difference"]]
    assert compare["winner"].tolist() == expected
    metrics = {m.label: m.value for m in at.metric}
    assert int(metrics["B wins"]) == expected.count("B")
    assert int(metrics["A wins"]) + int(metrics["B wins"]) + int(metrics["Ties"]) == 3
    delta = (second.mean_at_k or 0) - (first.mean_at_k or 0)
    assert metrics["B − A (Mean@k)"] == f"{delta:+.3f}"
    assert metrics["95% interval"].startswith("[") and "Sign test p" in metrics
    assert metrics["Cost per query A"].startswith("$")
    verdicts = [e.value for e in (*at.success, *at.error, *at.info)]
    assert any("B is better" in v or "B is worse" in v or "no detectable difference on 3 queries" in v
               for v in verdicts), verdicts
    assert at.selectbox(key="compare_query").value is not None  # a query's outputs open side by side

    at.selectbox(key="eval_compare_b").set_value(first.id)
    at.run()
    assert any("two different" in w.value for w in at.warning)
    assert not [df for df in at.dataframe if "mean reward A" in df.value.columns]


def test_evaluations_with_different_k_are_not_compared(engine):
    first = executed_evaluation(engine, "empty", k=2)
    executed_evaluation(engine, "empty", k=1)
    at = run_app(page=PAGE)
    assert at.selectbox(key="eval_compare_b").value != first.id
    assert any("same k" in e.value for e in at.error)
    assert not [df for df in at.dataframe if "mean reward A" in df.value.columns]


def test_a_cancelled_evaluation_says_how_many_answers_it_holds_and_a_cancelled_queued_one_its_plan(engine):
    """A cancelled evaluation has no metrics, but its answers are stored: the table counts them instead of
    "answered —", and a queued one cancelled before it started says its plan instead of "0 of ?"."""
    answered = executed_evaluation(engine, "empty", k=2)  # 3 queries x 2, all answered by the script
    with db.session_scope(engine) as session:  # as a cancel leaves it: answers stored, no figures
        row = session.get(Evaluation, answered.id)
        row.status, row.metrics = "cancelled", {}
        session.add(row)
    queued = create_evaluation(engine, DEMO_TASK, "empty", k=2, limit=4, created_by="test")
    cancel_evaluation(engine, queued, "alice")
    at = run_app(page=PAGE, session_state={"ctx_reviewer": "alice"})

    table = table_with(at, "Mean@k").set_index("id")
    assert table.loc[answered.id, "answered"] == "6/6"
    assert table.loc[answered.id, "progress"] == "6/6"
    assert table.loc[queued, "answered"] == "0/8"
    assert table.loc[queued, "progress"] == "0/8"
    captions = [c.value for c in at.caption]
    assert any(f"Evaluation {answered.id} was cancelled with 6 of 6 rollouts stored (6 answered)" in c
               for c in captions), captions
    assert any(f"Evaluation {queued} was cancelled with 0 of 8 rollouts stored" in c for c in captions), captions
    assert not any("?" in c for c in captions if "was cancelled" in c)


def test_promote_moves_the_production_label(engine):
    version_id = imported_version(engine)
    with db.session_scope(engine) as session:
        library = queries.library_by_name(session, get_task(session, DEMO_TASK).id, "default")
        first_version = queries.versions(session, library.id)[0]
        library_id = library.id
    set_label(engine, DEMO_TASK, str(first_version.number), "production", "test")
    evaluation = executed_evaluation(engine, typed(engine, version_id), k=1)
    executed_evaluation(engine, "empty", k=1)  # the empty library is no candidate
    at = run_app(page=PAGE, session_state={"ctx_reviewer": "alice"})

    assert at.selectbox(key=f"eval_promote_choice_{task_id(engine)}").options == [
        f"evaluation {evaluation.id} · #2 · test · k=1 · Mean@k {evaluation.mean_at_k:.3f}"]
    at.button(key="eval_promote").click()
    at.run()
    with Session(engine) as session:  # asked first: nothing moved yet
        assert queries.label_by_name(session, library_id, "production").version_id == first_version.id
    assert any("No paired comparison with production" in i.value for i in at.info)
    assert any(c.value.endswith("] Re-read the question.") and c.value.startswith("+ [") for c in at.code)
    at.button(key="eval_promote_confirm").click()  # without a comparison, and without a reason: refused
    at.run()
    assert any("compare them first" in e.value and "or give a reason" in e.value for e in at.error)
    with Session(engine) as session:
        assert queries.label_by_name(session, library_id, "production").version_id == first_version.id
    at.text_area(key="eval_promote_reason").input("The empty library was a placeholder.")
    at.button(key="eval_promote_confirm").click()
    at.run()

    assert not at.exception, [e.value for e in at.exception]
    with Session(engine) as session:
        label = queries.label_by_name(session, library_id, "production")
        assert (label.version_id, label.moved_by) == (version_id, "alice")
        move = session.exec(select(AuditEvent).where(AuditEvent.action == "label.move")
                            .order_by(col(AuditEvent.id).desc())).first()
    assert move.after["reason"] == "The empty library was a placeholder." and move.actor == "alice"
    assert any("production now points at version #2" in s.value and "(id " not in s.value for s in at.success)
    assert at.selectbox(key=form_key(engine, "version")).format_func("2") == "#2 production"


def test_failed_evaluation_can_be_resumed(engine):
    evaluation_id = create_evaluation(engine, DEMO_TASK, "empty", k=1, limit=2, created_by="test")
    with db.session_scope(engine) as session:
        evaluation = session.get(Evaluation, evaluation_id)
        evaluation.status, evaluation.error = "failed", "RuntimeError: the model server went away"
        session.add(evaluation)
    at = run_app(page=PAGE)
    assert any("the model server went away" in c.value for c in at.code)

    at.button(key=f"eval_resume_{evaluation_id}").click()
    at.run()

    assert not at.exception, [e.value for e in at.exception]
    with Session(engine) as session:
        assert queries.evaluations(session)[0].status == "queued"
    assert not [b for b in at.button if b.key == f"eval_resume_{evaluation_id}"]


def test_after_a_task_switch_the_form_queues_what_it_shows(engine):
    """The version and split shown after switching task in the sidebar are the ones queued, and the
    message says so (issue 14: the previous task's choices used to be queued)."""
    first = imported_version(engine)
    at = run_app(page=PAGE, session_state={"ctx_reviewer": "alice"})
    at.selectbox(key=form_key(engine, "version")).set_value("empty")
    at.selectbox(key=form_key(engine, "split")).set_value("train")
    at.run()
    at.sidebar.selectbox(key="task").set_value(SUPPORT_TASK)
    at.run()
    assert not at.exception, [e.value for e in at.exception]

    version_box = at.selectbox(key=form_key(engine, "version", SUPPORT_TASK))
    split_box = at.selectbox(key=form_key(engine, "split", SUPPORT_TASK))
    assert (version_box.value, split_box.value) != ("empty", "train")  # nothing carried over
    shown_version, shown_split = version_box.value, split_box.value
    at.button(key="eval_submit").click()
    at.run()

    (evaluation,) = all_evaluations(engine)
    with Session(engine) as session:
        assert evaluation.task_id == get_task(session, SUPPORT_TASK).id
    assert evaluation.split == shown_split
    assert (typed(engine, evaluation.version_id) if evaluation.version_id else "empty") == shown_version
    assert evaluation.version_id != first
    (message,) = [s.value.replace("\\", "") for s in at.success]  # Markdown escapes dropped, as drawn
    assert f"Evaluation {evaluation.id} queued" in message and f"on the {shown_split} split" in message


def test_a_model_that_cannot_be_called_is_refused_before_anything_is_queued(engine, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    at = run_app(page=PAGE, session_state={"ctx_reviewer": "alice",  # a typed model (AppTest cannot type)
                                           form_key(engine, "model"): "anthropic/claude-sonnet-4-5"})
    at.button(key="eval_submit").click()
    at.run()

    assert all_evaluations(engine) == []
    assert any("needs ANTHROPIC_API_KEY" in e.value.replace("\\", "") for e in at.error), [e.value for e in at.error]


def test_an_incomplete_evaluation_shows_its_errors_and_retries_only_the_failed_rollouts(engine):
    """A failed call is not a wrong answer: the page says the evaluation is incomplete, counts answered rollouts
    beside the figures, and its Retry button queues it again; a worker then pays for the failed rollouts only."""
    evaluation, model, gateway = incomplete_evaluation(engine)
    evaluation_id = evaluation.id
    assert evaluation.status == "incomplete"
    at = run_app(page=PAGE, session_state={"ctx_reviewer": "alice"})
    assert not at.exception, [e.value for e in at.exception]
    row = table_with(at, "Mean@k").iloc[0]
    assert (row["status"], row["answered"], row["errors"]) == ("incomplete", "3/4", 1)
    assert any(f"{evaluation_id} is incomplete: 1 of 4 rollouts" in w.value for w in at.warning), \
        [w.value for w in at.warning]
    at.button(key=f"eval_retry_{evaluation_id}").click()
    at.run()
    with Session(engine) as session:
        assert session.get(Evaluation, evaluation_id).status == "queued"
    calls = model.count("rollout")
    assert execute_evaluation(engine, evaluation_id, gateway=gateway).status == "completed"
    assert model.count("rollout") - calls == 1


def test_compare_leaves_out_queries_without_answers_and_says_so(engine):
    version_id = imported_version(engine)
    executed_evaluation(engine, "empty", k=1, limit=4)
    b_id = create_evaluation(engine, DEMO_TASK, typed(engine, version_id), k=1, limit=4, created_by="test")
    failures = iter([True])

    def reply(messages):
        return RuntimeError("503") if next(failures, False) else "so \\boxed{0}"

    _model, gateway = scripted_gateway(engine, rollout=reply)
    gateway.max_retries = 0
    assert execute_evaluation(engine, b_id, gateway=gateway).status == "incomplete"
    at = run_app(page=PAGE, session_state={"ctx_reviewer": "alice"})  # A: the older, B: the newer
    assert not at.exception, [e.value for e in at.exception]
    assert any(w.value.startswith("cannot decide: 1 of the 4 queries both evaluated lack answers") for w in at.warning)
    interval = next(m for m in at.metric if m.label == "95% interval")
    assert interval.value.count(",") == 1 and interval.value.endswith("]")


def test_compare_starts_with_the_older_or_production_version_as_a(engine):
    """B − A reads as the change: A is the older version's evaluation (or production's), B the newer version's,
    whichever was evaluated last (issue 37: the newest evaluation used to be B, even of the older version)."""
    older = imported_version(engine)
    newer = import_library(engine, DEMO_TASK, "- Re-read the question.\n- Check the units.", "lib2.md").id
    of_newer = executed_evaluation(engine, typed(engine, newer), k=1)
    of_older = executed_evaluation(engine, typed(engine, older), k=1)  # evaluated last
    executed_evaluation(engine, "empty", k=1)  # the newest evaluation, of the oldest library
    at = run_app(page=PAGE)
    assert (at.selectbox(key="eval_compare_a").value, at.selectbox(key="eval_compare_b").value) == (
        of_older.id, of_newer.id)

    with Session(engine) as session:
        library = queries.library_by_name(session, task_id(engine), "default")
        first = queries.versions(session, library.id)[0]
    set_label(engine, DEMO_TASK, str(first.number), "production", "test")
    of_production = executed_evaluation(engine, str(first.number), k=1)
    at = run_app(page=PAGE)
    assert (at.selectbox(key="eval_compare_a").value, at.selectbox(key="eval_compare_b").value) == (
        of_production.id, of_newer.id)


def test_the_form_sent_again_never_queues_an_evaluation_identical_to_one_that_just_ended(engine):
    """Enter in the form's number box sends the form again; once the first evaluation had ended, an identical
    one was queued without a word. Now it is refused, saying so, and Evaluate again queues it on purpose."""
    version_id = imported_version(engine)
    first = executed_evaluation(engine, typed(engine, version_id), k=2, limit=3)
    at = run_app(page=PAGE, session_state={"ctx_reviewer": "alice"})
    at.selectbox(key=form_key(engine, "version")).set_value(typed(engine, version_id))
    at.number_input(key=form_key(engine, "k")).set_value(2)
    at.number_input(key=form_key(engine, "limit")).set_value(3)
    assert at.selectbox(key=form_key(engine, "model")).value == first.model  # the newest evaluation's model
    at.button(key="eval_submit").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [e.id for e in all_evaluations(engine)] == [first.id]  # nothing new
    said = " ".join(str(e.value) for e in at.error) + " ".join(str(c.value) for c in at.code)
    assert f"evaluation {first.id} of the same version, split, k and model ended" in said
    at.button(key="eval_again").click()
    at.run()
    newest = all_evaluations(engine)[0]
    assert newest.id != first.id and newest.status == "queued"
    assert (newest.version_id, newest.k, newest.limit, newest.model) == (version_id, 2, 3, first.model)
    assert not [b for b in at.button if b.key == "eval_again"]


def test_a_new_session_starts_from_the_model_of_the_newest_run(engine):
    """After a run (here on another model than the task's), Evaluate offers the run's model first, not the task's
    (core.records.models.options.chosen_model, which `compare` uses too)."""
    from tests.ui_support import seeded_run

    with Session(engine) as session:
        task_model = get_task(session, DEMO_TASK).policy_model
    run_model = "local/smollm2-135m" if task_model != "local/smollm2-135m" else "local/qwen2.5-0.5b"
    seeded_run(engine, review_mode="auto", settings={"policy_model": run_model, "gate": "off"})
    at = run_app(page=PAGE)
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key=form_key(engine, "model")).value == run_model
