"""Paired comparison of two evaluations on the same queries: is B really better than A?

Two means with separate intervals hide what matters: both versions answered the same queries, so the
per-query differences carry the evidence. This module computes them, a seeded paired bootstrap
interval on their mean, an exact sign test on per-query wins and losses, an exact McNemar test on
Pass@k, the smallest difference the comparison could detect, and a verdict in words. The statistics
are pure functions; `compare_evaluations` reads two stored evaluations and is what the Evaluate page,
the CLI and the training gate call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.domain.metrics import SUCCESS
from core.errors import InvalidInput, NotFound
from core.settings import get_settings
from storage import queries
from storage.tables import Evaluation

if TYPE_CHECKING:  # numpy loads at the first comparison: the API imports this module (through promotion) for none
    import numpy as np

RESAMPLES = 10_000
ALPHA = 0.05  # the sign test's level; a difference is real when it and the bootstrap interval both say so
# Sum of the two-sided 5% and the 80%-power normal quantiles: a difference this many standard errors
# away from 0 is found four times in five.
DETECTABLE_Z = 1.959964 + 0.841621
# The figures that need at least one query answered k times under both A and B (Paired.figure).
NEEDS_A_QUERY = ("mean_a", "mean_b", "delta", "pass_a", "pass_b", "p_value", "mcnemar_p")


@dataclass(frozen=True)
class Paired:
    """The statistics of B - A over queries answered by both."""

    n: int
    mean_a: float
    mean_b: float
    delta: float
    ci_low: float
    ci_high: float
    p_value: float
    wins: int
    losses: int
    ties: int
    pass_a: float
    pass_b: float
    mcnemar_p: float
    detectable: float
    verdict: str
    undecided: str = ""  # why the comparison refuses to decide (too many queries without answers), or ""

    @property
    def decided(self) -> bool:
        """Whether the difference is real at the 95% level: the bootstrap interval excludes 0 and the sign
        test agrees (p < 0.05). On few queries the two can disagree; then nothing is decided."""
        return not self.undecided and significant(self.n, self.ci_low, self.ci_high, self.p_value)

    def figure(self, name: str):
        """A field of the comparison, or None where it could not be computed: the means, the difference, the
        Pass@k shares and the tests' p-values without a query answered k times under both; the interval and the
        smallest detectable difference (infinite in the fields) with fewer than two."""
        if self.n == 0 and name in NEEDS_A_QUERY:
            return None
        return finite(getattr(self, name))

    def as_dict(self) -> dict:
        """The figures as JSON can hold them: what could not be computed is None (Paired.figure)."""
        return {name: self.figure(name) for name in self.__dataclass_fields__}


def finite(value):
    """`value`, or None for a float that is not finite (PostgreSQL's JSON refuses Infinity and NaN)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def significant(n: int, low: float, high: float, p_value: float) -> bool:
    """Both the paired bootstrap interval and the sign test say the difference is real."""
    return n >= 2 and (low > 0 or high < 0) and p_value < ALPHA


def bootstrap_interval(diffs: np.ndarray, *, seed: int = 0, resamples: int = RESAMPLES) -> tuple[float, float]:
    """95% percentile interval of the mean of `diffs`, resampling queries with replacement (seeded)."""
    import numpy as np

    if len(diffs) == 0:
        return (0.0, 0.0)
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), size=(resamples, len(diffs)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return (float(low), float(high))


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test on per-query wins and losses (ties dropped); 1.0 with no untied query."""
    return _binomial_p(wins, wins + losses) if wins + losses else 1.0


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Exact McNemar test: queries passed under exactly one of A and B, two-sided; 1.0 when there are none."""
    return _binomial_p(only_b, only_a + only_b) if only_a + only_b else 1.0


def _binomial_p(successes: int, trials: int) -> float:
    """Two-sided exact binomial test against one half. scipy.stats is imported here, at the first
    comparison: importing it costs about 2 s, which every command and page that never compares would pay."""
    from scipy.stats import binomtest

    return float(binomtest(successes, trials, 0.5).pvalue)


def detectable_difference(diffs: np.ndarray, pooled_mean: float, k: int) -> float:
    """About the smallest true difference this comparison finds four times in five; infinite (no figure: Paired.figure
    gives None) with fewer than two queries.

    From the spread of the per-query differences; when they are all equal (often on few queries) from
    the spread two independent means of k binary rewards would have at the pooled mean instead, so the
    figure never claims a precision the data cannot have.
    """
    import numpy as np

    n = len(diffs)
    if n < 2:
        return math.inf
    sd = float(np.std(diffs, ddof=1))
    if sd == 0:
        p = min(max(pooled_mean, 0.05), 0.95)
        sd = math.sqrt(2 * p * (1 - p) / max(k, 1))
    return DETECTABLE_Z * sd / math.sqrt(n)


def verdict(n: int, delta: float, low: float, high: float, detectable: float, p_value: float = 0.0) -> str:
    """The comparison in words a product manager reads right."""
    if n == 0:
        return "cannot decide: no query was answered k times under both"
    if n < 2:
        return f"cannot decide: only {n} query in common"
    figures = f"{delta:+.3f} [{low:+.3f}, {high:+.3f}] on {n} queries"
    if significant(n, low, high, p_value):
        return f"B is {'better' if low > 0 else 'worse'}: {figures}, sign test p = {p_value:.3f}"
    if low > 0 or high < 0:
        return (f"no detectable difference on {n} queries: the interval {figures[figures.index('['):]} "
                f"excludes 0 but the sign test does not agree (p = {p_value:.2f}); more queries would settle it")
    return (f"no detectable difference on {n} queries (the smallest difference this comparison could detect "
            f"is about {detectable:.2f})")


def paired(a: dict, b: dict, *, k: int = 1, seed: int = 0, resamples: int = RESAMPLES) -> Paired:
    """Compare per-query rewards `a` and `b` ({query: [reward per sample]}) on the queries both have."""
    import numpy as np

    common = sorted(set(a) & set(b), key=str)
    mean_a = np.array([float(np.mean(a[q])) if len(a[q]) else 0.0 for q in common])
    mean_b = np.array([float(np.mean(b[q])) if len(b[q]) else 0.0 for q in common])
    pass_a = np.array([any(r >= SUCCESS for r in a[q]) for q in common], dtype=bool)
    pass_b = np.array([any(r >= SUCCESS for r in b[q]) for q in common], dtype=bool)
    diffs = mean_b - mean_a
    n = len(common)
    wins, losses = int((diffs > 0).sum()), int((diffs < 0).sum())
    low, high = bootstrap_interval(diffs, seed=seed, resamples=resamples) if n >= 2 else (-math.inf, math.inf)
    delta = float(diffs.mean()) if n else 0.0
    pooled = float((mean_a.mean() + mean_b.mean()) / 2) if n else 0.0
    detectable = detectable_difference(diffs, pooled, k)
    return Paired(
        n=n, mean_a=float(mean_a.mean()) if n else 0.0, mean_b=float(mean_b.mean()) if n else 0.0, delta=delta,
        ci_low=low, ci_high=high, p_value=sign_test(wins, losses), wins=wins, losses=losses, ties=n - wins - losses,
        pass_a=float(pass_a.mean()) if n else 0.0, pass_b=float(pass_b.mean()) if n else 0.0,
        mcnemar_p=mcnemar_exact(int((pass_a & ~pass_b).sum()), int((pass_b & ~pass_a).sum())),
        detectable=detectable, verdict=verdict(n, delta, low, high, detectable, sign_test(wins, losses)))


@dataclass
class EvaluationComparison:
    """Two stored evaluations compared: the statistics, a row per query, and what was left out and why."""

    a: Evaluation
    b: Evaluation
    stats: Paired
    rows: list[dict] = field(default_factory=list)
    cost_a: float = 0.0
    cost_b: float = 0.0
    only_a: int = 0
    only_b: int = 0
    missing: int = 0  # queries both evaluated but not answered k times on both sides (model-call errors)

    @property
    def note(self) -> str:
        """What was left out of the comparison and why, or ""."""
        parts = []
        if self.missing:
            parts.append(f"{self.missing} of the {self.stats.n + self.missing} queries both evaluated are left "
                         f"out: they lack answers (model-call errors) under A or B; retry the failed rollouts")
        if self.only_a or self.only_b:
            parts.append(f"{self.only_a} only under A and {self.only_b} only under B are left out (an evaluation "
                         "with a query limit)")
        return f"compared on the {self.stats.n} queries answered k times under both; " + "; ".join(parts) if parts else ""


def compare_evaluations(engine: Engine, a_id: int, b_id: int, *, seed: int = 0) -> EvaluationComparison:
    """Compare evaluation B with evaluation A on their common queries (same task, split and k, or refused)."""
    with Session(engine) as session:
        a, b = session.get(Evaluation, a_id), session.get(Evaluation, b_id)
        for ev_id, ev in ((a_id, a), (b_id, b)):
            if ev is None:
                raise NotFound(f"no evaluation {ev_id}")
        if a.task_id != b.task_id:
            raise InvalidInput(f"evaluations {a_id} and {b_id} are of different tasks")
        if a.split != b.split:
            raise InvalidInput(f"evaluation {a_id} ran on the {a.split} split and {b_id} on {b.split}; "
                               "compare evaluations of the same split")
        if a.k != b.k:
            raise InvalidInput(f"evaluation {a_id} took k={a.k} samples per query and {b_id} k={b.k}; "
                               "compare evaluations with the same k")
        rewards_a = queries.evaluation_rewards(session, a_id)
        rewards_b = queries.evaluation_rewards(session, b_id)
        stats_a = queries.evaluation_query_stats(session, a_id)
        stats_b = queries.evaluation_query_stats(session, b_id)
        samples = {s.id: s for s in queries.samples_by_ids(session, sorted(set(stats_a) | set(stats_b)))}
    both = set(stats_a) & set(stats_b)
    whole = {q for q in both if len(rewards_a.get(q, ())) == a.k and len(rewards_b.get(q, ())) == b.k}
    stats = paired({q: rewards_a[q] for q in whole}, {q: rewards_b[q] for q in whole}, k=a.k, seed=seed)
    missing = len(both - whole)
    if missing and missing > max_missing_share() * len(both):
        reason = (f"cannot decide: {missing} of the {len(both)} queries both evaluated lack answers under A or B "
                  f"(model-call errors; more than {max_missing_share():.0%} may not be missing); retry the failed "
                  "rollouts, then compare again")
        stats = replace(stats, undecided=reason, verdict=reason)
    rows = []
    for sample_id, sample in samples.items():
        ra, rb = stats_a.get(sample_id), stats_b.get(sample_id)
        diff = rb["mean"] - ra["mean"] if sample_id in whole else None
        rows.append({"sample_id": sample_id, "query id": sample.external_id, "query": sample.query,
                     "reference": sample.reference, "mean reward A": ra["mean"] if ra else None,
                     "mean reward B": rb["mean"] if rb else None, "difference": diff,
                     "winner": ("–" if sample_id not in both else "left out (errors)" if diff is None
                                else "B" if diff > 0 else "A" if diff < 0 else "tie"),
                     "errors A": ra["errors"] if ra else None, "errors B": rb["errors"] if rb else None,
                     "cost A": ra["cost"] if ra else None, "cost B": rb["cost"] if rb else None})
    rows.sort(key=lambda r: (r["difference"] is None, r["difference"] if r["difference"] is not None else 0))
    return EvaluationComparison(
        a=a, b=b, stats=stats, rows=rows,
        cost_a=sum(r["cost"] for r in stats_a.values()) / len(stats_a) if stats_a else 0.0,
        cost_b=sum(r["cost"] for r in stats_b.values()) / len(stats_b) if stats_b else 0.0,
        only_a=len(set(stats_a) - set(stats_b)), only_b=len(set(stats_b) - set(stats_a)), missing=missing)


def max_missing_share() -> float:
    """The share of queries that may lack answers before a comparison refuses to decide (a setting)."""
    return get_settings().max_missing_share
