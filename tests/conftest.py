"""Shared test settings: tiny models run fastest on one thread, and the deprecation warning of
HookedTransformer (TransformerLens 3.9) is not ours to fix; progress bars are off (HEADCOOP_PROGRESS=0)."""

import os
import warnings

os.environ["HEADCOOP_PROGRESS"] = "0"  # no progress bars or estimates in tests (subprocesses inherit it)

import pytest
import torch

warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
