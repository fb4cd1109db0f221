"""End to end on the real embedded model (Qwen2.5-Coder-0.5B through xllamacpp), through the CLI.

The training run uses `--no-ground-truth` so that every group reaches the learner: with ground
truth, a 2x2 run on easy problems often has only all-right or all-wrong groups, which the paper's
filter skips, and then no new version would be expected.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func
from sqlmodel import Session, select

from core.tasks import DEMO_TASK
from storage.db import make_engine
from storage.models import LibraryVersion, LLMCall, Rollout, Run

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parent.parent
TRAIN = ["train", "--task", DEMO_TASK, "--limit", "2", "--group-size", "2", "--epochs", "1", "--batch-size", "2",
         "--no-ground-truth"]


def cli(url: str, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "core", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'e2e.db'}"
    assert cli(url, "demo").returncode == 0
    return url


def test_train_and_eval_on_the_embedded_model(url):
    result = cli(url, *TRAIN)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "run 1: completed" in result.stdout
    engine = make_engine(url)
    with Session(engine) as s:
        run = s.get(Run, 1)
        version = s.get(LibraryVersion, run.current_version_id)
        assert version.number == 2 and version.source == "run" and version.experiences
        assert f"version {version.id} (#2, run)" in result.stdout
        calls = s.exec(select(LLMCall).where(LLMCall.run_id == run.id)).all()
        by_stage = {stage: sum(1 for c in calls if c.stage == stage) for stage in {c.stage for c in calls}}
        rollouts = s.exec(select(Rollout)).all()
        assert len(rollouts) == 4 and all(r.response for r in rollouts)
        # every model call has its ledger row: one per rollout, per summary, per group, per batch
        assert by_stage["rollout"] == 4
        assert by_stage["summary"] == sum(1 for r in rollouts if r.summary) == 4
        assert by_stage["advantage"] >= 2 and by_stage["update"] >= 1
        assert all(c.model == "local/qwen2.5-coder-0.5b" and c.cost == 0 for c in calls)
        assert all(c.tokens_out > 0 for c in calls if not c.cache_hit and c.error is None)

    result = cli(url, "eval", "--task", DEMO_TASK, "--version", "latest", "--limit", "2", "--k", "2", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["k"] == 2 and report["n"] == 2 and report["status"] == "completed"
    assert 0.0 <= report["mean_at_k"] <= report["pass_at_k"] <= 1.0
    with Session(engine) as s:
        assert s.exec(select(func.count()).select_from(LLMCall).where(LLMCall.evaluation_id.is_not(None))).one() == 4


def _paid_calls(engine) -> list[LLMCall]:
    with Session(engine) as s:
        return list(s.exec(select(LLMCall).where(LLMCall.cache_hit.is_(False), LLMCall.error.is_(None))))


def test_killed_run_resumes_without_paying_again(url):
    engine = make_engine(url)
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "core", *TRAIN], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(_paid_calls(engine)) < 5:
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {c.cache_key for c in _paid_calls(engine)}
    with Session(engine) as s:
        assert s.get(Run, 1).status == "running"  # died without a chance to say so

    result = cli(url, "train", "--resume", "1")
    assert result.returncode == 0, result.stderr + result.stdout
    assert "run 1: completed" in result.stdout
    paid = _paid_calls(engine)
    keys = [c.cache_key for c in paid]
    assert len(keys) == len(set(keys)), "a completed call was paid for twice"
    assert done_before < set(keys)  # the resume did the remaining work, and only that
