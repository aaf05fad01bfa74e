"""Claims on the runs of a sweep: two sweeps started into one folder never train the same run.

A claim is a file `OUT/.headcoop-claims/<run>` created with O_EXCL and holding its owner (`owners.py`); the
sweep that creates it trains the run. A claim whose process died is taken over.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from headcoop.storage.owners import owner_alive, this_owner

CLAIMS = ".headcoop-claims"


class Claims:
    """Per-run claim files `OUT/.headcoop-claims/<run>`, created with O_EXCL: the first sweep to create one
    trains that run. A claim whose process died is taken over: on this machine the process is looked up;
    a claim from another machine sharing the folder is a lease, renewed (its mtime touched) every
    lease_s / 4 seconds by a thread of the sweep holding it, and taken over once lease_s pass unrenewed."""

    def __init__(self, out: Path, lease_s: float = 300.0):
        self.folder = out / CLAIMS
        self.held: set[str] = set()
        self.lease_s = lease_s
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def renew(self) -> None:
        """Touch every claim this sweep holds (the lease other machines read)."""
        for name in list(self.held):
            with contextlib.suppress(FileNotFoundError):
                os.utime(self.folder / name)

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self.lease_s / 4):
            self.renew()

    def take(self, name: str) -> bool:
        self.folder.mkdir(exist_ok=True)
        file = self.folder / name
        for _ in range(2):
            try:
                fd = os.open(file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if self.alive(name):
                    return False
                # A dead sweep's claim: move it away under a unique name (only one taker succeeds), retry.
                try:
                    os.rename(file, self.folder / f".stale-{name}-{os.getpid()}")
                    os.unlink(self.folder / f".stale-{name}-{os.getpid()}")
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                f.write(this_owner())
            self.held.add(name)
            if self._renewer is None:
                self._renewer = threading.Thread(target=self._renew_until_stopped, daemon=True, name="claim-lease")
                self._renewer.start()
            return True
        return False

    def alive(self, name: str) -> bool:
        """Whether `name` is claimed by a running process (other than a dead one's leftover)."""
        file = self.folder / name
        try:
            owner, renewed = file.read_text(), file.stat().st_mtime
        except FileNotFoundError:
            return False
        if not owner:  # a claim being written right now
            return True
        return owner_alive(owner, renewed, self.lease_s)

    def clear_stale(self, name: str) -> None:
        """Remove the claim of `name` when its process died (a finished run a killed sweep still claimed)."""
        if (self.folder / name).exists() and not self.alive(name):
            with contextlib.suppress(FileNotFoundError):
                (self.folder / name).unlink()

    def release(self, name: str) -> None:
        if name in self.held:
            self.held.discard(name)
            with contextlib.suppress(FileNotFoundError):
                (self.folder / name).unlink()

    def release_all(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        for name in list(self.held):
            self.release(name)
        with contextlib.suppress(OSError):
            self.folder.rmdir()  # only when empty: other sweeps' claims stay
