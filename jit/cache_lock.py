"""numba's on-disk cache writes serialized across processes (flock on `<index>.lock`).

numba's IndexDataCacheFile.save reads a kernel's index, picks the first free data-file number and
writes both files without a lock. Two processes saving different signatures of one kernel at once
(two test workers on a clean checkout, a local cluster's ps and worker tasks, `isthmus serve` beside
a client, all compiling cold) can both pick number 1, and the index can name the other signature's
machine code (numba issue 4807's family). Inside the lock, save re-reads the index and takes a fresh
number. Loads need no lock: each file is replaced atomically. Installed with cache_stamp when numba
is first imported for the kernels (jit.available()).
"""
from __future__ import annotations

import functools


def install() -> bool:
    """Wrap numba's IndexDataCacheFile.save in an exclusive flock; True once installed. False where
    flock (POSIX) or numba is missing, or numba's cache has not the shape this was written against."""
    try:
        import fcntl  # deferred: POSIX only

        from numba.core import caching  # deferred: numba is optional
    except ImportError:
        return False
    save = getattr(getattr(caching, "IndexDataCacheFile", None), "save", None)
    if save is None:
        return False
    if getattr(save, "locked_across_processes", False):
        return True

    @functools.wraps(save)
    def locked_save(self, key, data):
        with open(self._index_path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            return save(self, key, data)
    locked_save.locked_across_processes = True
    caching.IndexDataCacheFile.save = locked_save
    return True
