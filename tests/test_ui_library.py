"""UI tests of the library page (Streamlit AppTest), each on its own SQLite file seeded through core."""

from __future__ import annotations

import json

import pytest

from core.domain.library import ProposedOp
from core.domain.prompts import PAPER_WORDING
from core.records.library.versions import edit_library, import_library
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.lookup import get_task
from pages import library as page
from storage import db, queries
from storage.tables import LibraryVersion
from tests.ui_support import markdown_texts, run_app, seeded_run, table_with
from ui.common import REVIEWER_KEY, Context

PAGE = "pages/library.py"
REVIEWER = "alice"
HOSTILE = "<script>alert(1)</script> **bold** [x](http://e.com)"
UNITS = "Write the unit next to every number you compute."
REREAD = "Re-read the question to find which quantity it asks for."
ESTIMATE = "Estimate the answer roughly before computing it exactly."


@pytest.fixture
def engine(app_engine):
    """The app's database with the demo task (shadows the conftest engine on purpose)."""
    return app_engine


def number_of(engine, version_id: int) -> int:
    """A version's number in its library, the name the page shows."""
    with db.session_scope(engine) as session:
        return session.get(LibraryVersion, version_id).number


def import_texts(engine, *texts: str) -> int:
    body = "\n".join(f"- {text}" for text in texts)
    return import_library(engine, DEMO_TASK, body, "lib.md", actor="bob").id


def modify(engine, exp_id: str, text: str) -> int:
    return edit_library(engine, DEMO_TASK, [ProposedOp("MODIFY", [exp_id], text)], "bob").id


def stored_versions(engine) -> list:
    with db.session_scope(engine) as session:
        library = queries.library_by_name(session, get_task(session, DEMO_TASK).id, "default")
        return queries.versions(session, library.id)


def open_page() -> object:
    return run_app(page=PAGE, session_state={REVIEWER_KEY: REVIEWER})


def rerun(at):
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def codes(at) -> list[str]:
    return [c.value for c in at.code]


def test_versions_table_lists_initial_imported_and_run_versions(engine):
    at = open_page()
    assert [t.value for t in at.title] == ["Library"]
    assert any("Version #1 is empty" in c.value for c in at.caption)

    imported_id = import_texts(engine, UNITS, ESTIMATE)  # the scripted learner then ADDs REREAD
    run_id = seeded_run(engine, review_mode="auto")
    at = open_page()

    versions = table_with(at, "created by").set_index("version")
    assert "id" not in versions.columns  # a version is named by its number, never by its database id
    assert versions.loc["#1", "source"] == "initial"
    assert versions.loc["#1", "parent"] == "—"  # no parent: a dash, never None (ui.display.shown_missing)
    assert number_of(engine, imported_id) == 2
    assert versions.loc["#2", "source"] == "import"
    assert versions.loc["#2", "parent"] == "#1"
    assert versions.loc["#2", "created by"] == "bob"
    assert versions.loc["#2", "size"] == 2
    assert versions.loc["#2", "note"] == "imported from lib.md"
    run_rows = versions[versions["source"] == "run"]
    assert len(run_rows) >= 1
    assert run_rows.iloc[0]["created by"] == f"run {run_id} · step 0/0"
    # The text of the newest version is shown; the imported one can be chosen.
    at.selectbox(key="lib_text_version").select(imported_id)
    rerun(at)
    assert f"[E1] {UNITS}\n[E2] {ESTIMATE}" in codes(at), codes(at)


def test_add_creates_a_manual_version_by_the_reviewer(engine):
    import_texts(engine, UNITS)
    at = open_page()
    at.text_area(key="lib_add_text").input(ESTIMATE)
    at.button(key="lib_add_submit").click()
    rerun(at)

    latest = stored_versions(engine)[-1]
    assert latest.number == 3
    assert latest.source == "manual"
    assert latest.created_by == REVIEWER
    assert [exp["text"] for exp in latest.experiences] == [UNITS, ESTIMATE]
    assert any("Created version #3" in s.value for s in at.success)
    assert at.text_area(key="lib_add_text").value == ""
    assert table_with(at, "created by")["version"].tolist() == ["#3", "#2", "#1"]


@pytest.mark.parametrize(("text", "reason"), [(UNITS.upper(), "duplicates an existing experience"),
                                              ("ok", "too short")])
def test_add_rejected_text_shows_the_reason_and_creates_nothing(engine, text, reason):
    import_texts(engine, UNITS)
    at = open_page()
    at.text_area(key="lib_add_text").input(text)
    at.button(key="lib_add_submit").click()
    rerun(at)

    assert [v.number for v in stored_versions(engine)] == [1, 2]
    assert any(reason in e.value for e in at.error), [e.value for e in at.error]
    assert not at.success


def test_edit_delete_and_merge_produce_the_expected_experiences(engine):
    import_texts(engine, UNITS, REREAD, ESTIMATE)  # E1, E2, E3
    at = open_page()

    at.selectbox(key="lib_edit_id").select("E2")
    rerun(at)
    assert at.text_area(key="lib_edit_text_E2").value == REREAD
    at.text_area(key="lib_edit_text_E2").input("Re-read the question and underline what it asks for.")
    at.button(key="lib_edit_submit").click()
    rerun(at)
    latest = stored_versions(engine)[-1]
    assert latest.source == "manual" and latest.created_by == REVIEWER
    assert latest.experiences == [{"id": "E1", "text": UNITS},
                                  {"id": "E2", "text": "Re-read the question and underline what it asks for."},
                                  {"id": "E3", "text": ESTIMATE}]

    at.multiselect(key="lib_delete_ids").select("E1")
    at.button(key="lib_delete_submit").click()
    rerun(at)
    assert [exp["id"] for exp in stored_versions(engine)[-1].experiences] == ["E2", "E3"]

    merged = "Re-read the question, then estimate the answer before computing it."
    at.multiselect(key="lib_merge_ids").select("E2").select("E3")
    at.text_area(key="lib_merge_text").input(merged)
    at.button(key="lib_merge_submit").click()
    rerun(at)
    versions = stored_versions(engine)
    assert versions[-1].experiences == [{"id": "E4", "text": merged}]
    assert [v.number for v in versions] == [1, 2, 3, 4, 5]
    assert not at.error


def test_merge_of_one_id_is_rejected(engine):
    import_texts(engine, UNITS, REREAD)
    at = open_page()
    at.multiselect(key="lib_merge_ids").select("E1")
    at.text_area(key="lib_merge_text").input("Write units and re-read the question every time.")
    at.button(key="lib_merge_submit").click()
    rerun(at)
    assert any("MERGE" in e.value for e in at.error), [e.value for e in at.error]
    assert len(stored_versions(engine)) == 2


def test_diff_between_versions(engine):
    imported_id = import_texts(engine, UNITS, REREAD)
    changed = "Write the unit next to every number, also in the final answer."
    latest_id = modify(engine, "E1", changed)
    at = open_page()

    # Default: the latest version's parent -> the latest version.
    assert at.selectbox(key="lib_diff_from").value == imported_id
    assert at.selectbox(key="lib_diff_to").value == latest_id
    diff = table_with(at, "change")
    assert diff[["change", "id", "before", "after"]].values.tolist() == [["changed", "E1", UNITS, changed]]
    unified = [c for c in at.code if c.language == "diff"]
    assert len(unified) == 1
    assert f"-[E1] {UNITS}" in unified[0].value and f"+[E1] {changed}" in unified[0].value

    initial_id = stored_versions(engine)[0].id
    at.selectbox(key="lib_diff_from").select(initial_id)
    rerun(at)
    diff = table_with(at, "change")
    assert diff["change"].tolist() == ["added", "added"]
    assert diff["id"].tolist() == ["E1", "E2"]

    at.selectbox(key="lib_diff_from").select(latest_id)
    rerun(at)
    assert not [df for df in at.dataframe if "change" in df.value.columns]
    assert any("No differences" in i.value for i in at.info)


def test_revert_creates_a_new_version_with_the_old_content(engine):
    imported_id = import_texts(engine, UNITS, REREAD)
    edited_id = modify(engine, "E2", "Re-read the question and underline what it asks for.")
    at = open_page()
    at.selectbox(key="lib_revert_version").select(imported_id)
    at.button(key="lib_revert_button").click()
    rerun(at)

    versions = stored_versions(engine)
    old, new = next(v for v in versions if v.id == imported_id), versions[-1]
    assert new.number == 4
    assert new.source == "revert"
    assert new.created_by == REVIEWER
    assert new.parent_id == edited_id
    assert new.experiences == old.experiences
    assert table_with(at, "created by")["version"].tolist() == ["#4", "#3", "#2", "#1"]


def test_move_label_points_production_at_the_chosen_version(engine):
    imported_id = import_texts(engine, UNITS)
    latest_id = modify(engine, "E1", "Write the unit next to every number, also in the final answer.")
    at = open_page()
    assert at.text_input(key="lib_label_name").value == "production"
    at.selectbox(key="lib_label_version").select(imported_id)
    at.button(key="lib_label_button").click()
    rerun(at)
    assert production_of(engine) is None  # the Promote dialog first: the first production needs no reason
    assert any(i.value.startswith("No version is in production yet") for i in at.info)
    at.button(key="lib_promote_confirm").click()
    rerun(at)

    with db.session_scope(engine) as session:
        library = queries.library_by_name(session, get_task(session, DEMO_TASK).id, "default")
        label = queries.label_by_name(session, library.id, "production")
        assert (label.version_id, label.moved_by) == (imported_id, REVIEWER)
    labels = table_with(at, "moved by")
    assert labels[["label", "version"]].values.tolist() == [["production", f"#{number_of(engine, imported_id)}"]]
    versions = table_with(at, "created by").set_index("version")
    assert versions.loc[f"#{number_of(engine, imported_id)}", "labels"] == "production"

    at.selectbox(key="lib_label_version").select(latest_id)
    at.button(key="lib_label_button").click()
    rerun(at)
    at.text_area(key="lib_promote_reason").input(REASON)  # no comparison of the two: a reason is needed
    at.button(key="lib_promote_confirm").click()
    rerun(at)
    with db.session_scope(engine) as session:
        library = queries.library_by_name(session, get_task(session, DEMO_TASK).id, "default")
        assert queries.label_by_name(session, library.id, "production").version_id == latest_id
        assert len(queries.labels(session, library.id)) == 1


REASON = "The old wording confused customers; rolled forward before an evaluation."


def production_of(engine) -> int | None:
    with db.session_scope(engine) as session:
        library = queries.library_by_name(session, get_task(session, DEMO_TASK).id, "default")
        label = queries.label_by_name(session, library.id, "production")
        return label.version_id if label else None


def last_move(engine) -> dict:
    from sqlmodel import col, select

    from storage.tables import AuditEvent

    with db.session_scope(engine) as session:
        return session.exec(select(AuditEvent).where(AuditEvent.action == "label.move")
                            .order_by(col(AuditEvent.id).desc())).first().after


def promote_on_the_page(at, version_id: int) -> None:
    at.text_input(key="lib_label_name").set_value("production")
    at.selectbox(key="lib_label_version").select(version_id)
    at.button(key="lib_label_button").click()
    rerun(at)


def production_and_candidate(engine) -> tuple[int, int]:
    from core.records.library.versions import set_label

    current = import_texts(engine, UNITS)
    set_label(engine, DEMO_TASK, str(number_of(engine, current)), "production", "bob")
    return current, modify(engine, "E1", "Write the unit next to every number, also in the final answer.")


def test_moving_production_opens_the_guarded_dialog_and_needs_a_reason_without_a_comparison(engine):
    current, candidate = production_and_candidate(engine)
    at = open_page()
    promote_on_the_page(at, candidate)
    assert production_of(engine) == current  # asked first: nothing moved
    assert any("Promote version #3 to production?" in m.value for m in at.markdown)
    assert any(i.value.startswith("No paired comparison with production") for i in at.info)
    assert any(c.value.startswith(f"- [E1] {UNITS}") and "+ [E1] Write the unit next to every number, also" in c.value
               for c in at.code)  # the diff against production
    assert "no paired comparison" in at.text_area(key="lib_promote_reason").label

    at.button(key="lib_promote_confirm").click()  # no reason
    rerun(at)
    assert production_of(engine) == current
    assert any("compare them first" in e.value and "or give a reason" in e.value for e in at.error)

    at.text_area(key="lib_promote_reason").input(REASON)
    at.button(key="lib_promote_confirm").click()
    rerun(at)
    assert production_of(engine) == candidate
    assert last_move(engine)["reason"] == REASON and last_move(engine)["comparison"] is None
    assert any("production now points at version #3" in s.value and "audit log" in s.value for s in at.success)
    assert not [b for b in at.button if b.key == "lib_promote_confirm"]  # the dialog closed


def test_moving_another_label_needs_no_dialog(engine):
    current, candidate = production_and_candidate(engine)
    at = open_page()
    at.text_input(key="lib_label_name").set_value("candidate")
    at.selectbox(key="lib_label_version").select(candidate)
    at.button(key="lib_label_button").click()
    rerun(at)
    assert not [b for b in at.button if b.key == "lib_promote_confirm"]
    assert last_move(engine) == {"name": "candidate", "version_id": candidate, "number": number_of(engine, candidate)}
    assert production_of(engine) == current


def test_with_a_comparison_the_dialog_moves_production_and_records_the_verdict(engine):
    from core.grpo.evaluation import create_evaluation, execute_evaluation
    from tests.ui_support import scripted_gateway

    current, candidate = production_and_candidate(engine)
    ids = []
    for version_id in (current, candidate):
        ids.append(create_evaluation(engine, DEMO_TASK, str(number_of(engine, version_id)), k=1, limit=3, created_by="bob"))
        assert execute_evaluation(engine, ids[-1], gateway=scripted_gateway(engine)[1]).status == "completed"
    at = open_page()
    promote_on_the_page(at, candidate)
    assert any(f"Against production (evaluation {ids[0]} vs {ids[1]}" in e.value
               for e in [*at.info, *at.success, *at.error])
    assert not [t for t in at.text_area if t.key == "lib_promote_reason"]  # a comparison needs no reason
    at.button(key="lib_promote_confirm").click()
    rerun(at)
    assert production_of(engine) == candidate
    assert last_move(engine)["comparison"]["evaluations"] == ids and last_move(engine)["comparison"]["verdict"]


def test_with_the_setting_on_a_reason_is_not_enough(engine, monkeypatch):
    from core.settings import get_settings

    current, candidate = production_and_candidate(engine)
    monkeypatch.setenv("TFGRPO_PROMOTION_REQUIRES_COMPARISON", "1")
    get_settings.cache_clear()
    at = open_page()
    promote_on_the_page(at, candidate)
    assert any("a reason is not enough" in w.value for w in at.warning)
    assert not [t for t in at.text_area if t.key == "lib_promote_reason"]
    assert at.button(key="lib_promote_confirm").disabled
    assert production_of(engine) == current


def test_export_in_three_formats(engine):
    version_id = import_texts(engine, UNITS, REREAD)
    at = open_page()
    assert at.selectbox(key="lib_export_version").value == version_id

    at.radio(key="lib_export_format").set_value("md")
    rerun(at)
    assert f"# Experience library\n\n- [E1] {UNITS}\n- [E2] {REREAD}" in codes(at)  # st.code drops the final newline

    at.radio(key="lib_export_format").set_value("json")
    rerun(at)
    documents = []
    for value in codes(at):
        try:
            documents.append(json.loads(value))
        except ValueError:
            continue
    assert len(documents) == 1
    assert documents[0]["experiences"] == [{"id": "E1", "text": UNITS}, {"id": "E2", "text": REREAD}]
    assert documents[0]["task"] == DEMO_TASK
    assert (documents[0]["version_id"], documents[0]["number"]) == (version_id, 2)  # the API's keys

    at.radio(key="lib_export_format").set_value("prompt")
    rerun(at)
    assert f"{PAPER_WORDING.header}\n[E1] {UNITS}\n[E2] {REREAD}" in codes(at)  # the task's wording
    assert page.export_file_name(DEMO_TASK, "default", 2, "prompt") == "arithmetic-word-problems-default-v2.txt"


def test_hostile_experience_text_is_shown_only_as_code(engine):
    import_texts(engine, HOSTILE, UNITS)
    modify(engine, "E1", f"{HOSTILE} again")
    at = open_page()
    at.selectbox(key="lib_edit_id").select("E1")
    rerun(at)

    assert any(HOSTILE in value for value in codes(at)), codes(at)
    assert any(HOSTILE in c.value for c in at.code if c.language == "diff")
    for text in markdown_texts(at):
        assert "alert(1)" not in text and "bold" not in text and "e.com" not in text, text
    for widget in [*at.selectbox, *at.multiselect, *at.text_area, *at.button, *at.radio]:
        assert "alert(1)" not in (widget.label or ""), widget.label


def test_import_handler_creates_a_version_or_writes_nothing(engine):
    ctx = Context(task=DEMO_TASK, library="default", reviewer=REVIEWER)

    outcome = page.import_upload("lib.json", json.dumps([UNITS, REREAD]).encode(), ctx)
    assert outcome.ok, outcome
    latest = stored_versions(engine)[-1]
    assert (latest.number, latest.source, latest.created_by) == (2, "import", REVIEWER)
    assert [exp["text"] for exp in latest.experiences] == [UNITS, REREAD]

    bad_json = page.import_upload("lib.json", b'{"experiences": [', ctx)
    assert not bad_json.ok and "not valid JSON" in bad_json.detail
    empty = page.import_upload("lib.md", b"\n\n", ctx)
    assert not empty.ok and "empty" in empty.detail
    binary = page.import_upload("lib.txt", b"\xff\xfe\x00\x81 not text", ctx)
    assert not binary.ok and "UTF-8" in binary.detail
    assert len(stored_versions(engine)) == 2

    other = page.import_upload("seg.md", f"- {ESTIMATE}".encode(),
                               Context(task=DEMO_TASK, library="segment-b", reviewer=REVIEWER))
    assert other.ok
    with db.session_scope(engine) as session:
        segment = queries.library_by_name(session, get_task(session, DEMO_TASK).id, "segment-b")
        assert [v.source for v in queries.versions(session, segment.id)] == ["initial", "import"]


@pytest.mark.parametrize(("name", "data", "ok"), [("lib.md", f"- {UNITS}\n- {REREAD}".encode(), True),
                                                  ("lib.txt", b"\xff\xfe\x00\x81", False),
                                                  ("lib.json", b"[1, 2]", False)])
def test_import_button_on_the_page(engine, name, data, ok):
    at = open_page()
    assert at.button(key="lib_import_button").disabled
    at.file_uploader(key="lib_import_file").upload(name, data)
    rerun(at)
    at.button(key="lib_import_button").click()
    rerun(at)

    versions = stored_versions(engine)
    if ok:
        assert (len(versions), versions[-1].source, versions[-1].created_by) == (2, "import", REVIEWER)
        assert any("Imported 2 experiences as version #2" in s.value for s in at.success)
        assert table_with(at, "created by")["version"].tolist() == ["#2", "#1"]
    else:
        assert len(versions) == 1
        assert any("Nothing was written" in e.value for e in at.error), [e.value for e in at.error]
        assert not at.success


# ---- Measure experiences (core.grpo.attribution): the effect beside each experience ---------------------------


def test_each_experience_shows_its_effect_and_those_that_hurt_can_be_removed(engine, scripted):
    from sqlmodel import select

    from storage.tables import AuditEvent
    from tests.test_attribution import HARMFUL, HELPFUL, NEUTRAL, measured

    version_id, run_id = measured(engine, scripted, HELPFUL, HARMFUL, NEUTRAL)
    at = open_page()
    effects = table_with(at, "verdict")
    assert effects.columns.tolist() == ["id", "experience", "effect", "95% interval", "p", "verdict", "shown"]
    assert effects["id"].tolist() == ["E1", "E2", "E3"]
    assert effects["shown"].tolist() == ["16 of 16 rollouts"] * 3  # the selection is `all`: every rollout
    assert effects["experience"].tolist() == [HELPFUL, HARMFUL, NEUTRAL]
    assert effects["effect"].tolist() == [0.5, -0.5, 0.0]
    assert effects["95% interval"].tolist() == ["[+0.125, +0.875]", "[-0.875, -0.125]", "[+0.000, +0.000]"]
    assert effects["verdict"].tolist() == ["helps", "hurts", "unclear"]
    assert any(f"Measured by run {run_id} on 8 test queries x k=2" in c.value for c in at.caption)

    at.button(key="lib_remove_hurting").click()
    rerun(at)
    latest = stored_versions(engine)[-1]
    assert (latest.number, latest.source, latest.created_by) == (3, "manual", REVIEWER)
    assert [e["text"] for e in latest.experiences] == [HELPFUL, NEUTRAL]
    assert f"run {run_id}" in latest.note
    assert any("Created version #3" in s.value for s in at.success)
    # The page now shows the new version, whose experiences are not measured yet.
    assert at.selectbox(key="lib_text_version").value == latest.id
    assert table_with(at, "created by")["version"].tolist() == ["#3", "#2", "#1"]
    assert not [df for df in at.dataframe if "verdict" in df.value.columns]
    with db.session_scope(engine) as session:
        events = session.exec(select(AuditEvent).where(AuditEvent.action == "attribution.remove_hurting")).all()
        assert [(e.actor, e.object_id) for e in events] == [(REVIEWER, run_id)]


def test_an_older_measured_version_shows_its_effects_without_the_remove_button(engine, scripted):
    from tests.test_attribution import HARMFUL, HELPFUL, measured

    version_id, _run_id = measured(engine, scripted, HELPFUL, HARMFUL)
    import_texts(engine, UNITS)  # the library moved on
    at = open_page()
    at.selectbox(key="lib_text_version").select(version_id)
    rerun(at)
    assert table_with(at, "verdict")["verdict"].tolist() == ["helps", "hurts"]
    assert not [b for b in at.button if b.key == "lib_remove_hurting"]
    assert any("no longer the latest" in c.value for c in at.caption)


def test_start_measuring_shows_the_estimate_then_queues_a_run_with_its_progress(engine):
    from core.grpo.attribution import attribution_runs

    version_id = import_texts(engine, UNITS, ESTIMATE)
    at = open_page()
    assert any("not been measured yet" in c.value for c in at.caption)
    assert any("3 variants" in i.value and "x 100 test queries x k=2 = 600 agent calls" in i.value for i in at.info), \
        [i.value for i in at.info]
    assert any("no validation split" in w.value for w in at.warning)
    at.number_input(key="lib_measure_limit").set_value(4)
    at.number_input(key="lib_measure_k").set_value(1)
    rerun(at)
    assert any("x 4 test queries x k=1 = 12 agent calls" in i.value for i in at.info), [i.value for i in at.info]
    at.button(key="lib_measure_start").click()
    rerun(at)

    [run] = attribution_runs(engine, version_id)
    assert (run.status, run.kind, run.created_by, run.settings["k"], len(run.settings["sample_ids"])) == (
        "queued", "attribute", REVIEWER, 1, 4)
    assert any(f"Measurement run {run.id} queued" in s.value for s in at.success)
    assert any(f"Measurement run {run.id}: queued · variants 0/3" in c.value for c in at.caption), \
        [c.value for c in at.caption]
    assert at.button(key="lib_measure_start").disabled
    at.button(key="lib_measure_cancel").click()
    rerun(at)
    assert attribution_runs(engine, version_id)[0].status == "cancelled"
    assert not at.button(key="lib_measure_start").disabled


def test_a_failed_measurement_shows_why_and_can_be_resumed(engine):
    from core.grpo.attribution import attribution_runs, create_attribution
    from storage.tables import Run

    version_id = import_texts(engine, UNITS, ESTIMATE)
    run_id = create_attribution(engine, DEMO_TASK, str(number_of(engine, version_id)), k=1, limit=2)
    with db.session_scope(engine) as session:
        run = session.get(Run, run_id)
        run.status, run.error = "failed", "RuntimeError: the provider is down"
        session.add(run)
    at = open_page()
    assert any(f"Measurement run {run_id}: failed · variants 0/3" in c.value for c in at.caption)
    assert "RuntimeError: the provider is down" in codes(at)
    at.button(key="lib_measure_resume").click()
    rerun(at)
    assert attribution_runs(engine, version_id)[0].status == "queued"
    assert any(f"Measurement run {run_id}: queued" in c.value for c in at.caption)


@pytest.mark.parametrize("name, data, problem", [
    ("deep.json", b"[" * 100_000, "deep.json is nested more than 100 levels deep"),
    ("big.md", b"- Check the units of every quantity.\n" * 60_000, "big.md: the file is 2.2 MB; the limit for a "
                                                                   "library is 2 MB"),
    ("many.md", "".join(f"- Check the units of quantity {n}.\n" for n in range(31)).encode(),
     "many.md: 31 experiences; an import holds at most 30, as many as a run lets the learner keep by default"),
    ("long.json", json.dumps(["word " * 200]).encode(), "long.json: experience 1 is too long (200 words, 999 "
                                                        "characters; at most 64 words / 500 characters)"),
])
def test_the_import_handler_has_the_clis_limits(engine, name, data, problem):
    outcome = page.import_upload(name, data, Context(task=DEMO_TASK, library="default", reviewer=REVIEWER))
    assert (outcome.ok, outcome.message, outcome.detail) == (
        False, "Cannot import this file. Nothing was written. The problem:", problem)
    assert len(stored_versions(engine)) == 1


def test_a_stale_tab_cannot_revert_once_sign_in_is_on(engine):
    from core.records.people.users import add_user

    imported_id = import_texts(engine, UNITS, REREAD)
    modify(engine, "E2", "Re-read the question and underline what it asks for.")
    at = open_page()  # drawn while sign-in was off
    add_user(engine, "ada", "admin", "a-long-secret-1", actor="cli")  # elsewhere: sign-in goes on
    at.selectbox(key="lib_revert_version").select(imported_id)
    at.button(key="lib_revert_button").click()
    rerun(at)

    assert [v.number for v in stored_versions(engine)] == [1, 2, 3]
    assert [t.value for t in at.title] == ["Sign in"]


def test_the_selection_is_saved_by_a_reviewer_and_a_typed_query_previews_its_entries(engine):
    from core.records.library.selection import library_selection

    import_texts(engine, UNITS, REREAD, ESTIMATE)
    at = open_page()
    assert any("all entries, in the library's order" in c.value for c in at.caption)
    at.radio(key="lib_selection_mode").set_value("top_k")
    at.number_input(key="lib_selection_k").set_value(1)
    at.button(key="lib_selection_submit").click()
    rerun(at)
    assert library_selection(engine, DEMO_TASK).as_dict() == {"mode": "top_k", "k": 1}
    with db.session_scope(engine) as session:
        [event] = queries.audit_events(session, action_prefix="library.selection")
    assert (event.actor, event.after) == (REVIEWER, {"mode": "top_k", "k": 1})
    assert any("the entry most similar to the query" in c.value for c in at.caption)

    at.text_input(key="lib_selection_query").set_value("Which quantity does the question ask for?")
    rerun(at)
    preview = table_with(at, "BM25")
    assert preview["entry"].tolist() == [REREAD] and preview["BM25"].iloc[0] > 0
    assert not any("share" in c.value and "no word with the query" in c.value for c in at.caption)

    at.text_input(key="lib_selection_query").set_value("zebra xylophone")  # no word of any entry: a filler
    rerun(at)
    preview = table_with(at, "BM25")
    assert len(preview) == 1 and float(str(preview["BM25"].iloc[0])) == 0
    assert any(f"{preview['id'].iloc[0]} shares no word with the query" in c.value for c in at.caption)
