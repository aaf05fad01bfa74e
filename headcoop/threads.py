"""Thread settings that hold up on a busy machine (torch-free: the CLI calls it before torch is imported).

torch's OpenMP threads spin while they wait for each other. When another process holds one of the cores, a
thread that waits for the thread it cannot run spins through its time slice: on this project's 2-core machine
with one core busy, `headcoop report count01` took 65.8 s with torch's defaults (2 spinning threads), 20.9 s with
OpenMP's passive wait policy and 15.4 s with one thread (issue 62). So, unless the user has set them:

- before torch is imported, where the machine is busy, `OMP_WAIT_POLICY=PASSIVE` (a waiting thread sleeps
  instead of spinning), else a short spin; OpenMP reads these once, when it starts, so only the CLI and
  scripts that call `configure_process` first get them;
- as many torch threads as there are idle cores (`idle_cores`: the CPUs' idle time over `WINDOW_S` from
  /proc/stat, else the cores less the one-minute load average), at least 1: all cores on a quiet machine.

A user's own setting wins: `HEADCOOP_THREADS=n` (n threads, no measurement: every long analysis runs with n
threads, from Python as from the CLI), `OMP_NUM_THREADS`, or, inside a process, a thread count set with
`torch.set_num_threads` (`fitted_threads` leaves any count other than the one torch or headcoop chose alone).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

WINDOW_S = 0.1  # the window idle time is read over
ENV_THREADS = "HEADCOOP_THREADS"
_chosen: list[int] = []  # the counts headcoop set in this process (a count it did not set is the user's)


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_times(cpus: set[int]) -> tuple[float, float] | None:
    """(idle, total) jiffies summed over `cpus` from /proc/stat, None where it cannot be read."""
    try:
        lines = open("/proc/stat").read().splitlines()
    except OSError:
        return None
    idle = total = 0.0
    seen = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        values = [float(v) for v in fields[:8]]
        idle += values[3] + values[4]  # idle and iowait
        total += sum(values)
        seen += 1
    return (idle, total) if seen else None


def idle_cores(window_s: float = WINDOW_S) -> float:
    """How many of this process's CPUs are idle: their idle share over `window_s` seconds (/proc/stat), else
    the cores less the one-minute load average; never below 0."""
    if isinstance(window_s, bool) or not isinstance(window_s, (int, float)):
        raise TypeError(f"window_s must be a number of seconds, got {window_s!r} ({type(window_s).__name__})")
    if not 0 <= window_s <= 60:  # NaN fails this too
        raise ValueError(f"window_s must be between 0 and 60 seconds, got {window_s!r}")
    try:
        cpus = set(os.sched_getaffinity(0))
    except AttributeError:
        cpus = set()
    first = _cpu_times(cpus) if cpus else None
    if first is not None:
        time.sleep(window_s)
        second = _cpu_times(cpus)
        if second is not None and second[1] > first[1]:
            return max(0.0, (second[0] - first[0]) / (second[1] - first[1]) * len(cpus))
    try:
        return max(0.0, cores() - os.getloadavg()[0])
    except (AttributeError, OSError):
        return float(cores())


def choose_threads() -> int:
    """The thread count for this machine now: HEADCOOP_THREADS where set, else the idle cores (rounded, at
    least 1, at most the cores)."""
    raw = os.environ.get(ENV_THREADS)
    if raw is not None:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{ENV_THREADS} must be a positive integer, got {raw!r}") from None
        if value < 1:
            raise ValueError(f"{ENV_THREADS} must be a positive integer, got {raw!r}")
        return value
    return max(1, min(cores(), int(idle_cores() + 0.5)))


QUIET_SPINCOUNT = "10000"  # libgomp's spin before a waiting thread sleeps, on a quiet machine (default 300,000)


def configure_process() -> dict:
    """Before torch is imported, each unless the user set it: OMP_NUM_THREADS=`choose_threads()`
    (HEADCOOP_THREADS sets the count); and the wait: on a busy machine (fewer threads than cores)
    OMP_WAIT_POLICY=PASSIVE, on a quiet one a short spin (GOMP_SPINCOUNT, libgomp's, which torch's Linux
    wheels use) that keeps the quiet speed and limits the cost of a load that arrives later. Measured on this
    project's 2-core machine (`benchmarks/busy_machine.py`, docs/benchmarks.md): passive waiting costs 9% on a
    quiet machine, the short spin 3%. Returns what was set {name: value}."""
    set_here = {}
    threads = None
    if "OMP_NUM_THREADS" not in os.environ or ENV_THREADS in os.environ:
        threads = choose_threads()
        os.environ["OMP_NUM_THREADS"] = set_here["OMP_NUM_THREADS"] = str(threads)
        _chosen.append(threads)
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        if threads is not None and threads < cores():
            os.environ["OMP_WAIT_POLICY"] = set_here["OMP_WAIT_POLICY"] = "PASSIVE"
        else:
            os.environ["GOMP_SPINCOUNT"] = set_here["GOMP_SPINCOUNT"] = QUIET_SPINCOUNT
    return set_here


def _users_count(current: int) -> bool:
    """Whether torch's thread count is the user's: set by OMP_NUM_THREADS / HEADCOOP_THREADS headcoop did not
    write, or by torch.set_num_threads to a count neither torch's default (the cores) nor headcoop chose."""
    if ENV_THREADS in os.environ or ("OMP_NUM_THREADS" in os.environ and not _chosen):
        return True
    return current not in (*_chosen, cores())


@contextlib.contextmanager
def fitted_threads() -> Iterator[int]:
    """For a long analysis: torch's threads set to the idle cores for the duration (restored after), unless
    the count is the user's (`_users_count`). Yields the count used."""
    import torch

    before = torch.get_num_threads()
    if ENV_THREADS in os.environ:  # the user's count for headcoop, from Python as from the CLI (issue 76)
        threads = choose_threads()  # a bad value is refused by name
    elif _users_count(before):
        yield before
        return
    else:
        threads = choose_threads()
    _chosen.append(threads)
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


__all__ = ["cores", "idle_cores", "choose_threads", "configure_process", "fitted_threads", "ENV_THREADS"]
