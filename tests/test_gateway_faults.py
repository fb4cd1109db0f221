"""The gateway against a real HTTP endpoint (bench/stub_server.py): one retry layer that counts truthfully,
Retry-After, a slot freed while backing off, a per-request timeout, a deadline, and shared in-flight calls."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlmodel import Session, select

from bench.stub_server import StubServer
from core.errors import ModelCallError
from core.models.gateway import Gateway
from storage.tables import LLMCall

MODEL = "openai/stub"


@pytest.fixture(autouse=True)
def any_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")


def ask(gateway: Gateway, text: str = "What is 2 + 2?"):
    return gateway.complete(stage="rollout", model=MODEL, messages=[{"role": "user", "content": text}],
                            max_tokens=16)


def ledger(engine) -> list[LLMCall]:
    with Session(engine) as session:
        return list(session.exec(select(LLMCall).order_by(LLMCall.id)))


def test_one_request_per_attempt_and_the_ledger_counts_them(engine):
    with StubServer(script=["500", "503", "ok"]) as stub:
        gateway = Gateway(engine, api_base=stub.url, backoff_s=0.01)
        result = asyncio.run(ask(gateway))
        requests = stub.requests()
    assert [r["outcome"] for r in requests] == ["500", "503", "ok"]  # no hidden SDK retries under ours
    assert "ref" in result.text
    assert [(c.attempts, c.error) for c in ledger(engine)] == [(3, None)]


def test_retry_after_is_honoured(engine):
    with StubServer(script=["429", "ok"], retry_after_s=0.4) as stub:
        gateway = Gateway(engine, api_base=stub.url, backoff_s=0.001)
        asyncio.run(ask(gateway))
        first, second = stub.requests()
    assert second["t"] - first["t"] >= 0.4


def test_a_call_backing_off_frees_its_slot(engine):
    """Concurrency 1: while the first call waits out its Retry-After, the second one is answered."""
    with StubServer(script=["429", "ok", "ok"], retry_after_s=0.6) as stub:
        gateway = Gateway(engine, api_base=stub.url, concurrency=1, backoff_s=0.001)
        finished: list[str] = []

        async def both() -> None:
            async def one(name: str, text: str, delay: float) -> None:
                await asyncio.sleep(delay)
                await ask(gateway, text)
                finished.append(name)

            await asyncio.gather(one("first", "What is 1 + 1?", 0), one("second", "What is 3 + 3?", 0.15))

        asyncio.run(both())
        outcomes = [r["outcome"] for r in stub.requests()]
    assert outcomes == ["429", "ok", "ok"] and finished == ["second", "first"]


def test_a_hanging_request_is_cut_at_the_per_attempt_timeout_and_retried(engine):
    with StubServer(script=["timeout", "ok"], hang_s=20) as stub:
        gateway = Gateway(engine, api_base=stub.url, timeout_s=0.5, backoff_s=0.01)
        started = time.monotonic()
        asyncio.run(ask(gateway))
        took = time.monotonic() - started
        assert [r["outcome"] for r in stub.requests()] == ["timeout", "ok"]
    assert took < 10
    assert ledger(engine)[0].attempts == 2


def test_a_call_gives_up_at_its_deadline_and_says_so(engine):
    with StubServer(script=["503"] * 50) as stub:
        gateway = Gateway(engine, api_base=stub.url, max_retries=50, backoff_s=0.1, deadline_s=1.0)
        started = time.monotonic()
        with pytest.raises(ModelCallError, match=r"gave up after \d+ attempts in"):
            asyncio.run(ask(gateway))
        sent = len(stub.requests())
    assert time.monotonic() - started < 3
    (row,) = ledger(engine)
    assert row.attempts == sent and row.error.startswith("gave up after")


def test_identical_calls_in_flight_share_one_request(engine):
    with StubServer(latency_s=0.3) as stub:
        gateway = Gateway(engine, api_base=stub.url)

        async def three():
            return await asyncio.gather(*(ask(gateway) for _ in range(3)))

        results = asyncio.run(three())
        assert len(stub.requests()) == 1
    assert len({r.text for r in results}) == 1
    assert sorted(r.cache_hit for r in results) == [False, True, True]
    paid = [c for c in ledger(engine) if not c.cache_hit]
    assert len(paid) == 1
    assert {c.request.get("cached_from") for c in ledger(engine) if c.cache_hit} == {paid[0].id}


def test_a_reset_connection_and_a_body_that_is_not_json_are_retried(engine):
    with StubServer(script=["reset", "bad_body", "ok"]) as stub:
        gateway = Gateway(engine, api_base=stub.url, backoff_s=0.01)
        result = asyncio.run(ask(gateway))
        assert [r["outcome"] for r in stub.requests()] == ["reset", "bad_body", "ok"]
    assert "ref" in result.text and ledger(engine)[0].attempts == 3


def test_time_waiting_for_a_slot_does_not_count_against_the_deadline(engine):
    """Concurrency 1, three calls of 0.6 s each and a deadline of 1 s: the last waits 1.2 s in our own queue, then
    takes 0.6 s at the model, and is answered (counting the wait, it would have given up unasked)."""
    with StubServer(latency_s=0.6) as stub:
        gateway = Gateway(engine, api_base=stub.url, concurrency=1, max_retries=0, deadline_s=1.0)

        async def three():
            return await asyncio.gather(*(ask(gateway, f"What is {n} + {n}?") for n in range(3)))

        asyncio.run(three())
        assert len(stub.requests()) == 3
    assert [(c.attempts, c.error) for c in ledger(engine)] == [(1, None)] * 3


def test_the_embedded_models_server_gets_the_whole_deadline_per_attempt(engine, monkeypatch):
    """A served local call slower than timeout_s is working, not lost: it is answered by its first request,
    never cut and sent again (the same seed would only redo the same work)."""
    from core.models import model_server

    with StubServer(latency_s=0.8) as stub:
        monkeypatch.setattr(model_server, "address", lambda name, start=True: stub.url.removesuffix("/v1"))
        gateway = Gateway(engine, timeout_s=0.3, backoff_s=0.01, deadline_s=30)
        result = asyncio.run(gateway.complete(stage="rollout", model="local/qwen2.5-coder-0.5b",
                                              messages=[{"role": "user", "content": "hi"}], max_tokens=16))
        assert len(stub.requests()) == 1
    assert "ref" in result.text and [(c.attempts, c.error) for c in ledger(engine)] == [(1, None)]
