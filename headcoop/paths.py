"""Checks of the paths headcoop writes to, torch-free so the command line can run them before it imports
torch (`headcoop report --out`): each error names the argument and the bad path."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def check_out_file(out, what: str) -> Path:
    """`out` as the Path of a regular file to write (a symlink is followed to the file it names): ValueError
    for an empty name, an existing folder, a device node, FIFO or socket (never replaced by a file), a
    dangling link, or a path under a file; TypeError for a value that is no path."""
    if isinstance(out, bytes) or not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"{what}: out must be a file path, got {out!r} ({type(out).__name__})")
    if not str(out).strip():
        raise ValueError(f"{what}: out is an empty string; give a file name such as report.html")
    path = Path(out)
    if path.is_symlink():
        if not path.exists():
            raise ValueError(f"{what}: {str(out)!r} is a link to {os.readlink(path)!r}, which does not exist")
        path = Path(os.path.realpath(path))  # write the file the link names; the link stays
    if path.is_dir():
        raise ValueError(f"{what}: {str(out)!r} is a folder; give a file name such as {str(path / 'report.html')!r}")
    if path.exists() and not stat.S_ISREG(path.stat().st_mode):
        raise ValueError(f"{what}: {str(out)!r} is a special file (a device, FIFO or socket), not a regular file; "
                         "headcoop never replaces one: give a file name such as report.html")  # fmt: skip
    _no_file_above(path, what)
    _writable(path, what)
    return path


def _writable(path: Path, what: str) -> None:
    """PermissionError, before any work, where this user could not write `path` (the file where it exists, else
    the nearest folder above it that exists: the folders between are created there)."""
    if path.exists():
        if not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, f"{what}: cannot write {str(path)!r}: permission denied for this user")
        return
    for parent in path.absolute().parents:
        if parent.exists():
            if not os.access(parent, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, f"{what}: cannot write {str(path)!r}: the folder {str(parent)!r} "
                                                    "is not writable for this user")  # fmt: skip
            return


def check_out_folder(out, what: str) -> Path:
    """`out` as a Path for a folder to write into: ValueError for an empty name, a file, or a path under a
    file; TypeError for a value that is no path."""
    if isinstance(out, bytes) or not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"{what}: out must be a folder path, got {out!r} ({type(out).__name__})")
    if not str(out).strip():
        raise ValueError(f"{what}: out is an empty string; give a folder name")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what}: {str(out)!r} is a file, not a folder")
    _no_file_above(path, what)
    return path


def _no_file_above(path: Path, what: str) -> None:
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{what}: cannot write {str(path)!r}: {str(parent)!r} is a file, not a folder")
            return
