"""A worker killed in the middle of conversations: the next worker continues each one at its next turn and
pays for no completed turn again (a real `python -m core worker` process, SIGKILL, a model stub on loopback)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

from sqlmodel import Session, select

from bench.stub_server import StubServer
from core.grpo.training import RunSettings, create_run
from core.records.tasks.demos import CONVERSATION_TASK, ensure_conversation_task
from core.records.tasks.lookup import get_task
from storage.db import session_scope, url_with_password
from storage.tables import ConversationTurn, LLMCall, Run
from tests.ui_support import ROOT

MODEL = "openai/stub"


def worker(engine, **settings: str) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": url_with_password(engine), "PYTHONPATH": str(ROOT), **settings}
    return subprocess.Popen([sys.executable, "-m", "core", "worker", "--poll", "0.2"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def turns(engine) -> list[ConversationTurn]:
    with Session(engine) as session:
        return list(session.exec(select(ConversationTurn).order_by(ConversationTurn.id)))


def wait_for(condition, timeout: float = 90, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_killed_worker_resumes_conversations_at_their_next_turn(engine):
    ensure_conversation_task(engine)
    with session_scope(engine) as session:
        task = get_task(session, CONVERSATION_TASK)
        task.judge_model = MODEL
        task.reward_settings = {**task.reward_settings, "spot_check_share": 0.0}
        session.add(task)
    with StubServer(latency_s=0.3) as stub:
        run_id = create_run(engine, CONVERSATION_TASK, RunSettings(
            epochs=1, batch_size=1, group_size=2, limit=1, gate="off", max_turns=4, policy_model=MODEL,
            learner_model=MODEL, api_base=stub.url, concurrency=2), created_by="system")
        first = worker(engine)
        try:
            wait_for(lambda: len(turns(engine)) >= 6, what="six turns stored")  # mid-conversation, both groups
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        before = turns(engine)
        spoken_before = [t for t in before if t.position > 0]  # the openings are the scenario's, not a call
        with Session(engine) as session:
            calls_before = len(session.exec(select(LLMCall)).all())
        requests_before = len(stub.requests())

        # the killed worker's run counts as stalled after TFGRPO_STALL_AFTER_S without a heartbeat (30 s by
        # default; the takeover's rule is tests/test_fencing.py's): 5 s, above the 3 s heartbeat, keeps the wait short
        second = worker(engine, TFGRPO_STALL_AFTER_S="5")
        try:
            def settled() -> bool:
                with Session(engine) as session:
                    return session.get(Run, run_id).status not in ("queued", "running")
            wait_for(settled, timeout=120, what="the run to settle after the restart")
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=30)
        requests = stub.requests()

    after = turns(engine)
    assert [(t.id, t.text) for t in after[:len(before)]] == [(t.id, t.text) for t in before]  # kept as they were
    conversations = Counter((t.group_index) for t in after)
    assert len(conversations) == 2 and all(count == 8 for count in conversations.values())  # 4 agent turns each
    agent_and_user = [r for r in requests if r["stage"] == "rollout" and r["outcome"] == "ok"]
    repeated = {key for key, n in Counter(r["key"] for r in agent_and_user).items() if n > 1}
    # Only a call in flight at the kill (answered, but the worker died before storing the turn) is asked again:
    # at most one per conversation, each among the last requests before the kill. No completed turn is repaid.
    last_before = {r["key"] for r in [r for r in requests[:requests_before] if r["stage"] == "rollout"][-2:]}
    assert len(repeated) <= 2 and repeated <= last_before, (repeated, last_before)
    # The completed turns came back from the conversation's own storage, not from the call cache: at most the
    # calls in flight at the kill (one per conversation) can be cache hits.
    with Session(engine) as session:
        new_calls = session.exec(select(LLMCall).order_by(LLMCall.id)).all()[calls_before:]
    replayed = [c for c in new_calls if c.cache_hit and c.stage in ("rollout", "simulator")]
    assert len(replayed) <= 2 < len(spoken_before)
    assert len(requests) > requests_before  # the second worker did the rest
