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

import pytest  # noqa: E402  (after HEADCOOP_PROGRESS is set: subprocesses and imports read it)
import torch  # noqa: E402

warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


FAST_LIMIT_S = float(os.environ.get("HEADCOOP_FAST_LIMIT_S", "20"))  # the fast tier's per-test budget (issue 64)
_OVER: list[tuple[str, float]] = []  # fast-tier tests past the budget in this run (reported, never failed)


def _fast_tier(config) -> bool:
    """Whether this run is the fast tier (`-m "not slow"`): the budget keeps that tier fast. In the full run the
    slow tier's tests share the cores, and a fast test's time says more about them than about itself."""
    return "not slow" in (config.getoption("markexpr") or "")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """In the fast tier, a test outside the slow tier that takes more than FAST_LIMIT_S seconds is listed at the
    end of the run with its time (mark it `slow` or make it faster). It does not fail: a test never fails on time
    (issue 77: under load, tests that pass took 24-31 s)."""
    report = yield
    if (call.when == "call" and report.passed and item.get_closest_marker("slow") is None
            and call.duration > FAST_LIMIT_S and _fast_tier(item.config)):  # fmt: skip
        _OVER.append((item.nodeid, call.duration))
        report.sections.append(("fast tier", f"took {call.duration:.1f} s, over the fast tier's {FAST_LIMIT_S:g} s"))
    return report


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The fast-tier tests past the budget, each with its time (a note for whoever keeps the tier fast)."""
    if _OVER:
        terminalreporter.section("fast tier: tests over the budget (not failures)")
        for nodeid, seconds in sorted(_OVER, key=lambda x: -x[1]):
            terminalreporter.write_line(f"{nodeid} took {seconds:.1f} s, over the fast tier's {FAST_LIMIT_S:g} s "
                                        "(HEADCOOP_FAST_LIMIT_S): mark it @pytest.mark.slow or make it faster")  # fmt: skip
