"""Regenerate the checkpoints shipped in headcoop/checkpoints/ (deterministic on CPU).

python -m experiments.train_shipped [--only count01 skip-pair skip-pair-dhead1]
"""

from __future__ import annotations

import argparse
import json
import warnings

import headcoop as hc
from headcoop.storage.checkpoints import SHIPPED_DIR

warnings.filterwarnings("ignore", category=DeprecationWarning)

# name -> (task, model kwargs, model seed, training settings)
RECIPES = {
    "count01": (hc.Count01(), dict(n_heads=16, d_model=32, d_head=2), 0, dict(steps=4000, lr=1e-2, seed=0)),
    # SkipPair: the typical seeds of experiments.skip_pair.run_all (docs/results/skip_pair/typical_seeds.csv)
    "skip-pair": (hc.SkipPair(), dict(n_heads=2, d_head=5), 17, dict(steps=3000, lr=1e-2, seed=17)),
    "skip-pair-dhead1": (hc.SkipPair(), dict(n_heads=2, d_head=1), 3, dict(steps=3000, lr=1e-2, seed=3)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=sorted(RECIPES), default=sorted(RECIPES))
    args = parser.parse_args()
    for name in args.only:
        task, shape, model_seed, settings = RECIPES[name]
        model = hc.train(task, task.model(seed=model_seed, **shape), **settings)
        metrics = task.evaluate(model, n=20_000 if isinstance(task, hc.Count01) else 1000)
        hc.save(model, SHIPPED_DIR / name, metrics=metrics, model_seed=model_seed)
        print(name, json.dumps({k: round(v, 5) for k, v in metrics.items()}))


if __name__ == "__main__":
    main()
