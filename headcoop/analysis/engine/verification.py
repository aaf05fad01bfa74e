"""Verifying an estimate by exact patching, one routine for nodes (`hc.attribute`) and edges (`hc.edges`).

The `verify` items with the largest estimated magnitude are patched exactly, and `sample` more drawn at random
(seeded) from the rest. Among the sampled items, those whose exact |effect| exceeds the smallest exact |effect|
of the verified top are the estimate's misses: their count, scaled to the rest, bounds what the estimate may
have left out of its top, with a 95% Clopper-Pearson interval. The bound is reported in both units, each named:
`estimate`, `low`, `high` count items of the rest; `share`, `share_low`, `share_high` are fractions of it.
"""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor


def clopper_pearson(above: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a binomial proportion, `above` successes of `n`, as
    `scipy.stats.binomtest(...).proportion_ci(method="exact")` gives it; (0, 1) when n is 0."""
    from scipy.stats import binomtest

    if n == 0:
        return 0.0, 1.0
    interval = binomtest(above, n).proportion_ci(confidence_level=level, method="exact")
    return float(interval.low), float(interval.high)


def pick(magnitude: Float[Tensor, " n"], verify: int, sample: int, seed: int) -> tuple[Tensor, Tensor, int]:
    """(top [k], sampled [s], rest): the indices of the `verify` largest magnitudes (ties in index order), of
    `sample` more drawn without replacement from the others with `seed`, and how many others there are."""
    order = torch.argsort(magnitude.reshape(-1), descending=True, stable=True)
    top, rest = order[:verify], order[verify:]
    take = min(sample, len(rest))
    drawn = np.random.default_rng(seed).choice(len(rest), size=take, replace=False) if take else np.array([], int)
    return top, rest[torch.as_tensor(drawn, dtype=torch.long)], len(rest)


def miss_bound(top_effect: Float[Tensor, " k"], sampled_effect: Float[Tensor, " s"], rest: int) -> dict:
    """The false-negative bound (module docstring) from the exact effects (changes of the metric) of the verified
    top and of the sample: {"threshold", "rest", "sampled", "above", "estimate", "low", "high" (counts of the
    rest), "share", "share_low", "share_high" (fractions of it)}; {} when either set is empty."""
    if not (len(top_effect) and len(sampled_effect)):
        return {}
    threshold = float(top_effect.abs().min())
    above = int((sampled_effect.abs() > threshold).sum())
    low, high = clopper_pearson(above, len(sampled_effect))
    share = above / len(sampled_effect)
    return {"threshold": threshold, "rest": int(rest), "sampled": int(len(sampled_effect)), "above": above,
            "estimate": share * rest, "low": low * rest, "high": high * rest,
            "share": share, "share_low": low, "share_high": high}  # fmt: skip


def wide_bound(missed: dict, top: int, what: str) -> str:
    """A warning for a result's repr where a false-negative bound (`miss_bound`) allows more missed `what` than
    the verified top holds (it cannot tell the estimate's top from a miss), else ""."""
    if not missed or missed["high"] <= max(top, 1):
        return ""
    return (f"; the miss bound allows up to {missed['high']:.3g} missed {what}, more than the {top} verified at the "
            f"top: it bounds little (sample more with sample=)")  # fmt: skip


__all__ = ["clopper_pearson", "pick", "miss_bound", "wide_bound"]
