"""The model gateway: cache, ledger, retries, structured replies, secrets."""

from __future__ import annotations

import asyncio

import litellm
import pytest
from sqlmodel import Session, select

from core.domain.replies import AdvantageReply
from core.errors import ModelCallError, StructuredOutputError
from core.models.gateway import Gateway, clean_text, extract_json, redact
from storage.tables import LLMCall
from tests.conftest import ScriptedModel

MSG = [{"role": "user", "content": "What is 2+2?"}]


def ledger(engine) -> list[LLMCall]:
    with Session(engine) as s:
        return list(s.exec(select(LLMCall).order_by(LLMCall.id)))


def test_identical_call_is_answered_from_the_cache(engine):
    model = ScriptedModel({"rollout": "4"})
    gw = Gateway(engine, mock=model)
    first = asyncio.run(gw.complete(stage="rollout", model="openai/gpt-4o-mini", messages=MSG, sample_index=0))
    again = asyncio.run(gw.complete(stage="rollout", model="openai/gpt-4o-mini", messages=MSG, sample_index=0))
    other = asyncio.run(gw.complete(stage="rollout", model="openai/gpt-4o-mini", messages=MSG, sample_index=1))
    assert (first.text, again.text, other.text) == ("4", "4", "4")
    assert (first.cache_hit, again.cache_hit, other.cache_hit) == (False, True, False)
    assert len(model.calls) == 2
    rows = ledger(engine)
    assert [(r.stage, r.cache_hit) for r in rows] == [("rollout", False), ("rollout", True), ("rollout", False)]
    assert rows[0].tokens_in > 0 and rows[0].cost > 0 and rows[1].cost == 0


def test_transient_errors_are_retried_then_succeed(engine):
    error = litellm.RateLimitError("slow down", llm_provider="openai", model="gpt-4o-mini")
    model = ScriptedModel({"rollout": [error, error, "ok"]})
    gw = Gateway(engine, mock=model, backoff_s=0.001)
    result = asyncio.run(gw.complete(stage="rollout", model="openai/gpt-4o-mini", messages=MSG))
    assert result.text == "ok" and len(model.calls) == 3
    assert ledger(engine)[-1].attempts == 3


def test_a_failing_provider_is_recorded_and_raised_once_retries_run_out(engine):
    error = litellm.ServiceUnavailableError("down", llm_provider="openai", model="gpt-4o-mini")
    model = ScriptedModel({"rollout": error})
    gw = Gateway(engine, mock=model, backoff_s=0.001, max_retries=2)
    with pytest.raises(ModelCallError, match="ServiceUnavailableError"):
        asyncio.run(gw.complete(stage="rollout", model="openai/gpt-4o-mini", messages=MSG))
    row = ledger(engine)[-1]
    assert row.attempts == 3 and "down" in row.error
    model.replies["rollout"] = "fine now"  # a failed call is never served from the cache
    assert asyncio.run(gw.complete(stage="rollout", model="openai/gpt-4o-mini", messages=MSG)).text == "fine now"


def test_malformed_json_is_asked_again_then_reported_with_the_raw_reply(engine):
    model = ScriptedModel({"advantage": ["not json at all", '```json\n{"experiences": ["a"]}\n```']})
    gw = Gateway(engine, mock=model)
    value, _ = asyncio.run(gw.complete_json(stage="advantage", model="openai/gpt-4o-mini", messages=MSG,
                                            reply=AdvantageReply))
    assert value.experiences == ["a"] and len(model.calls) == 2
    model.replies["advantage"] = "still {not json"
    with pytest.raises(StructuredOutputError) as info:
        asyncio.run(gw.complete_json(stage="advantage", model="openai/gpt-4o-mini", messages=MSG + MSG,
                                     reply=AdvantageReply))
    assert info.value.raw == "still {not json"


def test_extract_json_tolerates_prose_and_fences():
    assert extract_json('Sure! {"a": 1} hope that helps') == {"a": 1}
    assert extract_json("```\n[1, 2]\n```") == [1, 2]
    with pytest.raises(ValueError):
        extract_json("no json here")


def test_secrets_from_the_environment_never_reach_the_ledger(engine, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret-123456")
    assert "sk-test" not in redact("invalid key sk-test-secret-123456 given")
    error = litellm.AuthenticationError("invalid key sk-test-secret-123456", llm_provider="openai", model="x")
    gw = Gateway(engine, mock=ScriptedModel({"rollout": error}))
    with pytest.raises(ModelCallError) as info:
        asyncio.run(gw.complete(stage="rollout", model="openai/gpt-4o-mini", messages=MSG))
    assert "sk-test-secret" not in str(info.value)
    row = ledger(engine)[-1]
    assert "sk-test-secret" not in row.error and "sk-test-secret" not in str(row.request)


def test_concurrency_is_bounded_per_model(engine):
    in_flight = {"now": 0, "max": 0}

    async def main():
        gw = Gateway(engine, concurrency=2, mock=lambda stage, messages: "ok")
        original = litellm.acompletion

        async def slow(**kwargs):
            in_flight["now"] += 1
            in_flight["max"] = max(in_flight["max"], in_flight["now"])
            await asyncio.sleep(0.02)
            in_flight["now"] -= 1
            return await original(**kwargs)

        litellm_acompletion = litellm.acompletion
        litellm.acompletion = slow
        try:
            await asyncio.gather(*(gw.complete(stage="rollout", model="openai/gpt-4o-mini",
                                               messages=[{"role": "user", "content": str(i)}]) for i in range(8)))
        finally:
            litellm.acompletion = litellm_acompletion

    asyncio.run(main())
    assert in_flight["max"] == 2


def test_latex_written_into_json_unescaped_comes_back_intact():
    decoded = extract_json('{"t": "so \\boxed{6}, \\frac{1}{2} and \u0001 done"}')["t"]
    assert "\b" in decoded  # what json makes of an unescaped \b
    assert clean_text(decoded) == "so \\boxed{6}, \\frac{1}{2} and  done"


def test_a_calls_latency_leaves_out_its_wait_for_a_concurrency_slot(engine):
    """Issue 41: LLMCall.latency_ms counted the time a call waited in our own queue for a slot, so beside
    three others on one slot a call read as four times slower than the model answered it. With one slot,
    calls run one after another: their own times add up to no more than the wall time they took together."""
    import time

    def slow(messages):
        time.sleep(0.3)  # the model's own time, inside the slot
        return "4"

    gw = Gateway(engine, mock=ScriptedModel({"rollout": slow}), concurrency=1)

    async def three() -> list:
        return await asyncio.gather(*(gw.complete(stage="rollout", model="openai/gpt-4o-mini", messages=MSG,
                                                  sample_index=i) for i in range(3)))

    began = time.perf_counter()
    results = asyncio.run(three())
    wall_ms = (time.perf_counter() - began) * 1000
    latencies = [r.latency_ms for r in results]
    assert all(latency >= 290 for latency in latencies), latencies  # each holds its own 0.3 s
    assert sum(latencies) <= wall_ms + 50, (latencies, wall_ms)  # counting the queue: about 0.3 + 0.6 + 0.9 s
    assert sorted(r.latency_ms for r in ledger(engine)) == sorted(latencies)
