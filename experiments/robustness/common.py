"""Shared settings of the robustness grid: the setups the sources leave open, training lengths, seeds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "docs" / "results"

# One change at a time from our default setup (the first entry), as task options.
COUNT01_VARIANTS: dict[str, dict] = {
    "default": {},
    "positional embedding": dict(positional=True),
    "strings up to 100": dict(max_len=100),
    "ties included": dict(include_ties=True),
    "heads-only readout": dict(readout="heads"),
}
SKIP_PAIR_VARIANTS: dict[str, dict] = {
    "default": {},
    "context 20": dict(seq_len=20),
    "context 50": dict(seq_len=50),
    "signal fraction 0.1": dict(signal_fraction=0.1),
    "signal fraction 0.9": dict(signal_fraction=0.9),
    "loss at every position": dict(loss_positions="all"),
}
PRIMARY = dict(n_heads=16, d_model=32, d_head=2)
MINIMAL = dict(n_heads=1, d_model=1, d_head=1)
SKIP_PAIR_SHAPES = {"2 heads, d_head 5": dict(n_heads=2, d_head=5), "2 heads, d_head 1": dict(n_heads=2, d_head=1),
                    "1 head, d_head 4": dict(n_heads=1, d_head=4)}  # fmt: skip


@dataclass
class Settings:
    """Sizes of the grid; `quick_settings()` shrinks them for the smoke test."""

    out: Path = DEFAULT_OUT / "robustness"
    quick: bool = False
    count01_steps: tuple = (
        300,
        1000,
    )  # short, and the Count01 page's full recipe (the loss's last-tenth drop is a column)
    skip_pair_steps: tuple = (1000, 3000)  # short, and the SkipPair page's full recipe
    seeds: tuple = (0, 1, 2)
    skip_pair_seeds: tuple = (0, 1, 2, 3)
    minimal_seeds: tuple = tuple(range(8))
    n_metrics: int = 1024  # strings per head_metrics call
    n_eval: int = 2048  # Count01 strings per accuracy evaluation
    n_pair: int = 256  # SkipPair contexts per signal pair type in the evaluation
    n_checkpoint: int = 32  # SkipPair contexts per pair type at each training checkpoint
    w01s: tuple = tuple(float(w) for w in np.logspace(-3, 3, 13))  # imposed w01 of the intervention (2 per decade)
    early_steps: tuple = (10, 20, 40, 80, 160)  # extra short primary runs of the ensemble correlation's model set
    early_seeds: tuple = (0, 1)
    table1_steps: tuple = (1000, 5000)  # short, and to a loss plateau (count01.md's Table 1 recipe)
    table1_seeds: tuple = (0, 1)
    recipe: dict = field(default_factory=lambda: dict(batch_size=256, lr=1e-2, weight_decay=0.0))

    @staticmethod
    def quick_settings(out: Path) -> "Settings":
        return Settings(out=out, quick=True, count01_steps=(10, 20), skip_pair_steps=(10, 20), seeds=(0,),
                        skip_pair_seeds=(0,), minimal_seeds=(0, 1), n_metrics=128, n_eval=128, n_pair=16, n_checkpoint=8,
                        w01s=(0.1, 1.0, 10.0), early_steps=(5,), early_seeds=(0,), table1_steps=(10, 20),
                        table1_seeds=(0,))  # fmt: skip

    def warmup(self, steps: int, task: str = "count01") -> int:
        """Each page's own recipe: Count01 warms up over a tenth of the steps (count01.md), SkipPair over 100
        steps (skip_pair.md; at most a tenth in the quick settings)."""
        return max(1, steps // 10) if task == "count01" else max(1, min(100, steps // 10))
