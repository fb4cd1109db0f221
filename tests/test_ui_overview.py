"""UI tests of the overview page (Streamlit AppTest), each on its own database seeded through core: the first
visit's path (What this is, three step buttons), the empty states' buttons, and the tables."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from core.domain.library import ProposedOp
from core.domain.sandbox import jail_status
from core.grpo.evaluation import create_evaluation
from core.grpo.training import RunSettings, create_run, store_operations
from core.records.library.versions import import_library
from core.records.tasks.demos import CONVERSATION_TASK, DEMO_TASK, POLICY_TASK, SUPPORT_TASK
from core.records.tasks.lookup import get_task
from storage import db, queries
from storage.db import describe_url
from storage.tables import LibraryVersion, Run, Step
from tests.ui_support import markdown_texts, run_app, switch, table_with

TRAIN_HINT = 'python -m core train --task "arithmetic word problems" --limit 4 --group-size 2 --epochs 1'
HOSTILE = "<script>alert(1)</script> then **bold** and [a link](http://example.com)"


@pytest.fixture
def engine(app_engine):
    """The app's database with the demo task (shadows the conftest engine on purpose)."""
    return app_engine


def import_text(engine, text: str) -> int:
    return import_library(engine, DEMO_TASK, text, "lib.md").id


def test_app_creates_the_demo_task_in_an_empty_database(empty_app_db):
    with db.session_scope(empty_app_db) as session:
        assert queries.list_tasks(session) == []
    at = run_app()

    with db.session_scope(empty_app_db) as session:
        assert [t.name for t in queries.list_tasks(session)] == [DEMO_TASK, SUPPORT_TASK, CONVERSATION_TASK, POLICY_TASK]
    assert table_with(at, "train samples")["name"].tolist() == [DEMO_TASK, SUPPORT_TASK, CONVERSATION_TASK, POLICY_TASK]
    assert any(label.startswith("Version #1 ") and "0 experiences" in label for label in (e.label for e in at.expander))


def test_overview_lists_the_demo_task_with_its_samples(engine):
    with db.session_scope(engine) as session:
        counts = queries.count_samples(session, get_task(session, DEMO_TASK).id)
    at = run_app()

    assert [t.value for t in at.title] == ["Overview"]
    tasks = table_with(at, "train samples")
    row = tasks[tasks["name"] == DEMO_TASK]
    assert len(row) == 1
    assert row.iloc[0]["reward method"] == "math"
    # python where the code jail works, else direct (core.records.tasks.demos.choose_demo_mode)
    assert row.iloc[0]["agent mode"] == ("python" if jail_status().available else "direct")
    assert row.iloc[0]["train samples"] == counts["train"] > 0
    assert row.iloc[0]["test samples"] == counts["test"] > 0
    sidebar = [c.value for c in at.sidebar.code]
    where = describe_url(os.environ["DATABASE_URL"])  # "sqlite file ui.db", "postgresql+psycopg on host:port"
    assert any(where in value for value in sidebar), sidebar


def test_library_version_shows_its_two_experiences(engine):
    version_id = import_text(engine, "- Check units first.\n- Re-read the question.")
    at = run_app()

    with db.session_scope(engine) as session:
        number = session.get(LibraryVersion, version_id).number
    assert number != version_id  # the demo tasks' libraries came first: the id is not the number
    tables = [df.value for df in at.dataframe if "size" in df.value.columns and "source" in df.value.columns
              and f"#{number}" in df.value["version"].tolist() and "import" in df.value["source"].tolist()]
    assert len(tables) == 1 and "id" not in tables[0].columns
    versions = tables[0]
    imported = versions[versions["version"] == f"#{number}"]
    assert len(imported) == 1
    assert imported.iloc[0]["size"] == 2
    assert imported.iloc[0]["source"] == "import"
    assert imported.iloc[0]["note"] == "imported from lib.md"
    assert versions[versions["source"] == "initial"].iloc[0]["size"] == 0

    labels = [e.label for e in at.expander]
    assert any(label.startswith(f"Version #{number} · 2 experiences") for label in labels), labels
    assert not any("(id " in label for label in labels), labels
    code = [c.value for c in at.code]
    assert any("Check units first." in value and "Re-read the question." in value for value in code), code


def test_no_runs_hint_then_runs_and_evaluations_tables(engine):
    at = run_app()
    assert any("No runs yet" in info.value for info in at.info)
    assert any(TRAIN_HINT in caption.value for caption in at.caption)  # the command is a small caption only
    assert at.button(key="overview_runs_quick_trial").label == "Start a quick trial"
    assert any("No evaluations yet" in info.value for info in at.info)
    assert not [df for df in at.dataframe if "steps" in df.value.columns]

    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=4))
    eval_id = create_evaluation(engine, DEMO_TASK, "empty", limit=3, k=2)
    at = run_app()

    assert not any("No runs yet" in info.value for info in at.info)
    assert "overview_runs_quick_trial" not in {b.key for b in at.button}
    runs = table_with(at, "steps")
    assert runs["id"].tolist() == [run_id]
    assert runs.iloc[0]["status"] == "queued"
    assert runs.iloc[0]["task"] == DEMO_TASK
    evaluations = table_with(at, "Mean@k")
    assert evaluations["id"].tolist() == [eval_id]
    assert evaluations.iloc[0]["version"] == "empty"
    assert evaluations.iloc[0]["k"] == 2
    assert evaluations.iloc[0]["errors"] == 0  # rollouts without a reward stand beside the figures


def test_runs_awaiting_review_or_failed_need_a_person(engine):
    at = run_app()
    assert [m.value for m in at.metric] == ["0", "0", "0"]
    assert any("Nothing waits" in s.value for s in at.success)

    review_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, limit=4))
    failed_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, limit=4, seed=1))  # not the first one's twin
    with db.session_scope(engine) as session:
        review, failed = session.get(Run, review_id), session.get(Run, failed_id)
        review.status, failed.status, failed.error = "awaiting_review", "failed", "learner returned no JSON"
        session.add_all([review, failed])
        step = Step(run_id=review_id, epoch=0, batch_index=0, sample_ids=[], status="awaiting_review")
        session.add(step)
    store_operations(engine, step, [], [ProposedOp("ADD", text="Write the units next to every number."),
                                        ProposedOp("ADD", text="Estimate the answer before computing it.")], [])
    at = run_app()

    assert [m.value for m in at.metric] == ["2", "0", "2"]
    attention = table_with(at, "pending operations").set_index("run")
    assert sorted(attention.index) == sorted([review_id, failed_id])
    assert attention.loc[review_id, "pending operations"] == 2
    assert attention.loc[failed_id, "status"] == "failed"
    assert attention.loc[failed_id, "error"] == "learner returned no JSON"
    assert not at.success


def test_model_written_text_is_shown_verbatim_never_as_markdown(engine):
    import_text(engine, f"- {HOSTILE}\n- Keep it short.")
    at = run_app()

    code = [c.value for c in at.code]
    assert any(HOSTILE in value for value in code), code
    for text in markdown_texts(at):
        assert "alert(1)" not in text and "bold" not in text, text


def test_a_stalled_run_shows_as_such_and_can_be_resumed(engine):
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, limit=4))
    with db.session_scope(engine) as session:
        run = session.get(Run, run_id)
        run.status, run.worker_id = "running", "dead-host:123"
        run.heartbeat_at = run.created_at - timedelta(minutes=10)
        session.add(run)
    at = run_app()

    attention = table_with(at, "pending operations").set_index("run")
    assert attention.loc[run_id, "status"] == "stalled"
    assert "worker stopped" in attention.loc[run_id, "what to do"]
    at.button(key=f"resume_{run_id}").click()
    at.run()
    assert not at.exception
    with db.session_scope(engine) as session:
        assert session.get(Run, run_id).status == "queued"
    assert table_with(at, "steps").set_index("id").loc[run_id, "status"] == "queued"


def test_rollouts_waiting_for_labels_are_on_the_to_do_list(app_engine):
    from tests.test_labeling import set_reward
    from tests.ui_support import seeded_run

    set_reward(app_engine, "human")
    run_id = seeded_run(app_engine, "auto")
    at = run_app()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Rollouts waiting for a label"] == "4"
    row = table_with(at, "what to do")
    assert row[row["run"] == run_id].iloc[0]["what to do"] == "label its rollouts"


IMAGE = "![x](http://127.0.0.1:9/pixel.png)"


def test_task_library_and_label_names_are_never_markdown(engine):
    """A name holding a Markdown image would make every visitor's browser fetch it."""
    from core.records.library.versions import set_label
    from core.records.tasks.lookup import ensure_library
    from core.records.tasks.task_io import TaskSettings, save_task

    name = f"Task {IMAGE}"
    save_task(engine, TaskSettings(name=name, instructions="Answer."), "cli")
    with db.session_scope(engine) as session:
        ensure_library(session, get_task(session, name), f"lib {IMAGE}", actor="cli")
    set_label(engine, name, "latest", f"label {IMAGE}", "cli")
    at = run_app()

    rendered = markdown_texts(at)
    assert not [text for text in rendered if "![x](" in text or "[x](" in text], rendered
    assert "Task !\\[x\\](http://127.0.0.1:9/pixel.png) · default" in [s.value for s in at.subheader]
    assert any("label !\\[x\\](http://127.0.0.1:9/pixel.png)" in e.label for e in at.expander)
    assert name in table_with(at, "train samples")["name"].tolist()  # a table cell is text, kept as typed


def test_a_first_visit_reads_what_this_is_and_three_steps(engine):
    at = run_app()
    assert "What this is" in [s.value for s in at.subheader]
    [intro] = [m.value for m in at.markdown if "frozen model" in m.value]
    assert "library of experiences" in intro and "review" in intro and "held-out queries" in intro
    steps = {b.key: b.label for b in at.button if b.key.startswith("overview_step_")}
    assert steps == {"overview_step_quick": "Quick trial", "overview_step_review": "Review",
                     "overview_step_evaluate": "Evaluate and compare"}


def test_quick_trial_opens_train_with_the_quick_preset_filled(engine):
    at = run_app()
    at.button(key="overview_step_quick").click()
    at.run()

    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Train"]
    assert "The settings below are the quick trial." in [c.value for c in at.caption]
    assert [at.number_input(key=key).value for key in ("train_limit", "train_group_size", "train_epochs")] == [4, 4, 1]
    assert at.radio(key="train_review_mode").value == "manual"
    assert at.checkbox(key="train_reference_when_all_fail").value is True
    assert at.session_state["task"] == POLICY_TASK  # the default model is the embedded one: the policies demo


def test_a_page_a_button_opened_keeps_the_asked_task_over_the_browsers_value_from_before_the_click(engine):
    """The switch's rerun can carry the sidebar's value from before the click, and a browser's widget value beats
    the session's: a first visit's Quick trial once opened Train on the first task (the arithmetic demo) instead
    of the shop demo (CI). The task and library asked for are kept until the page has drawn."""
    from ui.common import LIBRARY_KEY, OPEN_CONTEXT_KEY, TASK_KEY

    at = run_app()
    assert at.selectbox(key=TASK_KEY).value == DEMO_TASK  # a first visit: the first task
    at.session_state[OPEN_CONTEXT_KEY] = {TASK_KEY: POLICY_TASK, LIBRARY_KEY: "default"}  # as the button left it
    at.selectbox(key=TASK_KEY).set_value(DEMO_TASK)  # the browser's value from before the click
    switch(at, "pages/train.py")

    assert at.session_state[TASK_KEY] == POLICY_TASK and at.selectbox(key=TASK_KEY).value == POLICY_TASK
    assert OPEN_CONTEXT_KEY not in at.session_state  # taken: the sidebar is the person's again
    at.selectbox(key=TASK_KEY).set_value(SUPPORT_TASK).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state[TASK_KEY] == SUPPORT_TASK


def test_on_another_default_model_the_quick_trial_keeps_the_chosen_task(engine, monkeypatch):
    from core.settings import get_settings

    monkeypatch.setenv("TFGRPO_MODEL", "openai/gpt-4o-mini")
    get_settings.cache_clear()
    try:
        at = run_app(session_state={"task": SUPPORT_TASK})
        at.button(key="overview_step_quick").click()
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert [t.value for t in at.title] == ["Train"] and at.session_state["task"] == SUPPORT_TASK
        # the task's own models: a preset never replaces a model the task (or the person) chose (issue 37)
        with db.session_scope(engine) as session:
            task = queries.task_by_name(session, SUPPORT_TASK)
            session.expunge(task)
        assert task.policy_model != "openai/gpt-4o-mini"
        assert (at.session_state["train_policy_model"], at.session_state["train_learner_model"]) == \
            (task.policy_model, task.learner_model)
        assert "openai/gpt-4o-mini" in [c.value for c in at.sidebar.code]
    finally:
        get_settings.cache_clear()


@pytest.mark.parametrize(("button", "title"), [("overview_step_review", "Review"),
                                               ("overview_step_evaluate", "Evaluate")])
def test_the_other_steps_open_their_pages(engine, button, title):
    at = run_app()
    at.button(key=button).click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == [title]


# ---- the to-do list opens each row's own task, run and step (issue 25) ------------------------------------------


def run_awaiting_review(engine, task: str, library: str = "default") -> tuple[int, int]:
    """A run of `task` on `library` whose first step is applied and whose second waits with two operations."""
    run_id = create_run(engine, task, RunSettings(epochs=1, limit=4), library_name=library)
    with db.session_scope(engine) as session:
        run = session.get(Run, run_id)
        run.status = "awaiting_review"
        session.add(run)
        session.add(Step(run_id=run_id, epoch=0, batch_index=0, sample_ids=[], status="completed"))
        step = Step(run_id=run_id, epoch=0, batch_index=1, sample_ids=[], status="awaiting_review")
        session.add(step)
    store_operations(engine, step, [], [ProposedOp("ADD", text="Write the units next to every number."),
                                        ProposedOp("ADD", text="Estimate the answer before computing it.")], [])
    return run_id, step.id


def test_each_review_row_opens_its_own_task_library_run_and_step(engine):
    """The sidebar is on the demo task; the row of another task's run opens that task, its library, the run and
    the step that waits (the links opened the sidebar's task: a completed run of another task)."""
    from core.records.tasks.demos import ensure_demo_tasks
    from core.records.tasks.lookup import ensure_library
    from ui.common import LIBRARY_KEY, TASK_KEY

    ensure_demo_tasks(engine)
    with db.session_scope(engine) as session:
        ensure_library(session, get_task(session, SUPPORT_TASK), "tone", actor="cli")
    demo_run, _demo_step = run_awaiting_review(engine, DEMO_TASK)
    support_run, support_step = run_awaiting_review(engine, SUPPORT_TASK, "tone")
    at = run_app(session_state={TASK_KEY: DEMO_TASK})
    assert at.session_state[TASK_KEY] == DEMO_TASK
    button = at.button(key=f"todo_review_{support_run}")
    assert button.label == f"Review run {support_run} · {SUPPORT_TASK} · epoch 1 · batch 2"
    button.click().run()

    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Review"]
    assert (at.session_state[TASK_KEY], at.session_state[LIBRARY_KEY]) == (SUPPORT_TASK, "tone")
    assert at.selectbox(key="review_run").value == support_run
    assert at.selectbox(key="review_step").value == support_step
    assert (at.query_params["run"], at.query_params["step"]) == (str(support_run), str(support_step))
    assert demo_run not in at.selectbox(key="review_run").options


ARABIC_INDIC, SUPERSCRIPT = str.maketrans("0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669"), \
    str.maketrans("0123456789", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")


@pytest.mark.parametrize("digits", [ARABIC_INDIC, SUPERSCRIPT], ids=["arabic-indic", "superscript"])
def test_an_address_whose_id_is_not_ascii_digits_opens_the_page_on_its_own_choice(engine, digits):
    """An id in the address is the plain number the page wrote there. Other digits pass `isdigit`: "²" then broke
    `int`, so an edited or forged link crashed the page, and "٣" opened run 3."""
    older, _step = run_awaiting_review(engine, DEMO_TASK)
    run_awaiting_review(engine, DEMO_TASK)
    at = run_app("pages/review.py")
    own = at.selectbox(key="review_run").value
    assert own != older
    at.query_params["run"] = str(older).translate(digits)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="review_run").value == own


def test_labels_and_disputes_waiting_elsewhere_are_on_the_to_do_list_and_open_their_task(engine):
    """Rollouts waiting for a label and disputes waiting for a reviewer, per task, each row opening its task
    (Labeling said "Nothing waiting for you in this task" while they waited in another)."""
    from core.records.review.labeling import submit_label
    from core.records.tasks.demos import ensure_demo_tasks
    from tests.test_labeling import set_reward
    from tests.ui_support import seeded_run
    from ui.common import TASK_KEY

    ensure_demo_tasks(engine)
    set_reward(engine, "human", scale="1-5", labels_per_rollout=2)
    seeded_run(engine, "auto")
    with db.session_scope(engine) as session:
        demo = get_task(session, DEMO_TASK)
        waiting = queries.rollouts_to_label(session, demo.id, "alice")
        session.expunge_all()
    assert len(waiting) == 4
    for rollout in waiting[:2]:
        submit_label(engine, rollout.id, 1.0, "alice")
        submit_label(engine, rollout.id, 0.0, "bob")

    at = run_app(session_state={TASK_KEY: SUPPORT_TASK})
    todo = table_with(at, "disputes waiting for a reviewer")
    assert todo[["task", "rollouts waiting for a label", "disputes waiting for a reviewer"]].values.tolist() == [
        [DEMO_TASK, 2, 2]]
    assert at.button(key=f"todo_label_{demo.id}").label == f"Label 2 rollouts · {DEMO_TASK}"
    assert at.button(key=f"todo_disputes_{demo.id}").label == f"Settle 2 disputes · {DEMO_TASK}"

    at.button(key=f"todo_label_{demo.id}").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Labeling"] and at.session_state[TASK_KEY] == DEMO_TASK
    assert not [s for s in at.success if s.value.startswith("Nothing waiting for you")]
    assert any(c.value.startswith(f"Rollout {waiting[2].id} · ") for c in at.caption)

    at.switch_page("pages/overview.py")
    at.session_state[TASK_KEY] = SUPPORT_TASK
    at.run()
    at.button(key=f"todo_disputes_{demo.id}").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Labeling"] and at.session_state[TASK_KEY] == DEMO_TASK
    assert at.session_state["label_tab"] == "Agreement"
    assert table_with(at, "reward now")["rollout"].tolist() == [w.id for w in waiting[:2]]


def test_a_page_a_row_opened_shows_the_rows_run_and_step_when_the_address_did_not_arrive(engine):
    """st.switch_page sends the row's ?run= and ?step= to the browser and reruns after a fixed pause; on a busy
    machine the rerun came first and Review opened on its defaults (a browser test waited 90 s for ?run=). The
    address is kept in the session until the page has drawn, and the page's id selectboxes read it first."""
    from core.records.tasks.demos import ensure_demo_tasks
    from core.records.tasks.lookup import ensure_library
    from ui.common import LIBRARY_KEY, OPEN_ADDRESS_KEY, TASK_KEY

    ensure_demo_tasks(engine)
    with db.session_scope(engine) as session:
        ensure_library(session, get_task(session, SUPPORT_TASK), "tone", actor="cli")
    asked_run, asked_step = run_awaiting_review(engine, SUPPORT_TASK, "tone")
    newer_run, _newer_step = run_awaiting_review(engine, SUPPORT_TASK, "tone")  # what Review shows by default
    at = run_app(session_state={TASK_KEY: SUPPORT_TASK, LIBRARY_KEY: "tone"})
    at.session_state[OPEN_ADDRESS_KEY] = {"run": str(asked_run), "step": str(asked_step)}  # as the row left it
    switch(at, "pages/review.py")  # with no ?run= or ?step=: the address did not arrive

    assert f"Run {newer_run} · awaiting_review · 2 pending" == at.selectbox(key="review_run").options[0]
    assert at.selectbox(key="review_run").value == asked_run
    assert at.selectbox(key="review_step").value == asked_step
    assert (at.query_params["run"], at.query_params["step"]) == (str(asked_run), str(asked_step))
    assert OPEN_ADDRESS_KEY not in at.session_state  # taken: a later visit follows its own address
