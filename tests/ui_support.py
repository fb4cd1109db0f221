"""Helpers for the AppTest page tests: run the app on a page, find tables, seed runs without a model."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from streamlit.testing.v1 import AppTest

from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.grpo.training import RunSettings, create_run, execute_run
from core.models.gateway import Gateway
from core.records.tasks.demo_data import demo_rows
from core.records.tasks.demos import DEMO_TASK
from storage.tables import Evaluation
from tests.conftest import ScriptedModel, default_replies, mixed_rollouts

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "streamlit_app.py"


def run_app(page: str | None = None, session_state: dict | None = None) -> AppTest:
    """The app after its first run, switched to `page` (e.g. "pages/review.py"); fails on any exception."""
    at = AppTest.from_file(str(APP), default_timeout=60)
    for key, value in (session_state or {}).items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    if page:
        at.switch_page(page)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
    return at


def click(at: AppTest, key: str) -> AppTest:
    """Press the button with this key and run the page; fails on any exception."""
    at.button(key=key).click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def switch(at: AppTest, page: str) -> AppTest:
    """Open another page in the same session (as the sidebar does); fails on any exception."""
    at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def table_with(at: AppTest, column: str) -> pd.DataFrame:
    """The one dataframe on the page that has this column."""
    found = [df.value for df in at.dataframe if column in df.value.columns]
    assert len(found) == 1, f"expected one table with column {column!r}, found {len(found)}"
    return found[0]


def markdown_texts(at: AppTest) -> list[str]:
    """Every string the page rendered as Markdown (where HTML or emphasis would be interpreted)."""
    elements = [*at.markdown, *at.caption, *at.title, *at.header, *at.subheader, *at.info, *at.success,
                *at.warning, *at.error]
    return [e.value for e in elements] + [e.label for e in at.expander]


def scripted_gateway(engine, **overrides) -> tuple[ScriptedModel, Gateway]:
    """Mixed rollouts (every group learns), and a gate whose agent answers every validation query right whatever
    the library: with rollouts' alternation the gate's two evaluations, run at once, drew right and wrong replies in
    call order, so its verdict was timing (a flake on PostgreSQL); a test that scripts `gate` chooses its own."""
    references = {row.query: row.reference for row in demo_rows()}
    model = ScriptedModel({"rollout": mixed_rollouts(),
                           "gate": lambda messages: f"so \\boxed{{{references.get(messages[1]['content'], '0')}}}",
                           **{k: v for k, v in default_replies().items() if k != "rollout"}, **overrides})
    return model, Gateway(engine, concurrency=4, mock=model, backoff_s=0.001)


def incomplete_evaluation(engine) -> tuple[Evaluation, ScriptedModel, Gateway]:
    """An evaluation of the empty library on 2 demo queries x k=2 whose first call fails (no retry): it ends
    `incomplete`, 3 of 4 rollouts answered; the scripted model and gateway answer the rest when it is retried."""
    seen: list[int] = []

    def reply(messages):
        seen.append(1)
        return RuntimeError("503 Service Unavailable") if len(seen) == 1 else "so \\boxed{0}"

    evaluation_id = create_evaluation(engine, DEMO_TASK, "empty", k=2, limit=2, created_by="test")
    model, gateway = scripted_gateway(engine, rollout=reply)
    gateway.max_retries = 0
    return execute_evaluation(engine, evaluation_id, gateway=gateway), model, gateway


def seeded_run(engine, review_mode: str = "manual", epochs: int = 1, settings: dict | None = None,
               **overrides) -> int:
    """A run of 2 queries x G=2 on scripted replies (every group mixed, one ADD proposed per step), with the
    default validation gate unless `settings` say otherwise.

    With review_mode="manual" it stops `awaiting_review` with its operations pending.
    """
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=epochs, batch_size=2, group_size=2, limit=2,
                                                       review_mode=review_mode, **(settings or {})),
                        created_by="cli")
    _model, gateway = scripted_gateway(engine, **overrides)
    execute_run(engine, run_id, gateway=gateway)
    return run_id
