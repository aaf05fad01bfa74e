"""Which process owns a temporary folder or a claim, and whether it still runs.

An owner is written as "HOST PID:START" (START is the process's start time where /proc shows it), so a
dead process whose pid was reused is not mistaken for the live one. Processes on other machines sharing
the disk cannot be checked and count as alive.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

PID_MAX = 2**31 - 1  # pid_t's range: a number beyond it (or below 1) is no pid at all


def parse_pid(text: str) -> int | None:
    """The pid a leftover's name carries, or None where it is no pid (not digits, 0, or beyond pid_t): such a
    name is not one of ours to judge, so callers leave it alone."""
    if not text.isdigit() or not 0 < int(text) <= PID_MAX:
        return None
    return int(text)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this machine (a pid outside 1..PID_MAX names none)."""
    if not 0 < pid <= PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, under another user
        return True
    return True


def process_id(pid: int) -> str:
    """`pid` and, where /proc shows it, the process's start time ("1234:98765")."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return f"{pid}:{stat.rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return str(pid)


def this_owner() -> str:
    """This process as an owner ("HOST PID:START"); computed per call, since a forked child is another owner."""
    return f"{socket.gethostname()} {process_id(os.getpid())}"


def owner_alive(owner: str, renewed: float | None = None, lease_s: float | None = None) -> bool:
    """Whether the process an owner string names still runs. An owner on another machine cannot be asked:
    it counts as alive, or, given when its claim was last `renewed` (a time.time()) and a `lease_s`, while
    that lease has not run out."""
    host, _, proc = owner.partition(" ")
    if host != socket.gethostname():
        return True if renewed is None or lease_s is None else time.time() - renewed < lease_s
    if not proc:
        return True
    pid = parse_pid(proc.split(":")[0])
    if pid is None:  # a malformed owner: not ours to judge dead
        return True
    return pid_alive(pid) and process_id(pid) == proc
