"""The scoring process (core/domain/scoring.py): a costly regex or math score ends at its time limit as a 0 reward
with the reason, while other scores, the rollouts of a run and the process's other threads go on.

The catastrophic scores run in a child Python (`scenario`), so a regression that scored them in this
process again fails the test after a minute instead of hanging the suite (they hold the GIL for hours).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core.domain import scoring
from core.domain.rewards import METHODS, Method, RewardResult, score, score_or_error

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 1.5  # short limits keep these tests fast
MARGIN_S = 1.5  # a busy two-core machine is slow to schedule; a score held in this process takes minutes
TIMED_OUT = RewardResult(0.0, "error", f"scoring timed out after {LIMIT_S:g} s: the pattern or answer is too costly")
CATASTROPHIC = ("regex", "a" * 40 + "!", None, {"pattern": "(a+)+$"})  # settings as stored: no validation
POWER_TOWER = ("math", r"The answer is \boxed{9^{9^{9^{9}}}}", "12", None)


def _hog(response: str, reference: str, settings: dict) -> RewardResult:
    """A scorer that takes `response` MB of memory, or ends its process on "exit" (isolated test methods
    live at module level: the scoring process imports them by name)."""
    if response == "exit":
        os._exit(3)
    return RewardResult(1.0, "verifier", f"held {len(bytearray(int(response) * 1024 * 1024)):,} bytes")


def _length(response: str, reference: str, settings: dict) -> RewardResult:
    return RewardResult(1.0, "verifier", f"read {len(response):,} characters ending {response[-3:]}")


@pytest.fixture(scope="module")
def limits():
    """Short limits and three warm scoring processes; the previous limits come back afterwards."""
    before = scoring.configure(time_limit_s=LIMIT_S, processes=3)
    scoring.start()
    yield
    scoring.configure(time_limit_s=before.time_s, memory_limit_mb=before.memory_mb, processes=before.processes)


@pytest.fixture
def test_methods(monkeypatch):
    monkeypatch.setitem(METHODS, "hog", Method("hog", "takes memory", scorer=_hog, isolated=True))
    monkeypatch.setitem(METHODS, "length", Method("length", "reads the response", scorer=_length, isolated=True))


def scenario() -> None:
    """Two catastrophic scores on their own threads while this thread keeps scoring and a ticker thread keeps
    ticking; prints what happened as JSON (run by test_costly_scores_time_out_while_everything_else_goes_on)."""
    scoring.configure(time_limit_s=LIMIT_S, processes=3)
    scoring.start()
    ticks: list[float] = []
    done = threading.Event()

    def tick() -> None:
        while not done.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.1)

    slow: dict[str, list] = {}

    def costly(name: str, args: tuple) -> None:
        started = time.monotonic()
        result = score_or_error(*args)
        slow[name] = [time.monotonic() - started, result.value, result.source, result.detail]

    threading.Thread(target=tick, daemon=True).start()
    threads = [threading.Thread(target=costly, args=item) for item in (("regex", CATASTROPHIC),
                                                                       ("math", POWER_TOWER))]
    for thread in threads:
        thread.start()
    others, slowest = [], 0.0
    while any(thread.is_alive() for thread in threads):
        for args in (("regex", "Order #A-1234 shipped", r"#[A-Z]-\d{4}"), ("math", r"\boxed{12}", "12"),
                     ("exact", "Answer: 12", "12")):
            started = time.monotonic()
            others.append(score(*args).value)
            slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.05)
    done.set()
    after = [score("math", r"\boxed{\frac{3}{4}}", "0.75").value, score("regex", "aaa", None, {"pattern": "(a+)+$"}).value]
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    print(json.dumps({"slow": slow, "others": others, "slowest_other": slowest, "max_tick_gap": max(gaps),
                      "after": after}))


def test_costly_scores_time_out_while_everything_else_goes_on():
    code = "from tests.test_scoring import scenario; scenario()"
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the costly scores were not stopped: they ran for more than 60 s")
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("regex", "math"):
        elapsed, *result = seen["slow"][name]
        assert RewardResult(*result) == TIMED_OUT, name
        assert elapsed < LIMIT_S + MARGIN_S, f"{name} took {elapsed:.2f} s"
    assert len(seen["others"]) >= 6 and set(seen["others"]) == {1.0}  # every other score completed meanwhile
    assert seen["slowest_other"] < 0.5, seen
    assert seen["max_tick_gap"] < 0.5, seen  # the GIL stayed free: the ticker thread kept its 0.1 s beat
    assert seen["after"] == [1.0, 1.0]  # fresh processes took over


def test_a_rollout_of_a_costly_pattern_stores_the_timeout_and_the_others_are_scored(limits):
    from core.grpo.rollouts import _assign_reward
    from storage.tables import Rollout, Sample, Task

    costly = Task(id=1, name="t", reward_method="regex", reward_settings={"pattern": "(a+)+$"})  # as stored
    plain = Task(id=2, name="u", reward_method="regex", reward_settings={"pattern": r"\d+"})
    # 26 a's: about 6 s in this process before, so the test fails rather than hangs on unisolated scoring
    rows = [Rollout(sample_id=1, group_index=0, response="a" * 26 + "!")] + [
        Rollout(sample_id=1, group_index=i, response=f"answer {i}") for i in range(1, 5)]

    async def score_all() -> float:
        started = time.monotonic()
        await asyncio.gather(*(_assign_reward(None, costly if i == 0 else plain, Sample(id=1, task_id=1, query="q"),
                                              row, None, 0) for i, row in enumerate(rows)))
        return time.monotonic() - started

    elapsed = asyncio.run(score_all())
    assert (rows[0].reward, rows[0].reward_source, rows[0].reward_detail) == (
        TIMED_OUT.value, TIMED_OUT.source, TIMED_OUT.detail)
    assert [(r.reward, r.reward_source) for r in rows[1:]] == [(1.0, "verifier")] * 4
    assert elapsed < LIMIT_S + MARGIN_S


def test_running_out_of_memory_is_a_zero_with_the_reason_and_the_next_score_works(limits, test_methods):
    before = scoring.configure(memory_limit_mb=200)
    try:
        assert score("hog", "10", "x").value == 1.0
        assert score("hog", "400", "x") == RewardResult(
            0.0, "error", "scoring ran out of memory (limit 200 MB): the pattern or answer is too costly")
        assert score("hog", "10", "x").value == 1.0
    finally:
        scoring.configure(memory_limit_mb=before.memory_mb)


def test_a_scoring_process_that_dies_is_a_zero_with_the_reason_and_is_replaced(limits, test_methods):
    died = score("hog", "exit", "x")
    assert (died.value, died.source) == (0.0, "error")
    assert died.detail == ("scoring process stopped during the score (exit code 3; memory limit 512 MB): "
                           "the pattern or answer is too costly")
    assert score("hog", "1", "x").value == 1.0


def test_concurrent_scores_get_their_own_results(limits):
    results: dict[int, float] = {}

    def work(i: int) -> None:
        results[i] = score("math", rf"\boxed{{{i}}}", str(i if i % 2 else i + 1)).value

    threads = [threading.Thread(target=work, args=(i,)) for i in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results == {i: float(i % 2) for i in range(24)}


def test_the_scorer_reads_only_the_end_of_an_overlong_response(limits, test_methods):
    result = score("length", "x" * 30_000 + "END", "x")
    assert result.detail == "read 20,000 characters ending END (scored the last 20,000 of 30,003 characters)"
    assert score("length", "short", "x").detail == "read 5 characters ending ort"


def test_a_configuration_mistake_inside_the_scoring_process_still_raises(limits):
    with pytest.raises(ValueError, match="invalid regular expression"):
        score("regex", "text", "([unclosed")
    assert score_or_error("regex", "text", "([unclosed").source == "error"


def test_limits_are_checked():
    before = scoring.limits()
    for bad in ({"time_limit_s": 0}, {"memory_limit_mb": 10}, {"processes": 0}):
        with pytest.raises(ValueError, match="scoring limits must be"):
            scoring.configure(**bad)
    assert scoring.limits() == before
    assert (scoring.TIME_LIMIT_S, scoring.MEMORY_LIMIT_MB, scoring.MAX_TEXT_CHARS) == (5.0, 512, 20_000)


def test_a_scorer_the_process_cannot_import_is_refused():
    def local(response: str, reference: str, settings: dict) -> RewardResult:
        return RewardResult(1.0, "verifier", "")

    with pytest.raises(TypeError, match="module-level function"):
        scoring.score_in_child(local, "x", "y", {})


def _children_pids() -> set[int]:
    pool = scoring._current_pool()
    return {child.proc.pid for child in [*pool._idle, *pool._busy]}


def test_the_same_limits_keep_the_scoring_processes_and_new_limits_replace_them():
    """The app configures scoring on every start of its cached resources (each AppTest): unchanged limits
    must not kill the warm children, which a new score would pay 1 to 1.5 s to start again."""
    before = scoring.configure(time_limit_s=LIMIT_S, processes=1)
    try:
        scoring.start()
        warm = _children_pids()
        assert len(warm) == 1
        scoring.configure(time_limit_s=LIMIT_S, processes=1)
        assert _children_pids() == warm
        scoring.configure(time_limit_s=LIMIT_S + 1, processes=1)
        scoring.start()
        assert _children_pids().isdisjoint(warm) and len(_children_pids()) == 1
    finally:
        scoring.configure(time_limit_s=before.time_s, memory_limit_mb=before.memory_mb, processes=before.processes)


def test_a_batch_of_scores_gives_each_its_own_result_and_a_costly_one_only_its_timeout(limits):
    from core.domain.rewards import scores_or_errors

    answers = [("aaa", None), ("a" * 26 + "!", None), ("b", None), ("aaaa", None)]
    results = scores_or_errors("regex", answers, {"pattern": "(a+)+$"})  # as stored: no validation
    assert [(r.value, r.source) for r in results] == [(1.0, "verifier"), (0.0, "error"), (0.0, "verifier"),
                                                      (1.0, "verifier")]
    assert results[1] == TIMED_OUT
    assert scores_or_errors("math", [(r"\boxed{3}", "3"), (r"\boxed{4}", ""), (r"\boxed{5}", "6")]) == [
        RewardResult(1.0, "verifier", "correct: expected 3, got 3"),
        RewardResult(0.0, "error", "reward method 'math' needs a reference answer"),
        RewardResult(0.0, "verifier", "wrong: expected 6, got 5")]


def test_a_process_that_dies_inside_a_batch_fails_only_that_score(limits, test_methods):
    from core.domain.rewards import scores_or_errors

    results = scores_or_errors("hog", [("1", "x"), ("exit", "x"), ("2", "x")])
    assert [(r.value, r.source) for r in results] == [(1.0, "verifier"), (0.0, "error"), (1.0, "verifier")]
    assert results[1].detail.startswith("scoring process stopped during the score (exit code 3")
    long = scores_or_errors("length", [("x" * 30_000 + "END", "x"), ("short", "x")])
    assert [r.detail for r in long] == [
        "read 20,000 characters ending END (scored the last 20,000 of 30,003 characters)", "read 5 characters ending ort"]


def test_the_rollouts_scored_together_take_one_round_trip_per_scoring_process(limits, monkeypatch):
    from core.grpo.rollouts import _assign_reward
    from storage.tables import Rollout, Sample, Task

    trips: list[int] = []
    request = scoring._Child.request
    monkeypatch.setattr(scoring._Child, "request", lambda self, *args: trips.append(1) or request(self, *args))
    task = Task(id=1, name="t", reward_method="math", reward_settings={})
    rows = [Rollout(sample_id=1, group_index=i, response=rf"so the answer is \boxed{{{i}}}") for i in range(12)]

    async def score_all() -> None:
        await asyncio.gather(*(_assign_reward(None, task, Sample(id=1, task_id=1, query="q", reference="4"), row,
                                              None, 0) for row in rows))

    asyncio.run(score_all())
    assert [r.reward for r in rows] == [1.0 if i == 4 else 0.0 for i in range(12)]
    assert len(trips) <= scoring.limits().processes  # a round trip each was 12
