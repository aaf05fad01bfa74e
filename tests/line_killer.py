"""Kill a process at a chosen line: a sys.settrace tracer for the kill tests of save and sweep.

It counts the lines executed in the given source files and sends SIGKILL at line `kill_at`, so a test
can kill a forked save or sweep at every k-th step of its own code, deterministically and without sleeps.
"""

import os
import signal
import sys


class LineKiller:
    def __init__(self, files):
        self.files = set(files)
        self.count = 0
        self.kill_at = None

    def run(self, fn, kill_at=None):
        """Call fn() traced (counting lines, or killed at line kill_at); returns how many lines ran."""
        self.count, self.kill_at = 0, kill_at
        sys.settrace(self._trace)
        try:
            fn()
        finally:
            sys.settrace(None)
        return self.count

    def _trace(self, frame, event, arg):
        if frame.f_code.co_filename not in self.files:
            return None
        if event == "line":
            self.count += 1
            if self.count == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return self._trace
