"""UI tests of the Tasks page (Streamlit AppTest): settings, data, trying the reward and task files go through core.

AppTest cannot drive st.file_uploader, so data and task files are given through the paste boxes,
which feed the same core calls as an upload.
"""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session, func, select

from core.domain.rewards import METHODS, setting_keys
from core.records.people.users import add_user
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.task_io import TaskSettings, export_task_json, save_task
from storage import queries
from storage.tables import AuditEvent, Sample, Task
from tests.ui_support import markdown_texts, run_app, table_with
from ui.common import AUTH_KEY, REVIEWER_KEY, TASK_KEY, plain

PAGE = "pages/tasks.py"
HOSTILE = "<img src=x onerror=alert(1)> **bold**"


@pytest.fixture
def engine(app_engine):
    """The app's database with the demo task (shadows the conftest engine on purpose)."""
    return app_engine


def open_tasks(**state):
    at = run_app(page=PAGE, session_state={REVIEWER_KEY: "ann", **state})
    assert [t.value for t in at.title] == ["Tasks"]
    return at


def rerun(at):
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def click(at, key: str):
    at.button(key=key).click()
    return rerun(at)


def demo(engine) -> Task:
    with Session(engine) as session:
        return queries.task_by_name(session, DEMO_TASK)


def sample_count(engine) -> int:
    with Session(engine) as session:
        return session.exec(select(func.count()).select_from(Sample)).one()


def task_names(engine) -> list[str]:
    with Session(engine) as session:
        return [t.name for t in queries.list_tasks(session)]


def events(engine, action: str) -> list[AuditEvent]:
    with Session(engine) as session:
        return list(session.exec(select(AuditEvent).where(AuditEvent.action == action)))


def paste(at, text: str, fmt: str = "CSV"):
    at.radio(key="tasks_data_source").set_value("Paste text")
    rerun(at)
    at.radio(key="tasks_paste_format").set_value(fmt)
    at.text_area(key="tasks_paste").set_value(text)
    return rerun(at)


def codes(at) -> str:
    return "\n".join(c.value for c in at.code)


def test_changing_the_reward_method_to_contains_all_saves_it_with_an_audit_event(engine):
    task = demo(engine)
    prefix = f"task_{task.id}_"
    at = open_tasks()
    assert at.text_input(key=f"{prefix}name").value == DEMO_TASK
    at.selectbox(key=f"{prefix}reward_method").set_value("contains_all")
    rerun(at)
    at.text_area(key=f"{prefix}rs_phrases").set_value("sorry\n\n next step \n")
    at.checkbox(key=f"{prefix}rs_partial").check()
    click(at, "tasks_save")

    stored = demo(engine)
    assert stored.reward_method == "contains_all"
    assert stored.reward_settings == {"phrases": ["sorry", "next step"], "partial": True, "ignore_case": True}
    [event] = events(engine, "task.update")
    assert event.actor == "ann" and event.object_id == task.id
    assert event.before["reward_method"] == "math" and event.after["reward_method"] == "contains_all"
    assert [t.value for t in at.toast] == ["Task saved."]


def test_an_invalid_pattern_is_refused_with_its_reason_and_nothing_changes(engine):
    task = demo(engine)
    prefix = f"task_{task.id}_"
    at = open_tasks()
    at.selectbox(key=f"{prefix}reward_method").set_value("regex")
    rerun(at)
    at.text_input(key=f"{prefix}rs_pattern").set_value("(unclosed")
    click(at, "tasks_save")
    assert demo(engine).reward_method == "math"
    assert events(engine, "task.update") == []
    assert "Not saved; nothing was written." in [e.value for e in at.error]
    assert "pattern is not a valid regular expression" in codes(at)


def test_renaming_a_task_keeps_it_chosen_in_the_sidebar(engine):
    second = save_task(engine, TaskSettings(name="second", instructions="Be brief."), "cli")
    at = open_tasks(**{TASK_KEY: "second"})
    assert at.text_input(key=f"task_{second.id}_name").value == "second"
    at.text_input(key=f"task_{second.id}_name").set_value("second renamed")
    click(at, "tasks_save")
    with Session(engine) as session:
        assert session.get(Task, second.id).name == "second renamed"
    assert at.session_state[TASK_KEY] == "second renamed"
    assert at.selectbox(key=TASK_KEY).value == "second renamed"
    assert at.text_input(key=f"task_{second.id}_name").value == "second renamed"


def test_creating_a_new_task_selects_it(engine):
    at = open_tasks()
    at.toggle(key="tasks_new").set_value(True)
    rerun(at)
    at.text_input(key="task_new_name").set_value("support replies")
    at.text_area(key="task_new_instructions").set_value("Reply to the customer kindly.")
    at.selectbox(key="task_new_reward_method").set_value("judge_human")
    rerun(at)
    at.text_area(key="task_new_rs_criteria").set_value("Empathy; a next step is offered.")
    at.radio(key="task_new_rs_scale").set_value("1-5")
    at.number_input(key="task_new_rs_labels_per_rollout").set_value(2)
    at.slider(key="task_new_rs_spot_check_share").set_value(0.5)
    assert at.button(key="tasks_save").label == "Create task"
    click(at, "tasks_save")

    with Session(engine) as session:
        task = queries.task_by_name(session, "support replies")
        assert task is not None
        assert queries.library_by_name(session, task.id, "default") is not None
    assert task.instructions == "Reply to the customer kindly."
    assert task.reward_method == "judge_human"
    assert task.reward_settings == {"criteria": "Empathy; a next step is offered.", "scale": "1-5",
                                    "labels_per_rollout": 2, "spot_check_share": 0.5}
    assert task.policy_model == demo(engine).policy_model
    assert [e.object_id for e in events(engine, "task.create")][-1] == task.id
    assert at.session_state[TASK_KEY] == "support replies"
    assert at.toggle(key="tasks_new").value is False
    assert at.text_input(key=f"task_{task.id}_name").value == "support replies"


def test_creating_a_conversation_task_with_its_rubric(engine):
    at = open_tasks()
    at.toggle(key="tasks_new").set_value(True)
    rerun(at)
    at.radio(key="task_new_kind").set_value("conversation")
    rerun(at)
    assert at.selectbox(key="task_new_reward_method").value == "rubric"
    at.text_input(key="task_new_name").set_value("coaching chats")
    at.text_area(key="task_new_instructions").set_value("Coach the user kindly.")
    at.text_area(key="task_new_rs_rubric").set_value(
        '[{"name": "warmth", "scale": "1-5"}, {"name": "plan", "scale": "binary", "weight": 2}]')
    at.text_area(key="task_new_rs_rules").set_value("[oops")
    click(at, "tasks_save")
    assert "Not created; nothing was written." in [e.value for e in at.error]
    assert "rules is not valid JSON" in codes(at)
    at.text_area(key="task_new_rs_rules").set_value(
        '[{"name": "no diagnosis", "kind": "must_not", "check": "regex", "pattern": "you have depression"}]')
    click(at, "tasks_save")
    with Session(engine) as session:
        task = queries.task_by_name(session, "coaching chats")
    assert task is not None and task.kind == "conversation" and task.reward_method == "rubric"
    assert [c["name"] for c in task.reward_settings["rubric"]] == ["warmth", "plan"]
    assert task.reward_settings["rules"][0]["name"] == "no diagnosis"
    assert [e.after.get("kind") for e in events(engine, "task.create") if e.object_id == task.id] == ["conversation"]


def test_creating_a_task_with_a_taken_name_is_refused(engine):
    at = open_tasks()
    before = task_names(engine)
    at.toggle(key="tasks_new").set_value(True)
    rerun(at)
    at.text_input(key="task_new_name").set_value(DEMO_TASK)
    at.text_area(key="task_new_instructions").set_value("x")
    click(at, "tasks_save")
    assert task_names(engine) == before
    assert "Not created; nothing was written." in [e.value for e in at.error]
    assert "exists already" in codes(at)


def test_the_data_tab_counts_and_lists_the_samples(engine):
    at = open_tasks()
    assert [m.value for m in at.metric] == ["100", "100", "200"]
    table = table_with(at, "rubric")
    assert len(table) == 50 and list(table.columns) == ["id", "split", "query", "reference", "rubric"]


def test_a_pasted_dataset_with_a_bad_row_names_the_row_and_writes_nothing(engine):
    at = open_tasks()
    before = sample_count(engine)
    at = paste(at, f"id,query,answer\nn1,{HOSTILE},4\nn2,,5\n")
    assert at.selectbox(key=next(s.key for s in at.selectbox if s.key.endswith("_query"))).value == "query"
    click(at, "tasks_check")
    assert "This file cannot be added (row 2); nothing was written. The problem:" in [e.value for e in at.error]
    assert "pasted.csv: data row 2: query ('query') is missing or empty" in codes(at)
    assert not [b for b in at.button if b.key == "tasks_add"]
    assert sample_count(engine) == before


def test_a_good_paste_is_previewed_then_added(engine):
    at = open_tasks()
    before = sample_count(engine)
    text = "\n".join(json.dumps(r) for r in [
        {"Question": HOSTILE, "key": "s1", "criteria": "be kind", "topic": "billing"},
        {"Question": "Where is my parcel?", "key": "s2", "criteria": "offer tracking", "topic": "shipping"},
    ])
    at = paste(at, text, "JSONL")
    query_key = next(s.key for s in at.selectbox if s.key.endswith("_query"))
    at.selectbox(key=query_key).set_value("Question")
    at.selectbox(key=query_key.replace("_query", "_id")).set_value("key")
    at.radio(key="tasks_default_split").set_value("test")
    rerun(at)
    assert at.selectbox(key=query_key.replace("_query", "_rubric")).value == "criteria"
    click(at, "tasks_check")
    assert "2 rows OK: test 2" in [s.value for s in at.success]  # 20% of 2 rounds to none held out
    preview = table_with(at, "meta")
    assert preview["query"].tolist() == [HOSTILE, "Where is my parcel?"]
    assert preview["split"].tolist() == ["test", "test"]
    assert sample_count(engine) == before

    click(at, "tasks_add")
    assert "Added 2 samples (0 already present)." in [s.value for s in at.success]
    assert sample_count(engine) == before + 2
    with Session(engine) as session:
        rows = {s.external_id: s for s in queries.samples(session, demo(engine).id, split="test")}
    assert rows["s1"].query == HOSTILE and rows["s1"].rubric == "be kind" and rows["s1"].meta == {"topic": "billing"}
    assert [e.after["added"] for e in events(engine, "task.add_data")] == [2]
    assert [m.value for m in at.metric] == ["100", "102", "202"]
    assert not any(HOSTILE in text for text in markdown_texts(at))


def test_metadata_columns_can_be_chosen(engine):
    at = paste(open_tasks(), "id,query,topic,internal\nm1,hello,billing,secret\n")
    meta_key = next(m.key for m in at.multiselect if m.key.endswith("_meta"))
    at.multiselect(key=meta_key).set_value(["topic"])
    rerun(at)
    click(at, "tasks_check")
    click(at, "tasks_add")
    with Session(engine) as session:
        [row] = [s for s in queries.samples(session, demo(engine).id) if s.external_id == "m1"]
    assert row.meta == {"topic": "billing"}


def test_an_exported_task_imports_under_a_new_name(engine):
    with Session(engine) as session:
        text = export_task_json(session, queries.task_by_name(session, DEMO_TASK))
    at = open_tasks()
    before = task_names(engine)
    assert at.get("download_button")[0].proto.label == "Download task file"
    at.text_area(key="tasks_import_text").set_value(text)
    click(at, "tasks_import")
    assert "The task was not imported; nothing was written." in [e.value for e in at.error]
    assert "exists already; import it under another name" in codes(at)
    assert task_names(engine) == before

    at.text_input(key="tasks_import_name").set_value("arithmetic copy")
    click(at, "tasks_import")
    with Session(engine) as session:
        copy = queries.task_by_name(session, "arithmetic copy")
        assert copy is not None
        assert queries.count_samples(session, copy.id) == {"train": 100, "test": 100}
    assert "Imported a task with 200 samples; it is now the sidebar's task." in [s.value for s in at.success]
    assert at.session_state[TASK_KEY] == "arithmetic copy"
    assert [e.actor for e in events(engine, "task.import")] == ["ann"]


def test_a_labeller_sees_settings_and_data_but_no_controls(engine):
    add_user(engine, "boss", "admin", "password1", actor="cli")
    add_user(engine, "lab", "labeler", "password1", actor="cli")
    at = open_tasks(**{AUTH_KEY: "lab", REVIEWER_KEY: "lab"})
    keys = {b.key for b in at.button}
    assert not keys & {"tasks_save", "tasks_check", "tasks_add", "tasks_import"}
    assert not [r for r in at.radio if r.key == "tasks_data_source"]
    assert not [t for t in at.text_area if t.key == "tasks_import_text"]
    assert not [t for t in at.text_input if t.key.startswith("task_")]
    notes = [i.value for i in at.info]
    assert any("Editing tasks needs the admin role" in n for n in notes)
    assert any("Adding data to a task needs the admin role" in n for n in notes)
    assert any("Importing tasks needs the admin role" in n for n in notes)
    assert table_with(at, "setting")["value"].tolist()[0] == DEMO_TASK
    assert [m.value for m in at.metric] == ["100", "100", "200"]


@pytest.mark.parametrize("method", ["math", "exact", "contains", "numeric", "regex", "contains_all", "judge", "human",
                                    "judge_human"])
def test_every_reward_method_saves_with_its_default_fields(engine, method):
    task = demo(engine)
    prefix = f"task_{task.id}_"
    at = open_tasks()
    at.selectbox(key=f"{prefix}reward_method").set_value(method)
    rerun(at)
    click(at, "tasks_save")
    assert not at.error, [e.value for e in at.error]
    stored = demo(engine)
    assert stored.reward_method == method
    assert set(stored.reward_settings) <= set(setting_keys(method))


def test_a_question_answer_paste_is_mapped_by_cores_rule_and_says_so(engine):
    at = paste(open_tasks(), "question,answer,target\nWhat is 6 times 7?,42,x\n")
    selected = {s.key.rsplit("_", 1)[1]: s.value for s in at.selectbox if s.key.startswith("tasks_map_")}
    assert (selected["query"], selected["reference"]) == ("question", "answer")  # the CLI's rule
    click(at, "tasks_check")
    assert "1 rows OK: train 1" in [s.value for s in at.success]
    assert "Columns: mapped question→query, answer→reference." in [c.value for c in at.caption]
    assert table_with(at, "meta")["meta"].tolist() == ['{"target": "x"}']


def duplicates_said(at) -> list[str]:
    """The lines of the one code block that names rows left out as duplicates."""
    [text] = [c.value for c in at.code if "is the same as" in c.value]
    return text.splitlines()


def test_rows_without_ids_are_known_by_content_and_the_page_names_each_repeat_as_the_cli_does(engine):
    at = paste(open_tasks(), "query,answer\nWhat is 2+2?,4\nWhat is 3+3?,6\nWhat is 2+2?,4\n")
    before = sample_count(engine)
    click(at, "tasks_check")
    assert "2 rows OK: train 2" in [s.value for s in at.success]
    assert duplicates_said(at) == ["data row 3 is the same as data row 1"]
    click(at, "tasks_add")
    assert "Added 2 samples (1 already present)." in [s.value for s in at.success]
    assert duplicates_said(at) == ["data row 3 is the same as data row 1"]
    assert sample_count(engine) == before + 2
    with Session(engine) as session:
        ids = {s.query: s.external_id for s in queries.samples(session, demo(engine).id)}
    click(at, "tasks_check")
    click(at, "tasks_add")
    assert "Added 0 samples (3 already present)." in [s.value for s in at.success]
    assert duplicates_said(at) == [f"data row 1 is the same as sample {ids['What is 2+2?']} already stored",
                                   f"data row 2 is the same as sample {ids['What is 3+3?']} already stored",
                                   "data row 3 is the same as data row 1"]
    assert sample_count(engine) == before + 2


def test_a_deeply_nested_paste_is_refused_in_one_line(engine):
    at = open_tasks()  # the first run adds the second demo task
    before = sample_count(engine)
    at = paste(at, '{"query": "fine"}\n' + "[" * 100_000, "JSONL")
    click(at, "tasks_check")
    assert "This file cannot be added (row 2); nothing was written. The problem:" in [e.value for e in at.error]
    assert "pasted.jsonl: line 2 is nested more than 100 levels deep" in codes(at).splitlines()
    assert sample_count(engine) == before


def test_a_deeply_nested_task_file_is_refused_in_one_line(engine):
    at = open_tasks()
    before = task_names(engine)
    at.text_area(key="tasks_import_text").set_value("[" * 100_000)
    click(at, "tasks_import")
    assert "The task was not imported; nothing was written." in [e.value for e in at.error]
    assert "the task file is nested more than 100 levels deep" in codes(at).splitlines()
    assert task_names(engine) == before


def test_python_mode_warns_when_this_machine_has_no_code_jail(engine, monkeypatch):
    from core.domain import sandbox

    monkeypatch.setattr(sandbox, "BWRAP_PATH", "/nonexistent/bwrap")
    task = demo(engine)
    prefix = f"task_{task.id}_"
    at = open_tasks()
    at.selectbox(key=f"{prefix}agent_mode").set_value("direct")  # the demo is python where the jail works
    rerun(at)
    assert not [w for w in at.warning if "python mode" in w.value]
    at.selectbox(key=f"{prefix}agent_mode").set_value("python")
    rerun(at)
    [warning] = [w.value for w in at.warning if "python mode" in w.value]
    assert "bubblewrap" in warning


# ---- hold-out shares on upload (issue 14) ---------------------------------------------------------------


def split_counts(engine) -> dict[str, int]:
    with Session(engine) as session:
        return queries.count_samples(session, demo(engine).id)


def test_the_hold_out_shares_are_previewed_per_split_then_used_when_adding(engine):
    at = open_tasks()
    rows = "".join(f"h{i},Question {i}?,\n" for i in range(10)) + "h10,Kept for training?,train\n"
    at = paste(at, "id,query,split\n" + rows)
    assert (at.number_input(key="tasks_hold_test").value, at.number_input(key="tasks_hold_validation").value) == (
        20, 0)
    click(at, "tasks_check")
    assert "11 rows OK: train 9 · test 2" in [s.value for s in at.success]

    at.number_input(key="tasks_hold_test").set_value(30)
    at.number_input(key="tasks_hold_validation").set_value(10)
    rerun(at)
    assert not [b for b in at.button if b.key == "tasks_add"]  # changed shares: check again before adding
    click(at, "tasks_check")
    assert "11 rows OK: train 7 · validation 1 · test 3" in [s.value for s in at.success]
    preview = table_with(at, "meta")
    assert preview.set_index("id")["split"]["h10"] == "train"  # a row that names its split keeps it
    before = split_counts(engine)
    click(at, "tasks_add")
    after = split_counts(engine)
    assert {split: after.get(split, 0) - before.get(split, 0) for split in after} == {
        "train": 7, "validation": 1, "test": 3}
    assert [m.value for m in at.metric] == ["107", "1", "103", "211"]  # train, validation, test, all


def test_shares_adding_up_to_more_than_all_rows_are_refused_and_nothing_is_written(engine):
    at = paste(open_tasks(), "id,query\nz1,Hello?\n")
    at.number_input(key="tasks_hold_test").set_value(60)
    at.number_input(key="tasks_hold_validation").set_value(50)
    before = sample_count(engine)
    click(at, "tasks_check")
    assert "This file cannot be added; nothing was written. The problem:" in [e.value for e in at.error]
    assert "the test and validation shares add up to 1.1" in codes(at)
    assert not [b for b in at.button if b.key == "tasks_add"] and sample_count(engine) == before


# ---- test the reward (issue 14) -------------------------------------------------------------------------


def with_method(engine, method: str, settings: dict | None = None) -> Task:
    task = demo(engine)
    save_task(engine, TaskSettings.from_task(task).model_copy(update={
        "reward_method": method, "reward_settings": settings or {}}), "cli", original_name=task.name)
    return demo(engine)


def score_it(at, answer: str, reference: str | None = None):
    if reference is not None:
        at.text_input(key="tasks_try_reference").set_value(reference)
    at.text_area(key="tasks_try_answer").set_value(answer)
    return click(at, "tasks_try_score")


def tried(at) -> tuple[str, str]:
    found = {m.label: m.value for m in at.metric if m.label in ("Reward", "Source")}
    return found["Reward"], found["Source"]


def test_the_reward_box_scores_a_typed_reference_with_the_reason_as_code(engine):
    with_method(engine, "contains")
    at = open_tasks()
    captions = [c.value for c in at.caption]
    assert plain(f"The task's saved reward method, contains: {METHODS['contains'].description}") in captions
    assert "What it reads: The whole response." in captions
    at = score_it(at, "The capital of France is Paris.", "Paris")
    assert tried(at) == ("1", "verifier")
    assert "found 'paris' as whole words" in codes(at).splitlines()

    at = score_it(at, f"The Parisian view {HOSTILE}")
    assert tried(at) == ("0", "verifier")
    assert "'paris' not found as whole words (it occurs only inside other words)" in codes(at).splitlines()
    assert not any(HOSTILE in text for text in markdown_texts(at))
    at.text_area(key="tasks_try_answer").set_value("Lyon")
    rerun(at)
    assert not [m for m in at.metric if m.label == "Reward"]  # an old result never stands beside a new answer


def test_the_reward_box_scores_against_a_chosen_sample_as_a_run_would(engine):
    task = with_method(engine, "exact")
    with Session(engine) as session:
        sample = queries.samples(session, task.id, limit=1)[0]
    at = open_tasks()
    reads = [c.value for c in at.caption if c.value.startswith("What it reads")]
    assert reads == [plain(f"What it reads: {METHODS['exact'].reads}")]
    at.selectbox(key=f"tasks_try_sample_{task.id}").set_value(sample.external_id)
    rerun(at)
    assert not [t for t in at.text_input if t.key == "tasks_try_reference"]
    assert sample.query in codes(at) and sample.reference in codes(at).splitlines()
    at = score_it(at, f"So the result is \\boxed{{{sample.reference}}}.")
    assert tried(at) == ("1", "verifier")
    assert f"correct: expected {sample.reference}, got {sample.reference}" in codes(at).splitlines()
    at = score_it(at, "The capital of France is Paris.")
    assert tried(at) == ("0", "verifier")
    assert "no answer found in response" in codes(at)


def test_the_reward_box_shows_a_missing_reference_as_the_runs_error_reward(engine):
    with_method(engine, "exact")
    at = score_it(open_tasks(), "Answer: 4", "")
    assert tried(at) == ("0", "error")
    assert "reward method 'exact' needs a reference answer" in codes(at).splitlines()


@pytest.mark.parametrize(("method", "who"), [("human", "people, in the labeling queue"),
                                             ("judge", "the judge model")])
def test_a_reward_a_person_or_the_judge_gives_is_not_tried(engine, method, who):
    with_method(engine, method)
    at = open_tasks()
    assert plain(f"This reward is given by {who}; it cannot be tried here.") in [i.value for i in at.info]
    assert not [b for b in at.button if b.key == "tasks_try_score"]
    assert not [t for t in at.text_area if t.key == "tasks_try_answer"]


def test_a_labeller_may_try_the_reward_too(engine):
    with_method(engine, "contains")
    add_user(engine, "boss", "admin", "password1", actor="cli")
    add_user(engine, "lab", "labeler", "password1", actor="cli")
    at = score_it(open_tasks(**{AUTH_KEY: "lab", REVIEWER_KEY: "lab"}), "It is Paris.", "paris")
    assert tried(at) == ("1", "verifier")


# --- personas (conversation tasks) ----------------------------------------------------------------


def conversation_task(engine) -> Task:
    from core.records.tasks.demos import CONVERSATION_TASK, ensure_conversation_task

    ensure_conversation_task(engine)
    with Session(engine) as session:
        return queries.task_by_name(session, CONVERSATION_TASK)


def stored_personas(engine, task: Task) -> list:
    from core.records.tasks.task_io import task_personas

    with Session(engine) as session:
        return task_personas(session, task.id)


def persona_table(at):
    """The personas table (the editor below it has no splits column)."""
    return table_with(at, "splits")


def persona_editor(at):
    [editor] = [df for df in at.data_editor if df.key and df.key.startswith("tasks_personas_editor_")]
    return editor


def splits_of(engine, task: Task) -> dict[str, set[str]]:
    """Each persona's splits, from the stored scenarios."""
    found: dict[str, set[str]] = {}
    with Session(engine) as session:
        for sample in queries.samples(session, task.id):
            found.setdefault(sample.meta["persona"], set()).add(sample.split)
    return found


def test_a_conversation_task_lists_its_personas_with_their_splits(engine):
    task = conversation_task(engine)
    at = open_tasks(**{TASK_KEY: task.name})
    assert "Personas" in [t.label for t in at.tabs]
    shown = persona_table(at)
    personas = stored_personas(engine, task)
    assert shown["name"].tolist() == [p.name for p in personas]
    assert shown["segment"].tolist() == [p.segment for p in personas]
    assert shown["hidden facts"].tolist() == ["; ".join(p.hidden_facts) for p in personas]
    splits = splits_of(engine, task)
    for _, row in shown.iterrows():
        held = splits[row["name"]] == {"test"}
        assert row["splits"] == ("test 3" if held else "train 3")
    held_out = at.multiselect(key=f"tasks_held_out_{task.id}")
    assert sorted(held_out.value) == sorted(name for name, s in splits.items() if s == {"test"})
    assert at.get("download_button")  # the personas as JSON
    assert [e.value for e in at.error] == []


def test_a_single_task_has_no_personas_tab(engine):
    at = open_tasks()
    assert "Personas" not in [t.label for t in at.tabs]


def test_editing_a_persona_in_the_table_saves_it_through_core(engine):
    task = conversation_task(engine)
    before = stored_personas(engine, task)
    at = open_tasks(**{TASK_KEY: task.name})
    editor = persona_editor(at)
    assert editor.value["name"].tolist() == [p.name for p in before]
    at.session_state[editor.key] = {
        "edited_rows": {0: {"segment": "sceptic", "hidden facts": "order NW-11111; bought in May"}},
        "added_rows": [{"name": "Noor, the new one", "segment": "rushed", "description": "Types in fragments.",
                        "hidden facts": ""}],
        "deleted_rows": [1]}
    click(at, "tasks_personas_save")

    after = stored_personas(engine, task)
    assert [p.name for p in after] == [before[0].name, *[p.name for p in before[2:]], "Noor, the new one"]
    assert (after[0].segment, after[0].hidden_facts) == ("sceptic", ["order NW-11111", "bought in May"])
    assert after[-1].hidden_facts == [] and after[-1].description == "Types in fragments."
    [event] = events(engine, "task.personas")
    assert event.actor == "ann" and event.object_id == task.id
    assert f"Saved: the task has {len(after)} personas." in [s.value for s in at.success]
    assert persona_editor(at).value["name"].tolist() == [p.name for p in after]  # a fresh table of what is stored
    assert persona_table(at)["segment"].tolist()[0] == "sceptic"


def test_a_bad_persona_edit_is_refused_with_the_reason_and_nothing_changes(engine):
    task = conversation_task(engine)
    before = stored_personas(engine, task)
    at = open_tasks(**{TASK_KEY: task.name})
    editor = persona_editor(at)
    at.session_state[editor.key] = {"edited_rows": {2: {"segment": "Very Angry!", "name": before[0].name}},
                                    "added_rows": [], "deleted_rows": []}
    click(at, "tasks_personas_save")

    assert stored_personas(engine, task) == before
    assert events(engine, "task.personas") == []
    assert "The personas were not saved; nothing was written." in [e.value for e in at.error]
    assert "the personas: item 3:" in codes(at)


def test_split_by_persona_moves_the_held_out_personas_scenarios_to_test(engine):
    task = conversation_task(engine)
    splits = splits_of(engine, task)
    trained = sorted(name for name, s in splits.items() if s == {"train"})
    chosen = trained[:2]
    at = open_tasks(**{TASK_KEY: task.name})
    at.multiselect(key=f"tasks_held_out_{task.id}").set_value(chosen)
    click(at, "tasks_split_by_persona")

    after = splits_of(engine, task)
    assert {name for name, s in after.items() if s == {"test"}} == set(chosen)
    assert all(s == {"train"} for name, s in after.items() if name not in chosen)
    with Session(engine) as session:
        assert queries.count_samples(session, task.id) == {"train": 30, "test": 6}
    assert "Scenarios per split now: train 30, validation 0, test 6." in [s.value for s in at.success]
    [event] = events(engine, "task.split_by_persona")
    assert event.actor == "ann" and sorted(event.after["test_personas"]) == sorted(chosen)
    assert sorted(at.multiselect(key=f"tasks_held_out_{task.id}").value) == sorted(chosen)


def test_a_labeller_sees_the_personas_but_cannot_edit_them(engine):
    add_user(engine, "boss", "admin", "password1", actor="cli")
    add_user(engine, "lab", "labeler", "password1", actor="cli")
    task = conversation_task(engine)
    at = open_tasks(**{TASK_KEY: task.name, AUTH_KEY: "lab", REVIEWER_KEY: "lab"})
    assert len(persona_table(at)) == len(stored_personas(engine, task))
    assert not at.data_editor and not at.multiselect
    assert any("Editing personas needs the admin role" in i.value for i in at.info)


def test_a_conversation_tasks_turn_limit_is_edited_and_a_single_tasks_is_kept(engine):
    task = conversation_task(engine)
    at = open_tasks(**{TASK_KEY: task.name, f"task_{task.id}_simulator_model": "local/other"})  # a typed name
    assert any(c.value.startswith("A conversation task:") for c in at.caption)
    at.number_input(key=f"task_{task.id}_max_turns").set_value(6)
    click(at, "tasks_save")
    with Session(engine) as session:
        stored = queries.task_by_name(session, task.name)
    assert (stored.max_turns, stored.simulator_model, stored.kind) == (6, "local/other", "conversation")

    with Session(engine) as session:  # test setup: a single task whose stored turn limit is not the default
        single = queries.task_by_name(session, DEMO_TASK)
        single.max_turns = 7
        session.add(single)
        session.commit()
        single_id = single.id
    at = open_tasks(**{TASK_KEY: DEMO_TASK})
    assert not [n for n in at.number_input if n.key == f"task_{single_id}_max_turns"]
    at.text_input(key=f"task_{single_id}_description").set_value("changed")
    click(at, "tasks_save")
    assert (demo(engine).description, demo(engine).max_turns) == ("changed", 7)


def test_the_library_wording_is_edited_on_the_form_and_an_empty_box_is_the_default(engine):
    """Issue 36, item 3: the header above the library and the examples' intro are task settings; the arithmetic
    demo shows the paper's wording, and emptying a box saves None (the neutral default, the box's placeholder)."""
    from core.domain.prompts import EXAMPLES_INTRO, LIBRARY_HEADER, PAPER_WORDING

    task = demo(engine)
    prefix = f"task_{task.id}_"
    at = open_tasks()
    header, intro = at.text_input(key=f"{prefix}library_header"), at.text_input(key=f"{prefix}examples_intro")
    assert (header.value, intro.value) == (PAPER_WORDING.header, PAPER_WORDING.examples_intro)
    assert (header.placeholder, intro.placeholder) == (LIBRARY_HEADER, EXAMPLES_INTRO)
    header.set_value("Notes from earlier answers:")
    intro.set_value("")
    click(at, "tasks_save")
    stored = demo(engine)
    assert (stored.library_header, stored.examples_intro) == ("Notes from earlier answers:", None)
    [event] = events(engine, "task.update")
    assert event.before["library_header"] == PAPER_WORDING.header
    assert event.after["library_header"] == "Notes from earlier answers:" and event.after["examples_intro"] is None

    add_user(engine, "boss", "admin", "password1", actor="cli")
    add_user(engine, "lab", "labeler", "password1", actor="cli")
    at = open_tasks(**{AUTH_KEY: "lab", REVIEWER_KEY: "lab"})
    assert "Notes from earlier answers:" in codes(at) and EXAMPLES_INTRO in codes(at)
    assert "Worked examples' intro (the default)" in [c.value for c in at.caption]
