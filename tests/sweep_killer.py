"""A chunk function for killing a sweep's worker process mid-chunk (sent to Dask workers by value)."""

import json
import os


def record_and_die(fd: int, path: str) -> None:
    """Write the saved run's name, its weights file's inode and mtime, and this pid to `fd`; kill this process."""
    from headcoop.storage.checkpoints import WEIGHTS

    stat = os.stat(os.path.join(path, WEIGHTS))
    os.write(fd, json.dumps({"name": os.path.basename(path), "inode": stat.st_ino,
                             "mtime_ns": stat.st_mtime_ns, "pid": os.getpid()}).encode())  # fmt: skip
    os.close(fd)
    os._exit(1)


def die_after_first_save(job, marker: str):
    """headcoop's train_chunk, except that the first call anywhere (the one that creates `marker`) kills
    its own process right after saving the chunk's first run; the marker records that run's name and
    its weights file's inode and mtime (a retrained run is saved anew: another inode)."""
    from headcoop.training import sweeps

    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return sweeps.train_chunk(job)
    real_save = sweeps.save

    def save_then_die(model, path, **kwargs):
        real_save(model, path, **kwargs)
        record_and_die(fd, path)

    sweeps.save = save_then_die
    return sweeps.train_chunk(job)


class Killing:
    """An executor that runs every chunk through `die_after_first_save` on the executor it wraps."""

    def __init__(self, inner, marker):
        self.inner, self.marker = inner, str(marker)

    def submit(self, fn, job):
        return self.inner.submit(die_after_first_save, job, self.marker)


def arm(marker: str) -> None:
    """A process pool's initializer: in this worker, `headcoop.training.sweeps.save` kills the process right after the
    first save anywhere (the one that creates `marker`, recording as `die_after_first_save` does); every
    later save, in this worker or a replacement, just saves."""
    from headcoop.training import sweeps

    real_save = sweeps.save

    def save_maybe_die(model, path, **kwargs):
        real_save(model, path, **kwargs)
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        record_and_die(fd, path)

    sweeps.save = save_maybe_die
