"""bench/stub_server.py: the OpenAI-compatible stub the engine benchmarks run against."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time

import aiohttp
import pytest

from bench.stub_server import ALL_FAULTS, StubServer, request_key
from core.domain.prompts import summary_messages, update_messages
from core.domain.replies import AdvantageReply, JudgeReply, update_reply
from core.records.tasks.demo_data import demo_rows


def _body(content: str = "What is 2 + 3?", **extra) -> dict:
    return {"model": "stub", "messages": [{"role": "system", "content": "Solve it."}, {"role": "user", "content": content}],
            "temperature": 0.7, "max_tokens": 64, **extra}


async def _post(url: str, body: dict, timeout: float = 5.0) -> tuple[int | str, dict, str]:
    """(status or the exception's name, headers, text) of one request."""
    async with aiohttp.ClientSession() as session:
        try:
            async with session.post(f"{url}/chat/completions", json=body,
                                    timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                return response.status, dict(response.headers), await response.text()
        except (TimeoutError, aiohttp.ClientError) as exc:
            return type(exc).__name__, {}, ""


def _post_all(url: str, bodies: list[dict], timeout: float = 5.0) -> list[tuple[int | str, dict, str]]:
    async def run() -> list:
        results = []
        for body in bodies:  # one after another, so the script's order is the arrival order
            results.append(await _post(url, body, timeout))
        return results

    return asyncio.run(run())


def _schema_format(name: str, reply) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": reply.prompt_schema(), "strict": True}}


def test_script_outcomes_statuses_retry_after_and_log():
    script = ["ok", "429", "500", "503", "reset", "bad_body", "timeout"]
    with StubServer(script=script, hang_s=0.3, retry_after_s=0.25) as stub:
        assert stub.url.startswith("http://127.0.0.1:") and stub.url.endswith("/v1")
        started = time.time()
        results = _post_all(stub.url, [_body(f"What is {i} + 1?") for i in range(len(script) + 1)])
        log = stub.requests()
    statuses = [r[0] for r in results]
    assert statuses[:4] == [200, 429, 500, 503]
    assert statuses[4] in ("ClientOSError", "ServerDisconnectedError")  # the connection was reset, no reply
    assert statuses[5] == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(results[5][2])
    assert statuses[6] == "ServerDisconnectedError"  # held 0.3 s, then closed without an answer
    assert statuses[7] == 200  # beyond the script: ok
    assert results[1][1]["Retry-After"] == "0.25"
    assert json.loads(results[1][2])["error"]["type"] == "rate_limit_error"
    assert "Retry-After" not in results[2][1]
    reply = json.loads(results[0][2])
    assert reply["object"] == "chat.completion" and reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["choices"][0]["finish_reason"] == "stop"
    usage = reply["usage"]
    assert usage["prompt_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert [r["outcome"] for r in log] == [*script, "ok"]
    assert [r["status"] for r in log] == [200, 429, 500, 503, None, 200, None, 200]
    assert all(r["stage"] == "rollout" and r["model"] == "stub" for r in log)
    assert [r["key"] for r in log] == [request_key(_body(f"What is {i} + 1?")) for i in range(len(script) + 1)]
    assert all(started - 1 <= r["t"] <= time.time() for r in log)
    assert log == sorted(log, key=lambda r: r["t"])


def test_reset_really_aborts_the_connection():
    with StubServer(script=["reset", "reset"]) as stub:
        async def raw() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", stub.port)
            payload = json.dumps(_body()).encode()
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            await writer.drain()
            try:
                return await asyncio.wait_for(reader.read(), timeout=5)
            except ConnectionResetError:
                return b"RESET"
            finally:
                writer.close()

        assert asyncio.run(raw()) in (b"RESET", b"")  # never an HTTP response
        assert _post_all(stub.url, [_body()])[0][0] in ("ClientOSError", "ServerDisconnectedError")
        assert [r["outcome"] for r in stub.requests()] == ["reset", "reset"]


def test_structured_stages_get_valid_json_and_bad_reply_does_not():
    advantage = _body("Compare the attempts.", response_format=_schema_format("advantage", AdvantageReply))
    experiences = [{"id": "E1", "text": "Read the question twice before answering it."}]
    update = {**_body(), "messages": update_messages(experiences, ["Check the units."], 30),
              "response_format": _schema_format("update", update_reply())}
    judge = _body("Judge this.", response_format=_schema_format("judge", JudgeReply))
    judge["messages"][0]["content"] = 'Reply with JSON only: {"reason": "...", "score": <integer 1-5>, "confident": true}'
    with StubServer(script=["ok", "ok", "ok", "ok", "bad_reply", "bad_reply"]) as stub:
        update_other = {**update, "seed": 7}
        results = _post_all(stub.url, [advantage, update, update_other, judge, advantage, _body()])
        log = stub.requests()
    texts = [json.loads(r[2])["choices"][0]["message"]["content"] for r in results]
    assert AdvantageReply.model_validate_json(texts[0]).experiences
    ops = update_reply().model_validate_json(texts[1]).operations
    assert len(ops) == 1 and ops[0].op == "ADD" and ops[0].text
    assert update_reply().model_validate_json(texts[2]).operations[0].text != ops[0].text  # depends on the request
    assert 1 <= JudgeReply.model_validate_json(texts[3]).score <= 5
    with pytest.raises(ValueError):
        AdvantageReply.model_validate_json(texts[4])
    assert "\\boxed{" in texts[5]  # a bad_reply without response_format is an ordinary reply
    assert [r["stage"] for r in log] == ["advantage", "update", "update", "judge", "advantage", "rollout"]
    assert [r["outcome"] for r in log] == ["ok", "ok", "ok", "ok", "bad_reply", "ok"]
    assert all(r[0] == 200 for r in results)


def _agent_seed(query: str, g: int) -> int:
    return int(hashlib.sha256(f"{query}\x00{g}\x000".encode()).hexdigest()[:8], 16) % (2**31 - 1)


def test_rollouts_are_mixed_per_group_and_summaries_are_recognised():
    row = demo_rows()[0]
    rollouts = [{**_body(row.query), "seed": _agent_seed(row.query, g)} for g in range(5)]
    summary = {**_body(), "messages": summary_messages(row.query, row.reference, 1.0, [], "Agent: 2", True)}
    with StubServer() as stub:
        results = _post_all(stub.url, [*rollouts, summary])
        log = stub.requests()
    texts = [json.loads(r[2])["choices"][0]["message"]["content"] for r in results]
    right = [f"\\boxed{{{row.reference}}}" in text for text in texts[:5]]
    assert right == [True, False, True, False, True]
    assert all(text.rstrip().endswith("}") for text in texts[:5])
    assert "\\boxed" not in texts[5]
    assert [r["stage"] for r in log] == ["rollout"] * 5 + ["summary"]


def test_latency_is_concurrent_and_the_log_resets():
    with StubServer(latency_s=0.5, retry_after_s=None, fault_rate=1.0, faults=("429",)) as stub:
        async def many() -> list:
            async with aiohttp.ClientSession() as session:
                async def one(i: int) -> tuple[int, dict]:
                    async with session.post(f"{stub.url}/chat/completions", json=_body(str(i))) as response:
                        return response.status, dict(response.headers)

                return await asyncio.gather(*(one(i) for i in range(100)))

        started = time.perf_counter()
        results = asyncio.run(many())
        assert time.perf_counter() - started < 3.0  # 100 requests at 0.5 s each, all in flight at once
        assert all(status == 429 and "Retry-After" not in headers for status, headers in results)
        assert len(stub.requests()) == 100
        stub.reset_log()
        assert stub.requests() == []
        _post_all(stub.url, [_body()])
        assert [r["outcome"] for r in stub.requests()] == ["429"]


def test_seeded_fault_rate_draws_every_kind():
    # Every request must reach the stub: no pool to wait in, and a client timeout well past the stub's
    # hang, so a busy machine (CI) cannot time requests out before they are sent.
    with StubServer(fault_rate=0.5, seed=3, hang_s=0.2) as stub:
        async def many() -> None:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                async def one(i: int) -> None:
                    try:
                        async with session.post(f"{stub.url}/chat/completions", json=_body(str(i)),
                                                timeout=aiohttp.ClientTimeout(total=60)) as response:
                            await response.read()
                    except (TimeoutError, aiohttp.ClientError):
                        pass

                await asyncio.gather(*(one(i) for i in range(300)))

        asyncio.run(many())
        outcomes = [r["outcome"] for r in stub.requests()]
    assert len(outcomes) == 300
    assert 100 < outcomes.count("ok") < 200
    assert set(outcomes) - {"ok", "bad_reply"} == set(ALL_FAULTS) - {"bad_reply"}  # bad_reply needs a schema


def test_unknown_fault_is_refused():
    with pytest.raises(ValueError):
        StubServer(script=["ok", "teapot"])


def test_models_are_listed_unlogged_and_draw_no_fault():
    from core.models.connections import fetch_models

    with StubServer(models=("alpha", "beta-7b"), script=["500"]) as stub:
        assert fetch_models(stub.url) == ["alpha", "beta-7b"]
        assert stub.requests() == []  # a listing is not a model call: no log line, no scripted outcome used
        [(status, _headers, _text)] = _post_all(stub.url, [_body()])
    assert status == 500  # the script's first outcome went to the first chat request
