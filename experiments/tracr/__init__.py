"""Tracr-compiled models with their ground truth: `build.py` compiles (needs the `[bench]` extra: tracr-pypi
and jax), `common.py` loads the committed checkpoints (needs neither)."""
