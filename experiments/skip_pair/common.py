"""Shared settings of the SkipPair experiments: output folder, training recipe, the grid of models."""

from __future__ import annotations

from pathlib import Path

from experiments.shared import setup  # noqa: F401  (run_all's process setup)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "docs" / "results"
RECIPE = dict(steps=3000, batch_size=256, lr=1e-2, weight_decay=0.0, warmup=100)
FULL = dict(
    heads=[1, 2, 3, 4],
    d_heads=[1, 2, 3, 4, 5, 6],
    grid_seeds=list(range(8)),
    main_seeds=list(range(20)),
    long=dict(heads=[1], d_heads=[1, 2, 3], seeds=list(range(8)), steps=10_000),
    dynamics=dict(d_heads=[1, 2, 3, 4, 5, 6], seeds=list(range(8)), every=250),
)
QUICK = dict(
    heads=[1, 2],
    d_heads=[1, 5],
    grid_seeds=[0],
    main_seeds=[0, 1],
    steps=40,
    long=dict(heads=[1], d_heads=[2], seeds=[0], steps=60),
    dynamics=dict(d_heads=[1, 5], seeds=[0], every=20),
)
MAIN_SHAPES = [(2, 5), (2, 1)]  # the post's model and its d_head 1 variant
SHIPPED = {"skip-pair": (2, 5), "skip-pair-dhead1": (2, 1)}
