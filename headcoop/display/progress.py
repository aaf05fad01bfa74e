"""Progress of long analyses: one tqdm bar per public call, advanced by the engine, and a one-line estimate
before a call predicted to run far longer than a minute.

    hc.set_progress(False)          # no bars and no estimates anywhere (HEADCOOP_PROGRESS=0 does the same)
    hc.patch(model, positions="each", progress=False)   # or per call

A call opens its bar with `task(...)`; the engine (`headcoop.analysis.engine.copies.evaluate`) adds its modified runs
to the bar's total and advances it as they finish, so nested calls (hc.cooperation running coalition games)
share one bar. The bar appears only after `DELAY_S` seconds: quick calls print nothing.

The bar is tqdm's notebook widget where ipywidgets is installed, its text bar elsewhere. `tqdm.auto` in a
Jupyter kernel without ipywidgets warns "IProgress not found" on every import; choosing here keeps
`import headcoop` quiet there and still gives notebook users the widget when they have it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.util
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterator

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm.std import tqdm

    # TransformerLens imports tqdm.auto itself; its one-time warning says nothing a headcoop user can act on.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        importlib.import_module("tqdm.auto")

__all__ = [
    "tqdm",
    "set_progress",
    "progress_enabled",
    "task",
    "advance",
    "expect",
    "set_total",
    "estimate",
    "with_progress",
    "DELAY_S",
    "LONG_S",
]

DELAY_S = 2.0  # a bar shows once its call has run this long
LONG_S = 120.0  # a call predicted to run longer than this prints a one-line estimate first
ESTIMATE_AFTER_S = 1.0  # the estimate extrapolates the runs of this many seconds

PROGRESS_ON = ("1", "true", "yes", "on")  # HEADCOOP_PROGRESS's documented values (any case)
PROGRESS_OFF = ("0", "false", "no", "off", "disable", "none")


def _from_environment() -> bool:
    """HEADCOOP_PROGRESS as a switch: one of PROGRESS_ON or PROGRESS_OFF; unset means on; any other value warns
    (naming it and the values read) and counts as off, the safer reading of a value meant to quiet the bars."""
    raw = os.environ.get("HEADCOOP_PROGRESS")
    if raw is None:
        return True
    value = raw.strip().lower()
    if value in PROGRESS_ON:
        return True
    if value not in PROGRESS_OFF:
        import warnings

        warnings.warn(f"HEADCOOP_PROGRESS={raw!r} is not one of {', '.join(PROGRESS_ON)} (on) or "
                      f"{', '.join(PROGRESS_OFF)} (off); progress bars are off", stacklevel=2)  # fmt: skip
    return False


_enabled = _from_environment()
_current: contextvars.ContextVar = contextvars.ContextVar("headcoop_progress_bar", default=None)


def set_progress(on: bool) -> None:
    """Turn headcoop's progress bars and cost estimates on or off for this process (default on; the
    environment variable HEADCOOP_PROGRESS=0 starts it off). A call's own `progress=` argument wins."""
    global _enabled
    if not isinstance(on, bool):
        raise TypeError(f"set_progress takes True or False, got {on!r}")
    _enabled = on


def progress_enabled(progress: bool | None = None) -> bool:
    """Whether a call shows progress: its own `progress` argument, else the process setting."""
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None (the process setting), got {progress!r}")
    return _enabled if progress is None else progress


@contextlib.contextmanager
def task(desc: str, progress: bool | None = None, unit: str = "run", expected: int = 0, cheaper: str = "") -> Iterator:
    """The bar of one public call (`desc`, e.g. "hc.patch"), counting modified runs; inside another call's
    bar, that bar is reused (one bar per call the user made). `expected`: the runs the call knows it will
    make (the engine raises the total when it announces more). `cheaper`: the argument that makes the call
    cheaper, printed with the estimate when the runs of the first seconds predict more than LONG_S."""
    outer = _current.get()
    if outer is not None:
        yield outer
        return
    bar = tqdm(total=expected, desc=desc, unit=unit, delay=DELAY_S, leave=True, disable=not progress_enabled(progress),
               file=sys.stderr)  # fmt: skip
    bar.hc_announced, bar.hc_cheaper, bar.hc_estimated = 0, cheaper, False
    token = _current.set(bar)
    try:
        yield bar
    finally:
        _current.reset(token)
        bar.close()


def advance(done: int = 0, more: int = 0) -> None:
    """Announce `more` runs to the open bar and count `done` finished ones (nothing when no bar is open).
    Once a second has passed, a call whose runs so far predict more than LONG_S prints its estimate (once)."""
    bar = _current.get()
    if bar is None or bar.disable:
        return
    if more:
        bar.hc_announced += more
        if bar.hc_announced > (bar.total or 0):
            bar.total = bar.hc_announced
    if done:
        bar.update(done)
        elapsed = bar.format_dict["elapsed"]
        if not bar.hc_estimated and elapsed >= ESTIMATE_AFTER_S and bar.total:
            bar.hc_estimated = True
            predicted = elapsed / bar.n * bar.total
            if predicted > LONG_S:
                hint = f"; {bar.hc_cheaper}" if bar.hc_cheaper else ""
                bar.write(f"{bar.desc}: about {_duration(predicted)} for {bar.total:,} runs on this machine{hint}",
                          file=sys.stderr)  # fmt: skip


def expect(runs: int) -> None:
    """Tell the open bar how many runs its call will make in all (a call whose engine runs come in many
    batches, like a sampled Shapley estimate, would otherwise extrapolate from the first batch alone)."""
    bar = _current.get()
    if bar is not None and not bar.disable and runs > (bar.total or 0):
        bar.total = runs


def set_total(runs: int) -> None:
    """Set the open bar's total to `runs` (a call that learns, after its first runs, that it will make fewer
    than it announced: the pair map choosing its screen); nothing when no bar is open."""
    bar = _current.get()
    if bar is not None and not bar.disable:
        bar.total = runs
        bar.refresh()


def done() -> int:
    """How many runs the open bar has counted (0 with no bar): a call of many like parts times its first part."""
    bar = _current.get()
    return 0 if bar is None else int(bar.n)


def with_progress(desc: str, cheaper: str = "") -> Callable:
    """Decorate a public analysis whose signature has `progress: bool | None = None`: its body runs inside
    `task(desc, progress)`, so the engine's runs advance one bar for the call."""

    def wrap(function: Callable) -> Callable:
        signature = inspect.signature(function)
        if "progress" not in signature.parameters:
            raise TypeError(f"{function.__name__} needs a progress parameter to take a progress bar")

        @functools.wraps(function)
        def call(*args, **kwargs):
            progress = signature.bind_partial(*args, **kwargs).arguments.get("progress")
            with task(desc, progress_enabled(progress), cheaper=cheaper):
                return function(*args, **kwargs)

        return call

    return wrap


def estimate(what: str, seconds: float, cheaper: str = "", progress: bool | None = None) -> bool:
    """Print one line to stderr before a call predicted to take `seconds` when that is more than LONG_S
    (with `cheaper`: the argument that makes it cheaper); returns whether it printed."""
    if seconds <= LONG_S or not progress_enabled(progress):
        return False
    hint = f"; {cheaper}" if cheaper else ""
    print(f"{what}: about {_duration(seconds)} on this machine{hint}", file=sys.stderr, flush=True)
    return True


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
