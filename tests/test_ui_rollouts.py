"""UI tests of the Rollouts page (Streamlit AppTest) on runs and evaluations seeded with scripted replies."""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session

from core.domain.code_runs import code_runs
from core.domain.prompts import SIMULATOR_CUE
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.db import session_scope
from storage.tables import Rollout
from tests.ui_support import markdown_texts, run_app, scripted_gateway, seeded_run, table_with

PAGE = "pages/rollouts.py"
HOSTILE = "<script>alert(1)</script> **bold** \\boxed{7}"


@pytest.fixture
def engine(app_engine):
    """The app's database with the demo task (shadows the conftest engine on purpose)."""
    return app_engine


def step_groups(engine, run_id: int) -> tuple[int, dict[int, list[Rollout]]]:
    """The run's first step and its rollouts by sample id, straight from the database."""
    with Session(engine) as session:
        step = queries.steps(session, run_id)[0]
        groups: dict[int, list[Rollout]] = {}
        for rollout in queries.step_rollouts(session, step.id):
            groups.setdefault(rollout.sample_id, []).append(rollout)
    return step.id, groups


def output_columns(at) -> list:
    """The columns that hold an output (the filter checkboxes sit in columns too)."""
    return [c for c in at.columns if any(m.value.startswith("**Output ") for m in c.markdown)]


def test_group_outputs_side_by_side_with_rewards_and_sources(engine):
    run_id = seeded_run(engine, "auto")
    step_id, groups = step_groups(engine, run_id)
    at = run_app(page=PAGE)

    assert at.selectbox(key="rollouts_run").value == run_id
    assert at.selectbox(key="rollouts_step").value == step_id
    sample_id = at.selectbox(key="rollouts_query").value
    expected = groups[sample_id]
    assert len(expected) == 2
    assert "G=2" in at.selectbox(key="rollouts_query").format_func(sample_id)
    assert "mixed" in at.selectbox(key="rollouts_query").format_func(sample_id)

    columns = output_columns(at)
    assert len(columns) == 2
    for column, rollout in zip(columns, expected, strict=True):
        captions = [c.value for c in column.caption]
        codes = [c.value for c in column.code]
        assert f"Reward {rollout.reward:g} · source {rollout.reward_source}" in captions
        assert rollout.reward_source == "verifier"
        assert rollout.final_answer in codes
        assert rollout.summary in codes
    assert sorted(r.reward for r in expected) == [0.0, 1.0]

    with Session(engine) as session:
        sample = queries.samples_by_ids(session, [sample_id])[0]
    code = [c.value for c in at.code]
    assert sample.query in code and sample.reference in code


def test_trajectory_is_shown_verbatim_as_code(engine):
    run_id = seeded_run(engine, "auto", rollout=lambda messages: f"Thinking... {HOSTILE}")
    _step_id, groups = step_groups(engine, run_id)
    at = run_app(page=PAGE)

    rollout = groups[at.selectbox(key="rollouts_query").value][0]
    assert rollout.messages[-1]["role"] == "assistant"
    code = [c.value for c in at.code]
    assert f"Thinking... {HOSTILE}" in code
    assert "assistant" in [c.value for c in at.caption]
    assert [e.label for e in at.expander].count("Trajectory") == 2
    for text in markdown_texts(at):
        assert "alert(1)" not in text and "bold" not in text, text


def test_code_runs_show_the_code_and_its_real_output_as_text(engine, jail):
    code = "print(6 * 7, '<b>bold</b> **x**')"

    def reply(messages):
        if messages[-1]["content"].startswith("```output"):
            return "It printed 42: \\boxed{42}"
        return f"Let me run it.\n```python\n{code}\n```\n```output\n999 invented\n```"

    run_id = seeded_run(engine, "auto", rollout=reply)
    _step_id, groups = step_groups(engine, run_id)
    at = run_app(page=PAGE)

    rollouts = groups[at.selectbox(key="rollouts_query").value]
    for column, rollout in zip(output_columns(at), rollouts, strict=True):
        captions = [c.value for c in column.caption]
        codes = [c.value for c in column.code]
        assert any(c.startswith("Code run 1 · exit 0 · ") and c.endswith(" s") for c in captions), captions
        [run] = code_runs(rollout.messages)  # the page shows the run stored on this output
        assert run.output == "42 <b>bold</b> **x**"
        assert run.code in codes and run.output in codes and run.code == code  # verbatim, as code
        assert not any("999 invented" in text for text in codes)
    for text in markdown_texts(at):
        assert "<b>" not in text and "**x**" not in text, text


def test_only_mixed_groups_hides_an_all_equal_group(engine):
    run_id = seeded_run(engine, "auto")
    step_id, groups = step_groups(engine, run_id)
    uniform_sample = min(groups)
    with session_scope(engine) as session:  # test setup: make one group all-correct
        for rollout in queries.step_rollouts(session, step_id, uniform_sample):
            rollout.reward = 1.0
            session.add(rollout)
    at = run_app(page=PAGE)
    assert sorted(at.selectbox(key="rollouts_query").options) == sorted(
        at.selectbox(key="rollouts_query").format_func(s) for s in groups)

    at.checkbox(key="rollouts_only_mixed").check().run()
    assert not at.exception
    query = at.selectbox(key="rollouts_query")
    assert query.value == max(groups) != uniform_sample
    assert len(query.options) == 1
    assert "1 of 2 queries shown" in [c.value for c in at.caption]

    at.checkbox(key="rollouts_only_mixed").uncheck().run()
    at.checkbox(key="rollouts_only_failures").check().run()
    assert at.selectbox(key="rollouts_query").value == max(groups)
    assert len(at.selectbox(key="rollouts_query").options) == 1


def test_choosing_an_evaluation_shows_its_rollouts(engine):
    eval_id = create_evaluation(engine, DEMO_TASK, "empty", limit=2, k=6)
    _model, gateway = scripted_gateway(engine)
    execute_evaluation(engine, eval_id, gateway=gateway)
    at = run_app(page=PAGE)
    assert any("no training runs" in i.value for i in at.info)

    at.radio(key="rollouts_source").set_value("Evaluation").run()
    assert not at.exception
    assert at.selectbox(key="rollouts_evaluation").value == eval_id
    sample_id = at.selectbox(key="rollouts_query").value
    with Session(engine) as session:
        expected = queries.evaluation_sample_rollouts(session, eval_id, sample_id)
    assert len(expected) == 6

    table = table_with(at, "final answer")  # G > 4: a compact table, then one expander per output
    assert table["index"].tolist() == list(range(6))
    assert table["reward"].tolist() == [r.reward for r in expected]
    assert set(table["source"]) == {"verifier"}
    assert table["final answer"].tolist() == [r.final_answer for r in expected]
    labels = [e.label for e in at.expander]
    assert [label for label in labels if label.startswith("Output ")] == [
        f"Output {r.group_index} · reward {r.reward:g}" for r in expected]


def test_a_label_on_an_output_overrides_its_verifier_reward(engine):
    run_id = seeded_run(engine, "auto")
    _step_id, groups = step_groups(engine, run_id)
    at = run_app(page=PAGE, session_state={"task": DEMO_TASK})
    sample_id = at.selectbox(key="rollouts_query").value
    target = groups[sample_id][0]
    flipped = 1.0 - target.reward
    at.radio(key=f"rollouts_label_value_{target.id}").set_value(flipped)
    at.text_input(key=f"rollouts_label_comment_{target.id}").input("the checker misread the units")
    at.button(key=f"rollouts_label_save_{target.id}").click()
    at.run()
    assert not at.exception and not at.error
    with Session(engine) as session:
        row = session.get(Rollout, target.id)
    assert (row.reward, row.reward_source, row.suggested_reward) == (flipped, "human", target.reward)
    assert f"Reward {flipped:g} · source human" in [c.value for c in at.caption]


def test_a_megabyte_answer_shows_its_start_and_all_of_it_on_request(engine):
    from ui.display import SHOWN_CHARS

    run_id = seeded_run(engine, "auto")
    _step_id, groups = step_groups(engine, run_id)
    at = run_app(page=PAGE)
    rollout = groups[at.selectbox(key="rollouts_query").value][0]
    huge = "The answer, at length. " * 45_000 + "THE END"  # about 1 MB
    with session_scope(engine) as session:  # test setup: a model that would not stop
        stored = session.get(Rollout, rollout.id)
        stored.final_answer = huge
        session.add(stored)
    at.run()

    assert not at.exception
    assert max(len(c.value) for c in at.code) <= SHOWN_CHARS + 1
    assert huge[:SHOWN_CHARS] + "…" in [c.value for c in at.code]
    assert f"The first {SHOWN_CHARS:,} of {len(huge):,} characters." in [c.value for c in at.caption]
    toggle = at.toggle(key=f"show_all_rollout_{rollout.id}_final")
    assert toggle.label == f"Show all {len(huge):,} characters" and not toggle.value

    toggle.set_value(True)
    at.run()
    assert huge in [c.value for c in at.code]
    assert f"The first {SHOWN_CHARS:,} of {len(huge):,} characters." not in [c.value for c in at.caption]


# --- conversation tasks ---------------------------------------------------------------------------

CAREFUL = "I am sorry to hear that. <b>bold</b> **stars** Could you give me your order number?"
CARELESS = "Please send me your full card number."
ORDER_RULE_REASON = "the agent never asked for the order number"


def conversation_replies() -> dict:
    """Scripted replies for a conversation group of two: the first conversation of a scenario is careful (it
    asks for the order number), the second careless (it asks for the card number, which the task's regex rule
    forbids, and never asks for the order: the scenario's must-rule fails with no turn to point at)."""
    from core.records.tasks.demo_data import conversation_demo

    forbidden = {text for row in conversation_demo()[1] for text in row.meta["must_not"]}
    started: dict[str, int] = {}

    def agent(messages: list[dict]) -> str:
        earlier = [m["content"] for m in messages if m["role"] == "assistant"]
        if earlier:  # a conversation keeps its manner
            return earlier[0]
        opening = messages[1]["content"]
        started[opening] = started.get(opening, 0) + 1
        return CAREFUL if started[opening] % 2 else CARELESS

    def simulator(messages: list[dict]) -> str:  # its first reply, then it ends (after the system and the cue)
        spoken = [m for m in messages[1:] if m["content"] != SIMULATOR_CUE]
        return "It is order NW-48213." if len(spoken) <= 2 else "Thanks, that helps. [END]"

    def judge(messages: list[dict]) -> str:
        content = messages[1]["content"]
        careful = "<b>bold</b>" in content
        if "You check one rule" in messages[0]["content"]:
            question = content.split("Question: ", 1)[1].split("\n", 1)[0]
            if any(text in question for text in forbidden):  # a must-not rule: the agent avoided it
                return json.dumps({"holds": True, "turn": 0, "reason": "it did not happen"})
            return json.dumps({"holds": careful, "turn": 2 if careful else 0,
                               "reason": "asked in turn 2" if careful else ORDER_RULE_REASON})
        score = 5 if careful else 1
        return json.dumps({"criteria": {name: {"score": score, "reason": "as seen"}
                                        for name in ("empathy", "discovery", "resolution")}, "unsure": False})

    return {"rollout": agent, "simulator": simulator, "judge": judge}


def seeded_conversations(engine, k: int = 2) -> int:
    """An evaluation of the demo conversation task on its first train scenario, k conversations (no spot checks,
    so every reward is the judge's); returns its id."""
    from core.models.gateway import Gateway
    from core.records.tasks.demos import CONVERSATION_TASK, ensure_conversation_task
    from core.records.tasks.lookup import get_task
    from tests.conftest import ScriptedModel, default_replies

    ensure_conversation_task(engine)
    with session_scope(engine) as session:  # test setup: no rollout waits for a person
        task = get_task(session, CONVERSATION_TASK)
        task.reward_settings = {**task.reward_settings, "spot_check_share": 0.0}
        session.add(task)
    eval_id = create_evaluation(engine, CONVERSATION_TASK, "empty", split="train", k=k, limit=1, created_by="system")
    model = ScriptedModel({**default_replies(), **conversation_replies()})
    evaluation = execute_evaluation(engine, eval_id, gateway=Gateway(engine, concurrency=4, mock=model,
                                                                     backoff_s=0.001))
    assert evaluation.status == "completed", evaluation.error
    return eval_id


def conversation_columns(at) -> list:
    return [c for c in at.columns if any(m.value.startswith("**Conversation ") for m in c.markdown)]


def shown_in_order(block) -> list[tuple[str, str]]:
    """The captions, code blocks and errors of a block, in the order they are drawn."""
    return [(node.type, node.value) for node in block if getattr(node, "type", None) in ("caption", "code", "error")]


def open_conversation_evaluation(eval_id: int):
    from core.records.tasks.demos import CONVERSATION_TASK

    at = run_app(page=PAGE, session_state={"task": CONVERSATION_TASK})
    at.radio(key="rollouts_source").set_value("Evaluation").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="rollouts_evaluation").value == eval_id
    return at


def test_a_conversation_group_is_shown_side_by_side_with_a_failed_rule_at_its_turn(engine):
    eval_id = seeded_conversations(engine)
    at = open_conversation_evaluation(eval_id)
    sample_id = at.selectbox(key="rollouts_query").value
    with Session(engine) as session:
        rollouts = queries.evaluation_sample_rollouts(session, eval_id, sample_id)
        sample = queries.samples_by_ids(session, [sample_id])[0]
    assert len(rollouts) == 2
    assert "Conversations (G = 2)" in [s.value for s in at.subheader]
    assert sample.query in [c.value for c in at.code]  # the opening message
    assert any(c.value.startswith("Persona: Marta") for c in at.caption)

    columns = conversation_columns(at)
    assert len(columns) == 2
    careless = next(r for r in rollouts if CARELESS in r.response)
    careful = next(r for r in rollouts if CAREFUL in r.response)
    for column, rollout in zip(columns, rollouts, strict=True):
        drawn = shown_in_order(column)
        turns = [value for kind, value in drawn if kind == "caption" and value.startswith("Turn ")]
        assert turns == ["Turn 1 · User", "Turn 2 · Agent", "Turn 3 · User", "Turn 4 · Agent", "Turn 5 · User"]
        codes = [drawn[i + 1][1] for i, (kind, value) in enumerate(drawn) if kind == "caption"
                 and value.startswith("Turn ")]  # each turn's text, drawn right under its label
        assert codes == [sample.query, CAREFUL if rollout is careful else CARELESS, "It is order NW-48213.",
                             CAREFUL if rollout is careful else CARELESS, "Thanks, that helps."]
        captions = [value for kind, value in drawn if kind == "caption"]
        assert f"Reward {rollout.reward:g} · source judge" in captions
    assert careful.reward == 1.0 and careless.reward == 0.0

    good, bad = (columns[rollouts.index(careful)], columns[rollouts.index(careless)])
    assert "Criteria: empathy 1.00 · discovery 1.00 · resolution 1.00" in [c.value for c in good.caption]
    assert "Criteria: empathy 0.00 · discovery 0.00 · resolution 0.00" in [c.value for c in bad.caption]
    assert not good.error

    drawn = shown_in_order(bad)
    errors = [value for kind, value in drawn if kind == "error"]
    assert errors == ["Rule “must: The agent asks for the order number.” failed",  # no turn: above the transcript
                      "Rule “no card details” failed here"]
    first_turn = drawn.index(("caption", "Turn 1 · User"))
    assert drawn.index(("error", errors[0])) < first_turn
    at_turn = drawn.index(("error", errors[1]))
    assert drawn[at_turn - 2:at_turn] == [("caption", "Turn 2 · Agent"), ("code", CARELESS)]  # right under turn 2
    assert drawn[at_turn + 2] == ("caption", "Turn 3 · User")
    assert "no card details" in drawn[at_turn + 1][1] and "broken in turn 2" in drawn[at_turn + 1][1]
    assert ORDER_RULE_REASON in drawn[drawn.index(("error", errors[0])) + 1][1]


def test_a_conversations_model_text_is_never_markdown(engine):
    eval_id = seeded_conversations(engine)
    at = open_conversation_evaluation(eval_id)
    assert CAREFUL in [c.value for c in at.code]
    for text in markdown_texts(at):
        assert "<b>" not in text and "**stars**" not in text and "stars" not in text, text


def test_a_conversation_group_larger_than_four_wraps_into_rows_of_four(engine):
    eval_id = seeded_conversations(engine, k=6)
    at = open_conversation_evaluation(eval_id)
    columns = conversation_columns(at)
    assert len(columns) == 6
    assert not any(df for df in at.dataframe if "final answer" in df.value.columns)  # no compact table
    headings = [m.value for c in columns for m in c.markdown if m.value.startswith("**Conversation ")]
    assert headings == [f"**Conversation {i}**" for i in range(6)]


def test_a_group_shows_the_entries_its_selection_chose_and_how_many_outputs_saw_each(engine):
    from core.domain.library import ProposedOp
    from core.records.library.selection import set_selection
    from core.records.library.versions import edit_library

    texts = ["Write the unit next to every number you compute.",
             "Count the pieces of candy eaten before making the piles of candy."]
    version = edit_library(engine, DEMO_TASK, [ProposedOp("ADD", [], text) for text in texts], "system")
    set_selection(engine, DEMO_TASK, "default", "top_k", 1, "system")
    eval_id = create_evaluation(engine, DEMO_TASK, str(version.number), split="train", limit=1, k=2)  # Bianca's candy
    _model, gateway = scripted_gateway(engine)
    execute_evaluation(engine, eval_id, gateway=gateway)
    at = run_app(page=PAGE)
    at.radio(key="rollouts_source").set_value("Evaluation").run()
    assert not at.exception

    assert "Entries shown" in [s.value for s in at.subheader]
    shown = table_with(at, "shown to")
    assert shown.to_dict("records") == [{"id": version.experiences[1]["id"], "entry": texts[1], "shown to": 2}]
    assert any(c.value.startswith("Selection: the entry most similar to the query") and "2 of 2 outputs" in c.value
               for c in at.caption)
