"""Replacing in one step: swap two folders atomically where the system can (Linux renameat2), the one
mechanism `hc.save` (checkpoints) and `result.save` (results) share; and replace a file the way a shell's `>`
would let the user (`replace_file`: the report's page)."""

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


def replace_file(path: Path, text: str, what: str) -> Path:
    """Write `text` to the regular file `path` as a shell's `>` would let this user, atomically: the page is
    written beside it (`.NAME.PID.partial`) and renamed over it, so a kill never leaves half a file. Where
    `path` exists, the new file keeps its mode and owner (a private 0600 file stays private), and a file this
    user may not write (read-only, or another user's without write permission) is refused with
    PermissionError, as the shell refuses it. Partial files of earlier writers that are gone are removed."""
    from headcoop.storage.owners import parse_pid, pid_alive

    for stale in path.parent.glob(f".{path.name}.*.partial"):  # what killed writers left
        pid = parse_pid(stale.name[len(path.name) + 2 : -len(".partial")])
        if pid is not None and pid != os.getpid() and not pid_alive(pid) and stale.is_file() and not stale.is_symlink():
            stale.unlink(missing_ok=True)
    old = path.stat() if path.exists() else None
    if old is not None and not os.access(path, os.W_OK):
        raise PermissionError(
            errno.EACCES,
            f"{what}: cannot write {str(path)!r}: Permission denied (the file is "
            "read-only for this user; headcoop replaces only what the shell would let you overwrite)",
        )
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        if old is not None:
            os.chmod(partial, old.st_mode & 0o7777)
            if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                try:
                    os.chown(partial, old.st_uid, old.st_gid)
                except PermissionError:  # only root gives a file away: then the shell's rule holds
                    raise PermissionError(errno.EPERM, f"{what}: cannot replace {str(path)!r}, which belongs to "
                                          "another user, without changing its owner") from None  # fmt: skip
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path
