"""Paired comparison statistics, checked against values computed independently."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from core.errors import InvalidInput
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.records.evaluation.comparison import (
    bootstrap_interval,
    compare_evaluations,
    mcnemar_exact,
    paired,
    sign_test,
)
from core.records.tasks.demos import DEMO_TASK
from storage.db import url_with_password


def test_sign_test_is_scipys_two_sided_binomial_test():
    assert sign_test(9, 2) == pytest.approx(binomtest(9, 11, 0.5, alternative="two-sided").pvalue)
    assert sign_test(9, 2) == pytest.approx(0.06542969, abs=1e-8)  # 2 * sum(C(11,i), i<=2) / 2**11
    assert sign_test(0, 0) == 1.0


def test_mcnemar_exact_counts_only_discordant_queries():
    # 1 query passed only under A, 7 only under B: p = 2 * (C(8,0)+C(8,1)) / 2**8
    assert mcnemar_exact(1, 7) == pytest.approx(2 * (1 + 8) / 256)
    assert mcnemar_exact(0, 0) == 1.0


def test_b_better_on_every_query_gives_an_interval_above_zero_and_says_so():
    a = {q: [0.0, 0.0] for q in range(12)}
    b = {q: [1.0, 1.0] if q % 2 else [1.0, 0.0] for q in range(12)}
    result = paired(a, b, k=2)
    assert result.n == 12 and (result.wins, result.losses, result.ties) == (12, 0, 0)
    assert result.delta == pytest.approx(0.75)
    assert 0.5 <= result.ci_low <= 0.75 <= result.ci_high <= 1.0
    assert result.p_value == pytest.approx(binomtest(12, 12, 0.5).pvalue)
    assert result.pass_a == 0.0 and result.pass_b == 1.0
    assert result.mcnemar_p == pytest.approx(binomtest(12, 12, 0.5).pvalue)
    assert result.decided and result.verdict.startswith("B is better")


def test_b_worse_says_so():
    a = {q: [1.0] for q in range(10)}
    b = {q: [0.0] if q < 8 else [1.0] for q in range(10)}
    result = paired(a, b)
    assert result.ci_high < 0 and result.verdict.startswith("B is worse")


def test_identical_evaluations_differ_by_zero_with_p_one():
    a = {q: [float(q % 2), 1.0] for q in range(20)}
    result = paired(a, dict(a), k=2)
    assert result.delta == 0 and (result.ci_low, result.ci_high) == (0, 0)
    assert result.p_value == 1.0 and result.mcnemar_p == 1.0 and result.ties == 20
    assert result.verdict.startswith("no detectable difference on 20 queries")
    # Equal differences have no spread; the detectable difference falls back to two means of k binary rewards.
    assert result.detectable == pytest.approx(2.801585 * math.sqrt(2 * 0.75 * 0.25 / 2) / math.sqrt(20))


def test_one_query_cannot_decide():
    result = paired({1: [0.0]}, {1: [1.0]})
    assert not result.decided and result.verdict == "cannot decide: only 1 query in common"


def test_only_common_queries_are_compared():
    result = paired({1: [0.0], 2: [0.0], 3: [1.0]}, {2: [1.0], 3: [1.0], 4: [0.0]})
    assert result.n == 2 and result.wins == 1 and result.ties == 1


def test_bootstrap_is_seeded_and_close_to_the_normal_interval():
    rng = np.random.default_rng(1)
    diffs = rng.normal(0.1, 0.3, size=200)
    first = bootstrap_interval(diffs, seed=3)
    assert first == bootstrap_interval(diffs, seed=3)
    half = 1.96 * diffs.std(ddof=1) / math.sqrt(len(diffs))
    assert first[0] == pytest.approx(diffs.mean() - half, abs=0.01)
    assert first[1] == pytest.approx(diffs.mean() + half, abs=0.01)


def test_compare_evaluations_refuses_different_k(engine, demo_task, scripted):
    _model, gateway = scripted(engine)
    a = create_evaluation(engine, DEMO_TASK, "empty", k=1, limit=3)
    b = create_evaluation(engine, DEMO_TASK, "empty", k=2, limit=3)
    with pytest.raises(InvalidInput, match="same k"):
        compare_evaluations(engine, a, b)


def test_compare_evaluations_on_stored_rollouts(engine, demo_task, scripted):
    a = create_evaluation(engine, DEMO_TASK, "empty", k=2, limit=3)
    assert execute_evaluation(engine, a, gateway=scripted(engine)[1]).status == "completed"
    b = create_evaluation(engine, DEMO_TASK, "empty", k=2, limit=4)
    assert execute_evaluation(engine, b, gateway=scripted(engine)[1]).status == "completed"
    result = compare_evaluations(engine, a, b)
    assert result.stats.n == 3 and result.only_b == 1 and "left out" in result.note
    assert result.stats.delta == 0 and len(result.rows) == 4


def test_two_versions_draw_the_same_seed_per_query_and_sample(engine, demo_task, scripted, monkeypatch):
    """Common random numbers: the library is the only difference between two evaluations."""
    import core.models.gateway as gateway_module
    from core.records.library.versions import import_library

    seen: dict[str, list[tuple[str, int]]] = {}
    real = gateway_module.providers().acompletion

    async def spy(**kwargs):
        system, query = kwargs["messages"][0]["content"], kwargs["messages"][1]["content"]
        seen.setdefault("with library" if "Re-read" in system else "empty", []).append((query, kwargs["seed"]))
        return await real(**kwargs)

    monkeypatch.setattr(gateway_module.providers(), "acompletion", spy)
    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "lib.md")
    for ref in ("empty", str(version.number)):
        _model, gateway = scripted(engine)  # a gateway's semaphores belong to one event loop
        execute_evaluation(engine, create_evaluation(engine, DEMO_TASK, ref, k=2, limit=3), gateway=gateway)
    assert len(seen["empty"]) == len(seen["with library"]) == 6
    assert sorted(seen["empty"]) == sorted(seen["with library"])
    by_query: dict[str, set[int]] = {}
    for query, seed in seen["empty"]:
        by_query.setdefault(query, set()).add(seed)
    assert all(len(seeds) == 2 for seeds in by_query.values())  # sample 0 and sample 1 differ


def test_cli_compare_prints_the_paired_figures_and_reuses_evaluations(engine, demo_task, scripted, capsys):
    import json

    from core.cli import main
    from core.records.library.versions import import_library

    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "lib.md")
    ids = []
    for ref in ("empty", str(version.number)):
        ids.append(create_evaluation(engine, DEMO_TASK, ref, k=2, limit=4))
        execute_evaluation(engine, ids[-1], gateway=scripted(engine)[1])
    url = url_with_password(engine)
    assert main(["--db", url, "compare", "--task", DEMO_TASK, "empty", str(version.number), "--k", "2",
                 "--limit", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["evaluation_a"], out["evaluation_b"]) == tuple(ids)  # reused, nothing run again
    assert out["n_queries"] == 4 and out["k"] == 2 and out["delta"] == 0 and out["p_value"] == 1.0
    assert out["verdict"].startswith("no detectable difference on 4 queries")
    assert main(["--db", url, "compare", "--task", DEMO_TASK, f"e{ids[0]}", f"e{ids[1]}"]) == 0
    text = capsys.readouterr().out
    assert "B - A +0.000" in text and "sign test p = 1" in text and "no detectable difference" in text
    assert main(["--db", url, "compare", "--task", DEMO_TASK, "e999", f"e{ids[1]}"]) == 2
