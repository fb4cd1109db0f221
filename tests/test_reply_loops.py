"""A reply that falls into a loop is cut after the loop's first copy (core/domain/repeats.py), and the embedded
model's replies are streamed so that the server stops generating there (core/models/openai_http.py)."""

from __future__ import annotations

import asyncio

import pytest
from sqlmodel import Session, select

from core.domain.repeats import loop_cut
from core.models import model_server
from core.models.gateway import Gateway
from storage.tables import LLMCall

SMALL = "smollm2-135m"
LOOPED = ("The zip on your new tent tore on the first night and a pole snapped while I was pitching it. "
          + "The zip on your tent tore on the first night and a pole snapped while I was pitching it. " * 12
          + "The zip on your tent tore on the first")


def test_a_reply_repeating_one_passage_is_cut_at_the_end_of_its_first_copy():
    cut = loop_cut(LOOPED)
    assert LOOPED[:cut] == ("The zip on your new tent tore on the first night and a pole snapped while I was "
                            "pitching it.")


def test_a_long_run_of_a_short_passage_is_a_loop_but_three_short_copies_are_not():
    assert loop_cut("Totals: " + "0, " * 100) is not None
    assert loop_cut("| a | b |\n| --- | --- |\n| 1 | 2 |") is None
    assert loop_cut("Steps: 1. 2. 3.") is None


def test_text_that_says_the_same_thing_twice_or_varies_is_not_a_loop():
    twice = "Our return window is 45 days. " * 2
    assert loop_cut(twice) is None
    varied = " ".join(f"Order {n} ships on day {n % 7}." for n in range(60))
    assert loop_cut(varied) is None
    assert loop_cut("") is None


@pytest.mark.model
def test_the_embedded_model_stops_where_its_reply_loops_and_answers_the_next_call(engine):
    """The real llama.cpp server, asked to go on with a text that repeats one line, at temperature 0: the reply
    ends after its first copy, well before the token limit, the ledger says why, and the server is free for the
    next call at once (the closed stream stopped its generation)."""
    model_server.stop(SMALL)  # a server of this process's own, stopped at the end
    gateway = Gateway(engine)
    ask = "Continue this text for 30 more lines:\n" + "The zip on my tent tore on the first night.\n" * 8

    async def calls():
        looped = await gateway.complete(stage="test", model=f"local/{SMALL}", max_tokens=400,
                                        messages=[{"role": "user", "content": ask}])
        after = await gateway.complete(stage="test", model=f"local/{SMALL}", max_tokens=8,
                                       messages=[{"role": "user", "content": "Say hello."}])
        return looped, after

    try:
        looped, after = asyncio.run(calls())
    finally:
        model_server.stop(SMALL)
    assert looped.text.count("tore on the first night") == 1 and looped.tokens_out < 100
    assert after.text and after.tokens_out <= 8
    with Session(engine) as session:
        rows = session.exec(select(LLMCall).order_by(LLMCall.id)).all()
    assert "loop" in rows[0].request["cut"] and "cut" not in rows[1].request
