"""A `python -m core train` process killed in the middle of a run (SIGKILL): `train --resume` finishes the run and
pays for no completed call again (real processes, the model a stub with latency on loopback, so the kill lands
mid-run). The same for a worker in the middle of conversations: tests/test_conversation_kill.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

from sqlmodel import Session, select

from bench.stub_server import StubServer
from core.records.tasks.demos import DEMO_TASK, ensure_demo_task
from storage.db import url_with_password
from storage.tables import LLMCall, Run
from tests.ui_support import ROOT

MODEL = "openai/stub"
CONCURRENCY = 2
# 2 queries x G=2 without ground truth (every group reaches the learner) and without the gate: 4 rollouts,
# 4 summaries, 2 advantages and 1 update, 2 calls at a time, each answered after the stub's latency
TRAIN = ["train", "--task", DEMO_TASK, "--limit", "2", "--group-size", "2", "--epochs", "1", "--batch-size", "2",
         "--no-ground-truth", "--gate", "off", "--hold-flagged", "off", "--model", MODEL, "--learner-model", MODEL,
         "--concurrency", str(CONCURRENCY)]
HANG_S = 120  # against a hang, not a speed check


def paid_calls(engine) -> list[LLMCall]:
    with Session(engine) as s:
        return list(s.exec(select(LLMCall).where(LLMCall.cache_hit.is_(False), LLMCall.error.is_(None))))


def test_killed_run_resumes_without_paying_again(engine):
    """Moved off the real model (it was test_model_e2e.py::test_killed_run_resumes_without_paying_again): that no
    call is paid twice holds for any model; the embedded model's path through `train` is
    test_model_e2e.py::test_train_and_eval_on_the_embedded_model."""
    ensure_demo_task(engine)
    env = {**os.environ, "DATABASE_URL": url_with_password(engine), "PYTHONPATH": str(ROOT)}
    with StubServer(latency_s=0.5) as stub:
        proc = subprocess.Popen([sys.executable, "-m", "core", *TRAIN, "--api-base", stub.url], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + HANG_S
            while len(paid_calls(engine)) < 5:  # the rollouts and a summary paid: mid-step
                assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()}"
                assert time.monotonic() < deadline
                time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stderr.close()
        done_before = {c.cache_key for c in paid_calls(engine)}
        requests_before = len(stub.requests())
        with Session(engine) as s:
            assert s.get(Run, 1).status == "running"  # died without a chance to say so

        result = subprocess.run([sys.executable, "-m", "core", "train", "--resume", "1"], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=HANG_S)
        requests = stub.requests()
    assert result.returncode == 0, result.stderr + result.stdout
    assert "run 1: completed" in result.stdout
    paid = paid_calls(engine)
    keys = [c.cache_key for c in paid]
    assert len(keys) == len(set(keys)), "a completed call was paid for twice"
    assert done_before < set(keys)  # the resume did the remaining work, and only that
    assert Counter(c.stage for c in paid) == {"rollout": 4, "summary": 4, "advantage": 2, "update": 1}
    # the provider saw a request again only if it was in flight at the kill (answered, not yet stored)
    repeated = [key for key, n in Counter(r["key"] for r in requests if r["outcome"] == "ok").items() if n > 1]
    assert len(repeated) <= CONCURRENCY and len(requests) > requests_before, repeated
