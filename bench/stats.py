"""The uncertainty of a figure on a results page: a mean over held-out scenarios with its
standard error, and a gain measured on the same scenarios (paired) with its standard error and
a bootstrap interval. A gain under two standard errors is "within noise"."""

from __future__ import annotations

import math
import random
from typing import Any, Optional, Sequence


def mean_se(values: Sequence[Optional[float]]) -> tuple[float, float, int]:
    """(mean, standard error of the mean, n) of the values that are there (None: a failed rollout)."""
    xs = [float(v) for v in values if v is not None]
    n = len(xs)
    if not n:
        return math.nan, math.nan, 0
    m = sum(xs) / n
    if n < 2:
        return m, math.nan, n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, sd / math.sqrt(n), n


def paired(before: Sequence[Optional[float]], after: Sequence[Optional[float]], *,
           resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """``after - before`` on the same scenarios: the mean difference, its standard error, a 95%
    bootstrap interval (scenarios resampled with replacement), how many pairs, and whether the
    difference is within noise (under two standard errors)."""
    if len(before) != len(after):
        raise ValueError(f"paired figures need the same scenarios: {len(before)} and {len(after)}")
    diffs = [a - b for b, a in zip(before, after) if a is not None and b is not None]
    gain, se, n = mean_se(diffs)
    if n < 2:
        return {"gain": gain, "se": se, "low": math.nan, "high": math.nan, "n": n, "noise": True}
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in range(n)) / n for _ in range(resamples))
    low, high = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
    noise = gain == 0 or abs(gain) < 2 * se
    return {"gain": gain, "se": se, "low": low, "high": high, "n": n, "noise": noise}


def expected(draws: Sequence[Sequence[Optional[float]]]) -> dict[str, Any]:
    """A randomised baseline over many draws on the same scenarios (``draws[d][i]``: draw d's
    reward on scenario i): its expected reward per scenario, the mean of those (the expected
    held-out mean), and the spread of one draw's held-out mean (its standard deviation over draws)."""
    n = len(draws[0])
    per = [sum(d[i] for d in draws) / len(draws) for i in range(n)]
    means = [sum(d) / n for d in draws]
    mu = sum(means) / len(means)
    spread = math.sqrt(sum((m - mu) ** 2 for m in means) / max(len(means) - 1, 1))
    return {"reward": sum(per) / n, "spread": spread, "draws": len(draws), "each": per}


def fmt(mean: float, se: float, digits: int = 3) -> str:
    """``0.632 ± 0.070`` (the ± dropped when there is no standard error)."""
    if mean != mean:
        return "-"
    return f"{mean:.{digits}f}" + (f" ± {se:.{digits}f}" if se == se else "")


def fmt_gain(p: dict[str, Any]) -> str:
    """``+0.264 ± 0.071`` and, below two standard errors, ``(within noise)``."""
    if p["gain"] != p["gain"]:
        return "-"
    text = f"{p['gain']:+.3f}" + (f" ± {p['se']:.3f}" if p["se"] == p["se"] else "")
    return text + (" (within noise)" if p["noise"] else "")
