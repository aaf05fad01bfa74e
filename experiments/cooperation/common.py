"""Shared settings of the cooperation experiments: output folder, which models, how many inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "docs" / "results"


@dataclass
class Settings:
    """Sizes of every measurement; `quick_settings()` shrinks them for the smoke test."""

    out: Path = DEFAULT_OUT / "cooperation"
    quick: bool = False
    n_inputs: int = 512  # inputs per coalition game
    count01_seeds: tuple = tuple(range(8))  # primary-configuration models trained here (Count01 recipe)
    count01_steps: int = 1000
    skip_pair_seeds: tuple = tuple(range(20))
    skip_pair_steps: int = 3000
    two_layer_seeds: tuple = (0, 1)
    draws: int = 4  # reference draws per ablation of hc.cooperation's reading family
    two_layer_draws: int = 2  # the same on the 32-head models (496 pairs), for time
    two_layer_how: str = "family"  # the smoke run reads zero ablation only there
    recipe: dict = field(default_factory=lambda: dict(batch_size=256, lr=1e-2, weight_decay=0.0))

    @staticmethod
    def quick_settings(out: Path) -> "Settings":
        return Settings(out=out, quick=True, n_inputs=64, count01_seeds=(0,), count01_steps=20,
                        skip_pair_seeds=(0, 1), skip_pair_steps=20, two_layer_seeds=(0,), draws=2,
                        two_layer_draws=1, two_layer_how="zero")  # fmt: skip
