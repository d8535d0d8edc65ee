"""Suite-wide setup for parallel workers: the longest modules first (so two workers finish together),
and numba's disk-cache writes serialized between the workers' processes."""
import functools

# Modules holding one test of 20 s or more in a clean clone (a subprocess demo, a chain of CLI
# subprocesses, the first compile of many kernels), longest first. Order only: every test still runs,
# each module's tests in their own order, so module-scoped fixtures are still built once.
LONG_FIRST = (
    "tests/test_examples.py",            # `isthmus demo` quick run: 76 s cold, load 3.5
    "tests/converters/test_onnx_edge.py",  # MobileNetV2 int8 as QDQ, op by op: 41 s
    "tests/test_cli_docs.py",            # every documented command line, one module fixture: 74 s in all
    "tests/test_cli_e2e.py",             # the four commands as subprocesses: 21 s
    "tests/apps/test_graph_io.py",       # a TFLite CNN through three formats: 20 s
)


def pytest_collection_modifyitems(session, config, items):
    """LONG_FIRST's modules ahead of the rest; a stable sort keeps every other order as collected."""
    rank = {path: i for i, path in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def lock_numba_cache_saves() -> bool:
    """Serialize numba's cache writes across processes with flock on `<index>.lock`. numba's
    IndexDataCacheFile.save reads a kernel's index, picks the first free data-file number and writes
    both files unlocked: two processes saving different signatures of one kernel at once can both pick
    number 1, and the index can end up naming the other signature's machine code (numba issue 4807's
    family). Two workers on a clean clone compile the same kernels; inside the lock, save re-reads the
    index and takes a fresh number. Loads need no lock (each file is replaced atomically). False where
    numba or flock is missing, or numba's cache has not the shape this was written against."""
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


def pytest_configure(config):
    lock_numba_cache_saves()
