"""Third-party DEBUG logging stays out of the terminal and the worker's log (issue 41): bm25s sets its own logger
to DEBUG when imported and logged "Building index from tokens" for every ranked query (1,643 lines in one
worker's log; one per query on `python -m core eval`'s terminal)."""

from __future__ import annotations

import io
import logging

import pytest

from core.cli.logs import configure_logging
from core.domain.selection import bm25_scores


@pytest.fixture
def bare_root():
    """The root logger as a fresh process has it (no handlers; pytest adds its own when the test's call starts,
    so the test clears them again first), restored afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield root
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.handlers.extend(handlers)
        root.setLevel(level)


@pytest.mark.parametrize("level", [logging.ERROR, logging.INFO])  # the command line's default, the worker's
def test_a_ranked_query_logs_nothing_of_bm25s_and_the_studios_own_messages_still_show(bare_root, level):
    stream = io.StringIO()
    bare_root.handlers.clear()
    configure_logging(level, stream=stream)
    assert bm25_scores(["Quote prices with tax.", "Check the units."], "what tax applies")[0] > 0
    logging.getLogger("bm25s").debug("Building index from tokens")  # as bm25s itself logs, its logger at DEBUG
    logging.getLogger("core.jobs.worker").info("claimed evaluation 3")
    logging.getLogger("core.jobs.worker").error("evaluation 3 failed")
    logging.getLogger("bm25s").warning("a library's warning")
    shown = stream.getvalue()
    assert "Building index" not in shown and "DEBUG" not in shown, shown
    assert "evaluation 3 failed" in shown and "a library's warning" in shown
    assert ("claimed evaluation 3" in shown) == (level <= logging.INFO)


def test_configuring_twice_keeps_one_filter(bare_root):
    bare_root.handlers.clear()
    configure_logging(logging.ERROR, stream=io.StringIO())
    configure_logging(logging.INFO)  # the worker command after the command line's set-up
    assert bare_root.level == logging.INFO
    assert [len(h.filters) for h in bare_root.handlers] == [1]


def test_logging_that_belongs_to_someone_else_is_left_alone(bare_root):
    """pytest (or a program that embeds the command line) owns the root logger: its level and handlers stay."""
    level, handlers = bare_root.level, list(bare_root.handlers)
    assert handlers  # pytest's own
    configure_logging(logging.ERROR)
    assert (bare_root.level, bare_root.handlers) == (level, handlers)
