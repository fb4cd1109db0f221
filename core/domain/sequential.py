"""An A/B verdict that may be read at any time: a confidence sequence for the difference of two arms' mean scores.

A fixed-sample 95% interval read every day calls a difference between two identical versions far more often than
one time in twenty (issue 50: 28.5% of A/A experiments within 30 daily looks at 40 scored traces an arm a day). A
confidence sequence covers the true difference at every moment at once, so it may be read after every trace, for as
long as the experiment runs, and the chance that it ever excludes the truth stays at most `alpha`.

The boundary is the Gaussian-mixture asymptotic confidence sequence (AsympCS) of I. Waudby-Smith, D. Arbour,
R. Sinha, E. H. Kennedy and A. Ramdas, "Time-uniform central limit theory and asymptotic confidence sequences",
Annals of Statistics 52(6), 2024 (arXiv:2103.06476), Theorem 2.2:

    estimate_t ± sigma_t * sqrt( 2 (t rho² + 1) / (t² rho²) * log( sqrt(t rho² + 1) / alpha ) )

with rho² = (-W₋₁(-alpha² / e) - 1) / t*, the value that makes it tightest after t* units (W₋₁ is the lower branch
of Lambert's W; -2 log alpha + log(1 - 2 log alpha) is its usual approximation). For the difference of the arms of a
randomized experiment (their Section 3) the units are the randomised units of both arms, t = n_a + n_b, and sigma_t²
is the variance per unit of the difference in means, t (s_a² / n_a + s_b² / n_b).

The unit is the user, because the user is what the split randomises (core/records/ab_experiments.served_arm hashes the
user id): the theorem needs independent units, and one user's traces are not independent of each other (the same
person, the same kind of question, the same version all along). Counted per trace, one heavy user who sends 200 good
traces is 200 "observations" and can decide an experiment that 30 other users show nothing in; counted per user, that
user is one observation, the mean of their scored traces (`ArmScores.of_users`). The estimate is then the difference
of the average user's mean score, each user weighing one, and `MIN_PER_ARM`, `OPTIMAL_AT` and `users_needed` count
users. The theorem takes each unit's value as fixed once seen, where a user's mean is revised as their later traces
arrive; users stay independent of each other and each mean stays in [0, 1], but that revision is outside the
theorem, so bench/ab_users.py measures it: A/A experiments with users who come back, read daily.

Scores are in [0, 1] (TraceIn refuses others; thumbs are 0 or 1), so a user's mean is too. The theorem is asymptotic,
and read after every user with an uneven split it is not yet valid early (issue 60: at a 10% candidate share, 80
users a day, the small arm's first 10-50 users all score 1 at a base rate of 0.9 and its variance collapses; 6-10%
of A/A experiments were declared different within 30 days). Two floors keep it valid in every cell of the grid
bench/ab_peeking.py measures (candidate shares 0.05-0.95, base rates 0.05-0.97, read after every user for 30 days):
each arm's variance is shrunk toward 1/4, the largest a value in [0, 1] can have, by `PRIOR_USERS` pseudo-users,
and is never below the two arms' pooled within-arm variance (`arm_variances`: under the null both arms have one
variance, and the large arm knows it long before the small one does); and no verdict is given before `MIN_PER_ARM`
users with a scored trace in each arm. Both fade as users arrive. This is "the present construction with a
variance floor and a start the grid shows valid" of issue 60, chosen over a construction valid without asymptotics:
each arm's predictable plug-in empirical-Bernstein sequence (Waudby-Smith and Ramdas, JRSS-B 2024), measured on the
same grid (`bench/ab_peeking.py --bernstein`), found +0.10 at base 0.5 in 57% of experiments at a 50/50 split where
this one does in 98%, and 15% against 59% at a 10% share. A betting sequence would be tighter; it was not built.

The interval shown is the running intersection of the intervals at every moment so far (`running_bounds`; still a
confidence sequence, Waudby-Smith et al., Section 2), so it only narrows; the first decision is stored by the guard
and read back from there (core/records/production/ab_verdict.py).

Pure functions over numbers or numpy arrays (the benchmark runs thousands of experiments through these same calls).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

ALPHA = 0.05
OPTIMAL_AT = 500  # users (both arms) where the sequence is tightest: a few weeks of a small agent's traffic
PRIOR_USERS = 2.0  # pseudo-users of the largest variance (1/4) added to each arm's variance
MIN_PER_ARM = 10  # users with a scored trace each arm needs before any verdict
MAX_VARIANCE = 0.25  # of a score (or a user's mean score) in [0, 1]
POWER = 0.8  # the chance `users_needed` aims for


def mixture_rho2(optimal_at: float = OPTIMAL_AT, alpha: float = ALPHA) -> float:
    """The mixture's rho² that makes the sequence narrowest after `optimal_at` units (exact, by Lambert's W).
    scipy is imported here and in `users_needed`, not with the module: the worker imports the A/B guard at start,
    and scipy.stats cost 0.6 s of CPU before every run's first call (issue 52, item 6)."""
    from scipy.special import lambertw

    return float((-lambertw(-alpha * alpha / math.e, k=-1).real - 1.0) / optimal_at)


def unit_margin(units, alpha: float = ALPHA, optimal_at: float = OPTIMAL_AT):
    """The half-width after `units` units for data of variance 1 (multiply by the standard deviation per unit)."""
    rho2 = mixture_rho2(optimal_at, alpha)
    t = np.asarray(units, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(2.0 * (t * rho2 + 1.0) / (t * t * rho2) * np.log(np.sqrt(t * rho2 + 1.0) / alpha))


def _deviations(n, total, total_squares):
    """The sum of squared deviations from the mean (0 where there is no unit)."""
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        squares = np.maximum(np.asarray(total_squares, dtype=float) - np.asarray(total, dtype=float) ** 2 / n, 0.0)
    return np.where(n > 0, squares, 0.0)


def shrunk_variance(n, total, total_squares, prior: float = PRIOR_USERS):
    """An arm's variance from its count, sum and sum of squares of units, shrunk toward 1/4 by `prior` pseudo-units."""
    n = np.asarray(n, dtype=float)
    return (_deviations(n, total, total_squares) + prior * MAX_VARIANCE) / np.maximum(n - 1.0 + prior, 1e-12)


def arm_variances(n_a, total_a, squares_a, n_b, total_b, squares_b, prior: float = PRIOR_USERS):
    """Each arm's variance as the verdict uses it: its own, shrunk, and never below the two arms' pooled within-arm
    variance (shrunk alike), so a small arm whose first users all agree does not make the interval a point (see the
    module's note)."""
    n_a, n_b = np.asarray(n_a, dtype=float), np.asarray(n_b, dtype=float)
    dev_a, dev_b = _deviations(n_a, total_a, squares_a), _deviations(n_b, total_b, squares_b)
    pooled = (dev_a + dev_b + prior * MAX_VARIANCE) / np.maximum(n_a + n_b - 2.0 + prior, 1e-12)
    own_a = (dev_a + prior * MAX_VARIANCE) / np.maximum(n_a - 1.0 + prior, 1e-12)
    own_b = (dev_b + prior * MAX_VARIANCE) / np.maximum(n_b - 1.0 + prior, 1e-12)
    return np.maximum(own_a, pooled), np.maximum(own_b, pooled)


def difference_bounds(n_a, mean_a, var_a, n_b, mean_b, var_b, alpha: float = ALPHA,
                      optimal_at: float = OPTIMAL_AT):
    """(difference, low, high) of mean_b − mean_a: the confidence sequence's boundary at this moment, given each arm's
    variance. Elementwise on arrays; NaN bounds where an arm has fewer than MIN_PER_ARM units (no verdict yet)."""
    n_a, n_b = np.asarray(n_a, dtype=float), np.asarray(n_b, dtype=float)
    difference = np.asarray(mean_b, dtype=float) - np.asarray(mean_a, dtype=float)
    units = n_a + n_b
    with np.errstate(divide="ignore", invalid="ignore"):
        per_unit = units * (np.asarray(var_a, dtype=float) / n_a + np.asarray(var_b, dtype=float) / n_b)
        half = np.sqrt(per_unit) * unit_margin(units, alpha, optimal_at)
    half = np.where((n_a >= MIN_PER_ARM) & (n_b >= MIN_PER_ARM), half, np.nan)
    return difference, difference - half, difference + half


def sums_bounds(n_a, total_a, squares_a, n_b, total_b, squares_b, alpha: float = ALPHA,
                optimal_at: float = OPTIMAL_AT):
    """`difference_bounds` from each arm's count, sum and sum of squares, with the variances of `arm_variances`."""
    n_a, n_b = np.asarray(n_a, dtype=float), np.asarray(n_b, dtype=float)
    var_a, var_b = arm_variances(n_a, total_a, squares_a, n_b, total_b, squares_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_a, mean_b = np.asarray(total_a, dtype=float) / n_a, np.asarray(total_b, dtype=float) / n_b
    return difference_bounds(n_a, mean_a, var_a, n_b, mean_b, var_b, alpha, optimal_at)


def running_bounds(is_candidate, values, alpha: float = ALPHA, optimal_at: float = OPTIMAL_AT):
    """(difference, low, high) after each unit, along the last axis, of units in the order they arrived (`values`,
    each in the candidate's arm where `is_candidate`): low and high are the running intersection of every interval so
    far, so the interval only narrows and a difference once shown stays shown."""
    candidate = np.asarray(is_candidate, dtype=bool)
    values = np.asarray(values, dtype=float)
    production = ~candidate
    sums = [np.cumsum(part, axis=-1, dtype=float) for part in
            (production, values * production, values * values * production,
             candidate, values * candidate, values * values * candidate)]
    difference, low, high = sums_bounds(*sums, alpha=alpha, optimal_at=optimal_at)
    return difference, np.fmax.accumulate(low, axis=-1), np.fmin.accumulate(high, axis=-1)


def excludes_zero(low, high):
    """Whether the interval says the arms differ (NaN bounds: no verdict, False)."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    return (low > 0) | (high < 0)


@dataclass(frozen=True)
class ArmScores:
    """One arm's units as the verdict needs them: count `n` (users), mean, and the sum and sum of squares of their
    values; `traces` is how many scored traces those units' values came from (shown beside `n`, never counted as
    units)."""

    n: int
    mean: float | None
    total: float = 0.0
    squares: float = 0.0
    traces: int = 0

    @property
    def variance(self) -> float:
        """This arm's own variance, shrunk (the verdict floors it further: `arm_variances`)."""
        return float(shrunk_variance(self.n, self.total, self.squares))

    @classmethod
    def of(cls, values: Sequence[float]) -> ArmScores:
        """Each value one unit (in the studio: one user's mean score)."""
        n = len(values)
        total = float(sum(values))
        squares = float(sum(value * value for value in values))
        return cls(n, total / n if n else None, total, squares, n)

    @classmethod
    def of_users(cls, by_user: Mapping[str, Sequence[float]]) -> ArmScores:
        """One unit per user with a scored trace: the mean of that user's scores (see the module's note)."""
        means = [sum(scores) / len(scores) for scores in by_user.values() if scores]
        return replace(cls.of(means), traces=sum(len(scores) for scores in by_user.values()))


def floored_variances(production: ArmScores, candidate: ArmScores) -> tuple[float, float]:
    """The two arms' variances as the verdict uses them (`arm_variances`)."""
    var_a, var_b = arm_variances(production.n, production.total, production.squares, candidate.n, candidate.total,
                                 candidate.squares)
    return float(var_a), float(var_b)


@dataclass(frozen=True)
class Verdict:
    """The candidate's difference from production and its anytime-valid interval; `decided` only when the interval
    excludes zero. `low`/`high` are None before each arm has MIN_PER_ARM users."""

    difference: float | None
    low: float | None
    high: float | None
    decided: bool
    alpha: float = ALPHA

    @property
    def better(self) -> bool:
        return self.decided and self.low is not None and self.low > 0

    @property
    def worse(self) -> bool:
        return self.decided and self.high is not None and self.high < 0


def _verdict(difference, low, high, alpha: float) -> Verdict:
    if math.isnan(float(difference)):
        return Verdict(None, None, None, False, alpha)
    if math.isnan(float(low)):
        return Verdict(float(difference), None, None, False, alpha)
    return Verdict(float(difference), float(low), float(high), bool(excludes_zero(low, high)), alpha)


def verdict(production: ArmScores, candidate: ArmScores, alpha: float = ALPHA,
            optimal_at: float = OPTIMAL_AT) -> Verdict:
    """The verdict on two arms' scores at this moment alone (no earlier moment intersected: `verdict_in_order`)."""
    if not production.n or not candidate.n:
        return Verdict(None, None, None, False, alpha)
    return _verdict(*sums_bounds(production.n, production.total, production.squares, candidate.n, candidate.total,
                                 candidate.squares, alpha, optimal_at), alpha)


def verdict_in_order(arrivals: Sequence[tuple[bool, float]], alpha: float = ALPHA,
                     optimal_at: float = OPTIMAL_AT) -> Verdict:
    """The studio's A/B verdict: units as (in the candidate's arm, value) in the order they arrived, the interval the
    running intersection of every moment's (`running_bounds`, the function bench/ab_peeking.py measures)."""
    if not any(arm for arm, _value in arrivals) or all(arm for arm, _value in arrivals):
        return Verdict(None, None, None, False, alpha)
    arms = np.array([arm for arm, _value in arrivals], dtype=bool)
    values = np.array([value for _arm, value in arrivals], dtype=float)
    difference, low, high = running_bounds(arms, values, alpha, optimal_at)
    return _verdict(difference[-1], low[-1], high[-1], alpha)


def users_needed(production: ArmScores, candidate: ArmScores, effect: float, *, candidate_share: float,
                 alpha: float = ALPHA, optimal_at: float = OPTIMAL_AT, power: float = POWER,
                 cap: int = 10_000_000) -> int | None:
    """How many more users with a scored trace (both arms together, split as now) until a true difference of `effect`
    would be declared with probability about `power`: the smallest total where the interval's half-width plus the
    estimate's own spread at that power fits inside `effect`. None when not even `cap` users would do."""
    if effect <= 0:
        raise ValueError("the difference to detect must be above 0")
    have = production.n + candidate.n
    share = candidate.n / have if production.n and candidate.n else candidate_share
    share = min(max(share, 1e-3), 1 - 1e-3)
    from scipy.stats import norm

    z = float(norm.ppf(power))
    var_a, var_b = floored_variances(production, candidate)

    def enough(total: int) -> bool:
        n_a, n_b = max(total * (1 - share), 1.0), max(total * share, 1.0)
        if min(n_a, n_b) < MIN_PER_ARM:
            return False
        spread = math.sqrt(var_a / n_a + var_b / n_b)
        return spread * (math.sqrt(total) * float(unit_margin(total, alpha, optimal_at)) + z) <= effect

    high = max(have, 2)
    while not enough(high):
        if high >= cap:
            return None
        high = min(high * 2, cap)
    low = max(have, 1) - 1
    while high - low > 1:  # enough(high) holds and enough(low) does not (or low is below what is already here)
        middle = (low + high) // 2
        if enough(middle):
            high = middle
        else:
            low = middle
    return max(high - have, 0)
