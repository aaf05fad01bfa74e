"""Shared test settings: tiny models run fastest on one thread, and the deprecation warning of
HookedTransformer (TransformerLens 3.9) is not ours to fix; progress bars are off (HEADCOOP_PROGRESS=0)."""

import os
import sys
import warnings
from pathlib import Path

# tests/ mirrors headcoop/analysis/ (tests/analysis/<room>/); their shared helpers import each other by module name
for _folder in sorted(Path(__file__).parent.glob("analysis/*")):
    if _folder.is_dir() and str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

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
