"""Shared settings of the Count01 experiments: output folder, training recipe, table and figure writers."""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import shared
from experiments.shared import setup  # noqa: F401  (the run_all scripts' process setup)
from headcoop.display import plot
from headcoop.display.pages import fmt  # noqa: F401  (the experiments' number format)

warnings.filterwarnings("ignore", category=DeprecationWarning)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "docs" / "results" / "count01"
PRIMARY = dict(n_heads=16, d_model=32, d_head=2)
THRESHOLD = 0.95  # s_acc of a "successful" head


@dataclass
class Settings:
    """Sizes of every experiment; `quick()` shrinks them for the smoke test."""

    out: Path = DEFAULT_OUT
    quick: bool = False
    steps: int = 1000  # training steps of every fully trained model
    batch_size: int = 256
    lr: float = 1e-2
    sweep_seeds: tuple = (0, 1, 2)
    sweep_d_model: tuple = (1, 2, 4, 8, 16, 32)
    sweep_heads: tuple = (1, 2, 4, 8, 16)
    primary_seeds: tuple = tuple(range(8))
    n_metrics: int = 2048  # strings per head_metrics call
    n_eval: int = 4096  # strings per accuracy evaluation
    w01_grid: int = 19  # points of the log grid 1e-3 .. 1e3 (3 per decade)
    early_steps: tuple = (10, 20, 40, 80, 160)  # short runs for the ensemble correlation
    early_seeds: tuple = (0, 1, 2, 3)
    isolation_seeds: tuple = (0, 1, 2)
    isolation_steps: int = 5000  # Table 1 trains to a loss plateau (the page reports each run's last-tenth drop)
    minimal_seeds: int = 32
    minimal_steps: int = 1000
    minimal_lrs: tuple = (1e-2, 3e-2)
    two_layer_seeds: tuple = (0, 1)
    two_layer_heads: int = 16
    n_reference: int = 512  # strings whose mean z replaces a head's z in mean ablations
    n_ablation: int = 2048  # strings scored under each ablation of the shipped model
    n_ensemble: int = 1024  # strings per head_metrics call of the ensemble correlation
    n_two_layer_ablation: int = 512  # strings scored under each single-head ablation of the two-layer models
    bootstrap: int = 2000

    @staticmethod
    def quick_settings(out: Path) -> "Settings":
        return Settings(
            out=out, quick=True, steps=30, sweep_seeds=(0,), sweep_d_model=(1, 8), sweep_heads=(1, 4),
            primary_seeds=(0, 1), n_metrics=256, n_eval=256, w01_grid=3, early_steps=(10,), early_seeds=(0,),
            isolation_seeds=(0,), isolation_steps=30, minimal_seeds=4, minimal_steps=30, minimal_lrs=(1e-2,), two_layer_seeds=(0,),
            two_layer_heads=2, n_reference=64, n_ablation=256, n_ensemble=256, n_two_layer_ablation=256, bootstrap=100,
        )  # fmt: skip

    def recipe(self, steps: int | None = None) -> dict:
        """Training settings of hc.train_many: warm-up is a tenth of the steps (100 for 1000 steps)."""
        steps = self.steps if steps is None else steps
        return dict(steps=steps, batch_size=self.batch_size, lr=self.lr, warmup=max(1, steps // 10), progress=False)


def d_head_for(d_model: int, n_heads: int) -> int:
    """The sweep's head width: d_model / n_heads as in the paper's primary size (32 / 16 = 2), at least 1."""
    return max(1, d_model // n_heads)


def write_table(df: pd.DataFrame, out: Path, name: str, digits: int = 3) -> pd.DataFrame:
    """`experiments.shared.write_table` with this page's 3 digits."""
    return shared.write_table(df, out, name, digits)


def save_figure(fig, out: Path, name: str) -> list[str]:
    """out/name.html and, unless COUNT01_NO_PNG is set, out/name.png (900 x 600); the files written."""
    return plot.save_figure(fig, out, name, png=not os.environ.get("COUNT01_NO_PNG"))


def pearson_ci(x: np.ndarray, y: np.ndarray, n_boot: int, seed: int = 0) -> dict:
    """Pearson r of x and y with a Fisher-z 95% interval and a percentile bootstrap 95% interval."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    r = float(np.corrcoef(x, y)[0, 1])
    z, se = np.arctanh(np.clip(r, -0.999999, 0.999999)), 1 / math.sqrt(max(n - 3, 1))
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        if np.std(x[idx]) > 0 and np.std(y[idx]) > 0:
            boots.append(np.corrcoef(x[idx], y[idx])[0, 1])
    lo, hi = np.percentile(boots, [2.5, 97.5]) if boots else (float("nan"), float("nan"))
    return dict(
        n=n, r=r, fisher_lo=float(np.tanh(z - 1.96 * se)), fisher_hi=float(np.tanh(z + 1.96 * se)),
        boot_lo=float(lo), boot_hi=float(hi),
    )  # fmt: skip
