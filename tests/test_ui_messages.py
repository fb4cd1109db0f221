"""core's messages read on a page as a person should read them (issue 37, item 5, "text rendered as text").

core writes a message once, for the CLI too: a command in backticks. On a page a backtick must not show literally
(escaped in a Markdown element, or drawn by a widget that shows text as it is; ui/messages.py). A model's output
stays text: its Markdown is never drawn. (A version is named by its number on every face: tests/test_names.py.)
"""

from __future__ import annotations

import string

import pytest

from core.domain.library import ProposedOp
from core.grpo.evaluation import incomplete_reason
from core.records.library.versions import edit_library, import_library, set_label
from core.records.models.connections import ConnectionTest
from core.records.tasks.demos import DEMO_TASK
from tests.ui_support import click, incomplete_evaluation, run_app
from ui.common import REVIEWER_KEY, plain
from ui.messages import escaped, message_markdown, message_text

REVIEWER = "alice"


@pytest.fixture
def engine(app_engine):
    return app_engine


def no_literal_backtick(markdown: str) -> bool:
    """Markdown whose every backtick opens or closes a code span: none is escaped, none is left unpaired."""
    return "\\`" not in markdown and markdown.count("`") % 2 == 0


# --- the helpers ------------------------------------------------------------------------------------------------

def test_a_command_in_backticks_is_inline_code_and_the_rest_is_escaped():
    said = message_markdown("task 'a*b' has no personas; add them on the Tasks page or with "
                            "`python -m core task personas --task 'a*b'`")
    assert said == ("task 'a\\*b' has no personas; add them on the Tasks page or with "
                    "`python -m core task personas --task 'a*b'`")  # inside code, * is shown as it is


def test_an_unpaired_backtick_and_markup_outside_code_are_shown_as_typed():
    assert message_markdown("name 'x`y' <b>[a](http://e.com)</b>") == \
        "name 'x\\`y' \\<b\\>\\[a\\](http://e.com)\\</b\\>"
    assert message_markdown("`one` and `two`") == "`one` and `two`"
    assert message_markdown("two\nlines `a\nb`") == "two\nlines \\`a\nb\\`"  # a code span stays on one line


def test_a_widget_that_shows_text_as_it_is_gets_the_command_between_quotes():
    said = message_text("Retry the failed rollouts (Evaluate page, or `python -m core eval --retry ID`).")
    assert said == "Retry the failed rollouts (Evaluate page, or “python -m core eval --retry ID”)."


def test_escaped_is_the_rule_of_plain():
    text = string.printable + "“”é—"
    assert escaped(text) == plain(text)


# --- on the pages -----------------------------------------------------------------------------------------------

def test_the_sidebar_says_how_to_start_a_worker_without_a_backtick(engine):
    at = run_app(session_state={REVIEWER_KEY: REVIEWER})  # the page tests run with automatic start off
    lines = [c.value for c in at.sidebar.code]
    assert any("make worker" in line for line in lines), lines
    assert not any("`" in line for line in lines), lines


def test_an_incomplete_evaluation_shows_the_retry_command_as_code(engine):
    evaluation, _model, _gateway = incomplete_evaluation(engine)
    evaluation_id = evaluation.id
    assert evaluation.status == "incomplete" and f"`python -m core eval --retry {evaluation_id}`" in evaluation.error
    assert evaluation.error == incomplete_reason(evaluation.metrics, evaluation_id)  # the CLI prints it as it is
    at = run_app(page="pages/evaluate.py", session_state={REVIEWER_KEY: REVIEWER})

    [warning] = [w.value for w in at.warning if "is incomplete" in w.value]
    assert f"Evaluation {evaluation_id} is incomplete: 1 of 4 rollouts" in warning
    assert f"`python -m core eval --retry {evaluation_id}`" in warning and no_literal_backtick(warning), warning


def test_a_library_edit_made_on_an_older_version_names_the_newer_one_by_its_number(engine):
    import_library(engine, DEMO_TASK, "- Write the unit next to every number.", "lib.md", actor="bob")
    at = run_app(page="pages/library.py", session_state={REVIEWER_KEY: REVIEWER})
    at.text_area(key="lib_add_text").input("Re-read the question.")
    click(at, "lib_add_submit")
    created = [s.value for s in at.success]
    assert any("Created version #3" in said for said in created) and not any("(id" in s for s in created), created

    newer = edit_library(engine, DEMO_TASK, [ProposedOp("ADD", text="Estimate the answer first.")], "bob")  # meanwhile
    at.text_area(key="lib_add_text").input("Check the units of every answer.")
    click(at, "lib_add_submit")

    [refused] = [e.value for e in at.error]
    assert f"version \\#{newer.number} was created by bob" in refused and "(id" not in refused, refused


def test_a_connection_test_shows_the_models_reply_as_text(engine, monkeypatch):
    """The reply of the model tried is model output: its Markdown (an image fetched from elsewhere, a link,
    emphasis) is shown as typed."""
    reply = "**yes** ![seen](http://tracker.example/p.png) [click](http://e.com)"
    monkeypatch.setattr("core.records.models.connections.try_connection",
                        lambda engine, name, model, **_: ConnectionTest(True, f"{name}/{model}", "http://lab/v1", 12.0,
                                                                        reply=reply))
    at = run_app(page="pages/models.py", session_state={REVIEWER_KEY: REVIEWER})
    at.radio(key="models_add_kind").set_value("openai")
    at.text_input(key="models_add_name").set_value("lab")
    at.text_input(key="models_add_base_url").set_value("http://127.0.0.1:9/v1")
    click(at, "FormSubmitter:models_add_form-Add connection")
    at.text_input(key="models_test_model_lab").set_value("m")
    click(at, "models_test_lab")

    [said] = [s.value for s in at.success if "answered in" in s.value]
    assert plain(repr(reply)) in said, said


def test_a_refused_promotion_shows_the_compare_command_as_code(engine):
    candidate = import_library(engine, DEMO_TASK, "- Re-read the question.", "lib.md", actor="bob")
    first = edit_library(engine, DEMO_TASK, [ProposedOp("DELETE", ["E1"])], "bob")
    set_label(engine, DEMO_TASK, str(first.number), "production", "bob")
    at = run_app(page="pages/library.py", session_state={REVIEWER_KEY: REVIEWER})
    at.selectbox(key="lib_label_version").select(candidate.id)
    click(at, "lib_label_button")
    click(at, "lib_promote_confirm")  # no comparison and no reason: refused

    [refused] = [e.value for e in at.error]
    assert "python -m core compare" in refused and no_literal_backtick(refused), refused
