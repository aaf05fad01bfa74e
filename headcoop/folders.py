"""Replacing a folder in one step: swap two folders atomically where the system can (Linux renameat2), the one
mechanism `hc.save` (checkpoints) and `result.save` (results) share."""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import sys
from pathlib import Path


def exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    libc = _libc()
    if libc is None:
        return False
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


@functools.cache
def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.renameat2  # noqa: B018 (glibc >= 2.28)
    except (OSError, AttributeError):
        return None
    return libc


__all__ = ["exchange"]
