"""Why the A/B verdict counts users: A/A experiments whose users come back and differ, read every day, counted per
trace (the old unit) and per user (the studio's: each user one observation, the mean of their scored traces).

    PYTHONPATH=. python bench/ab_users.py [--experiments 2000] [--new 5] [--spread 2] [--seed 52]

Each experiment gets `--new` new users an arm a day for 30 days. A user has their own mean score (Beta with the
production mean 0.5 and concentration `--spread`: users differ), sends Poisson(activity) binary-scored traces a day,
activity log-normal (median 0.5 a day, a heavy tail: a few users send dozens), and stays a geometric number of days
(mean 7). A/A: both arms' users are drawn alike; the share of experiments that ever declared a difference within 1, 7,
14 and 30 days must stay at or under 0.05. Power: every candidate user's mean higher by 0.10. Both units go through
core.domain.sequential, the functions the Production page and the guard call. The per-user figure also measures what
the confidence sequence's theorem does not cover: a user's mean is revised as their later traces arrive.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.domain.sequential import excludes_zero, sums_bounds  # noqa: E402

DAYS = 30
LOOKS = (1, 7, 14, 30)
STAY_DAYS = 7.0  # a user's mean number of active days
ACTIVITY_MEDIAN, ACTIVITY_SIGMA = 0.5, 1.5  # traces a day: log-normal


def arm_users(rng: np.random.Generator, experiments: int, new: int, base: float, spread: float, effect: float):
    """One arm's users of every experiment: their mean score, activity, first and last active day."""
    count = new * DAYS
    mean = np.clip(base + effect, 1e-3, 1 - 1e-3)
    p = rng.beta(mean * spread, (1 - mean) * spread, size=(experiments, count))
    if effect:  # the same users' distribution, each mean higher by `effect` (as a better version would make it)
        p = np.clip(rng.beta(base * spread, (1 - base) * spread, size=(experiments, count)) + effect, 0.0, 1.0)
    activity = ACTIVITY_MEDIAN * np.exp(ACTIVITY_SIGMA * rng.standard_normal((experiments, count)))
    first = np.broadcast_to(np.arange(count) // new, (experiments, count))
    last = first + rng.geometric(1 / STAY_DAYS, size=(experiments, count)) - 1
    return p, activity, first, last


def declared(rng: np.random.Generator, experiments: int, new: int, base: float, spread: float,
             effect: float) -> dict[str, np.ndarray]:
    """Per unit, whether each experiment had declared a difference by each day, shape (experiments, DAYS)."""
    arms = [arm_users(rng, experiments, new, base, spread, e) for e in (0.0, effect)]
    sent = [np.zeros_like(arm[0]) for arm in arms]
    good = [np.zeros_like(arm[0]) for arm in arms]
    found = {"per trace": np.zeros((experiments, DAYS), bool), "per user": np.zeros((experiments, DAYS), bool)}
    for day in range(DAYS):
        for arm, (p, activity, first, last) in enumerate(arms):
            active = (first <= day) & (day <= last)
            traces = rng.poisson(np.where(active, activity, 0.0))
            sent[arm] += traces
            good[arm] += rng.binomial(traces, p)
        figures = {}
        for arm in range(2):
            n, s = sent[arm].sum(axis=1), good[arm].sum(axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                means = np.where(sent[arm] > 0, good[arm] / sent[arm], 0.0)
            users = (sent[arm] > 0).sum(axis=1)
            figures[arm] = {"per trace": (n, s, s), "per user": (users, means.sum(axis=1), (means * means).sum(axis=1))}
        for unit in found:
            (n_a, s_a, q_a), (n_b, s_b, q_b) = figures[0][unit], figures[1][unit]
            with np.errstate(divide="ignore", invalid="ignore"):
                _d, low, high = sums_bounds(n_a, s_a, q_a, n_b, s_b, q_b)
            found[unit][:, day] = excludes_zero(low, high)
    return {unit: np.logical_or.accumulate(days, axis=1) for unit, days in found.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", type=int, default=2000, help="simulated experiments per cell")
    parser.add_argument("--new", type=int, default=5, help="new users an arm a day")
    parser.add_argument("--spread", type=float, default=2.0, help="Beta concentration of users' means (lower: "
                        "users differ more)")
    parser.add_argument("--base", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=52)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    print(f"{args.experiments} experiments, {args.new} new users an arm a day, users' means Beta(concentration "
          f"{args.spread}) around {args.base}, looked at daily; seed {args.seed}\n")
    print("A/A: share that ever declared a difference within N days (must be <= 0.05)")
    print(f"{'unit':<10}" + "".join(f"{f'{d} d':>8}" for d in LOOKS))
    aa = declared(rng, args.experiments, args.new, args.base, args.spread, 0.0)
    for unit, days in aa.items():
        print(f"{unit:<10}" + "".join(f"{days[:, look - 1].mean():>8.3f}" for look in LOOKS))
    power = declared(rng, args.experiments, args.new, args.base, args.spread, 0.10)
    print(f"\nPower: share of A/B experiments declared within {DAYS} days, every candidate user +0.10")
    for unit, days in power.items():
        print(f"{unit:<10}{days[:, -1].mean():>8.3f}")
    worst = float(aa["per user"].mean(axis=0).max())
    print(f"\nlargest A/A share counted per user: {worst:.3f}; {time.perf_counter() - started:.1f} s")
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    raise SystemExit(main())
