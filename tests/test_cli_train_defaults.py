"""`train` with no switches gets the defaults the studio measured for its learner and prints them with their
reasons and the flag that overrides each (core.records.runs.defaults, the Train page's rule); a flag wins."""

from __future__ import annotations

from sqlmodel import Session

from core.domain.selection import DEFAULT_K
from core.records.runs.defaults import EXAMPLES_FIGURE
from core.records.runs.settings import run_settings
from core.records.tasks.demos import POLICY_TASK, ensure_demo_tasks
from storage.tables import Run
from tests.test_cli_review import in_process


def stored(engine, run_id: int):
    with Session(engine) as session:
        return run_settings(session.get(Run, run_id))


def test_train_on_the_embedded_learner_prints_the_chosen_defaults_and_a_flag_overrides_one(engine, database_url,
                                                                                            capsys):
    ensure_demo_tasks(engine)
    cli = in_process(database_url, capsys)
    code, _, out = cli("train", "--task", POLICY_TASK, "--queue")
    assert code == 0, out
    assert "defaults chosen for this run" in out
    assert "worked examples: on." in out and EXAMPLES_FIGURE in out and "[--no-examples]" in out
    assert "lessons: off." in out and "[--lessons]" in out
    assert "learning from the reference where every attempt failed: on." in out
    first = stored(engine, 1)
    assert (first.examples, first.lessons, first.reference_when_all_fail) == (True, False, True)
    assert first.selection == {"mode": "top_k", "k": DEFAULT_K}

    code, _, out = cli("train", "--task", POLICY_TASK, "--queue", "--lessons", "--no-examples",
                       "--max-tokens", "200", "--learner-max-tokens", "300")
    assert code == 0, out
    second = stored(engine, 2)
    assert (second.examples, second.lessons, second.max_tokens, second.learner_max_tokens) == (False, True, 200, 300)
    assert "worked examples: on." not in out and "lessons: off." not in out
