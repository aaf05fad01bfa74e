"""What the report's sections share: the model, its task and inputs, the heads covered, the budget, and the
results computed once (head patching, or AtP* estimates where exact patching would not fit)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import pandas as pd

import headcoop as hc
from headcoop.analysis.engine.copies import task_score
from headcoop.models.tl import HookedTransformer
from headcoop.reporting.budget import (
    EACH_PATCH,
    ESTIMATED_PATCH,
    EXACT_PATCH,
    Budget,
    depth,
    forward_seconds,
    gradient_cost,
)
from headcoop.tasks.base import Batch, Task


@dataclasses.dataclass
class Context:
    """The model and inputs every section reads, the heads the report covers, its budget, and results the
    sections share."""

    model: HookedTransformer
    task: Task
    source: str
    examples: int
    clean: Batch
    corrupt: Batch
    heads: list[tuple[int, int]] = None  # type: ignore[assignment]  # None: every head, filled by __post_init__
    budget: Budget = None  # type: ignore[assignment]  # None: no limit, filled by __post_init__
    head_table: pd.DataFrame | None = None
    exact_limit_s: float = 60.0  # by-position patching longer than this (predicted) is shown as AtP* estimates
    _memo: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.heads is None:
            self.heads = [(lay, h) for lay in range(self.model.cfg.n_layers) for h in range(self.model.cfg.n_heads)]
        if self.budget is None:
            self.budget = Budget(None, forward_seconds(self.model, self.clean.tokens))

    @property
    def all_heads(self) -> bool:
        return len(self.heads) == self.model.cfg.n_layers * self.model.cfg.n_heads

    @property
    def names(self) -> list[str]:
        """The covered heads' names ("L0H3"), in model order."""
        return [f"L{lay}H{h}" for lay, h in self.heads]

    @property
    def heads_arg(self) -> str:
        """The covered heads as the argument of a call shown on the page."""
        return "" if self.all_heads else f", heads={self.names!r}"

    @property
    def metric(self):
        """The task's metric on the clean batch, passed to every analysis (the model's own `task` is not read)."""
        return task_score(self.task, self.clean)

    def once(self, key: str, compute: Callable):
        """`compute()` the first time `key` is asked for, the stored value after (sections share results)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def patch_cost(self, positions: int = 1) -> float:
        """Predicted forward passes of patching the covered heads: on a one-layer model (where each copy
        recomputes one head, far less than a pass) timed on one and on four heads and extrapolated; else the
        clean and corrupt runs, then one copy per head and position from the head's layer."""
        if self.model.cfg.n_layers == 1:
            return self.once(f"patch-cost-{positions}", lambda: self._probed_patch(positions)) / self.budget.forward_s
        return 2 + positions * sum((depth(self.model, lay) for lay, _ in self.heads), 0.0)

    def _probed_patch(self, positions: int) -> float:
        """Seconds of hc.patch on every covered head, from its time on the first head and on the first four."""
        where = "all" if positions == 1 else "each"
        times = []
        for heads in dict.fromkeys((tuple(self.heads[:1]), tuple(self.heads[:4]))):
            start = time.perf_counter()
            hc.patch(self.model, clean=self.clean, corrupt=self.corrupt, metric=self.metric, positions=where,
                     heads=list(heads), progress=False)  # fmt: skip
            times.append(time.perf_counter() - start)
        if len(times) == 1:  # one head covered: the probe was the call
            return times[0]
        extra = min(4, len(self.heads)) - 1
        per = max(0.0, times[1] - times[0]) / extra
        return max(0.0, times[0] - per) + per * len(self.heads)

    def patch(self, positions: str = "all"):
        """hc.patch of the covered heads' z on the clean / corrupt batches (denoising); where that does not
        fit the budget and positions="all", AtP* estimates of it verified on 12 top and 12 sampled heads
        (an AttributionResult); None when neither fits (the exact map of every position: see patch_each)."""

        def compute():
            call = f"hc.patch(model, clean, corrupt{self.heads_arg})"
            if self.budget.afford(EXACT_PATCH, self.patch_cost(), call):
                return hc.patch(self.model, clean=self.clean, corrupt=self.corrupt, metric=self.metric,
                                positions=positions, heads=None if self.all_heads else self.heads, progress=False)  # fmt: skip
            atp = gradient_cost(self.model) + 1.1 * 24 * max(
                depth(self.model, lay) for lay, _ in self.heads
            )  # 24 heads
            if positions != "all" or not self.budget.afford(
                ESTIMATED_PATCH, atp, "hc.attribute(model, clean, corrupt, positions='all', estimator='atp*')"
            ):
                return None
            return hc.attribute(self.model, clean=self.clean, corrupt=self.corrupt, metric=self.metric, positions="all",
                                estimator="atp*", verify=12, sample=12, progress=False)  # fmt: skip

        return self.once(f"patch-{positions}", compute)

    def patch_each(self, threshold_s: float):
        """Every covered head's z patched at each position: the exact sweep, or, where it would take longer than
        `threshold_s` or the budget's remainder, AtP* estimates verified on their top 20 cells and 20 sampled
        ones; None when even those do not fit. Returns (PatchResult or AttributionResult or None, predicted
        exact s)."""

        def compute():
            n_pos = self.clean.tokens.shape[1]
            predicted = self.patch_cost(n_pos) * self.budget.forward_s
            if predicted <= min(threshold_s, self.budget.remaining()):
                return self.patch("each"), predicted
            atp = gradient_cost(self.model) + 1.1 * 40 * max(
                depth(self.model, lay) for lay, _ in self.heads
            )  # 40 cells
            if not self.budget.afford(EACH_PATCH, atp, "hc.attribute(model, clean, corrupt, estimator='atp*')"):
                return None, predicted
            estimate = hc.attribute(self.model, clean=self.clean, corrupt=self.corrupt, metric=self.metric,
                                    estimator="atp*", verify=20, sample=20, progress=False)  # fmt: skip
            return estimate, predicted

        return self.once(f"patch-each-{threshold_s}", compute)

    def ranked_heads(self) -> tuple[list[tuple[int, int]], str]:
        """The covered heads, the largest patching effect first (the patching section's `patch()`: exact, else
        AtP*'s ranking), and what ranked them; in model order, with "", where patching did not fit."""
        result = self.patch()
        if result is None:
            return list(self.heads), ""
        frame = result.to_dataframe()
        estimated = isinstance(result, hc.AttributionResult)
        size = frame["score"] if estimated else (frame["value"] - result.corrupt_value).abs()
        order = [(int(lay), int(h)) for lay, h in frame.assign(size=size).sort_values("size", ascending=False,
                                                                                      kind="stable")[["layer", "head"]].to_numpy()]  # fmt: skip
        covered = set(self.heads)
        return [h for h in order if h in covered], "AtP* estimates of patching" if estimated else "exact patching"

    def narrowed(self, heads: list[tuple[int, int]]) -> "Context":
        """The same model, inputs and budget covering `heads` only, with results of its own."""
        return dataclasses.replace(self, heads=list(heads), head_table=None, _memo={})

    def dla(self):
        """hc.dla on the clean batch."""
        return self.once("dla", lambda: hc.dla(self.model, self.clean))
