"""jit.cache_lock, the lock on numba's cache writes: two writers saving different signatures of one
kernel at the same moment each keep their own data file (unlocked, both take number 1)."""
import threading
import time

import pytest

from isthmus import jit
from isthmus.jit import cache_lock

caching = pytest.importorskip("numba.core.caching")


def _race(tmp_path, monkeypatch):
    """Two cache-file objects on one index (two processes' views) save keys a and b at once; reading the
    index takes 0.2 s, so that unlocked both writers read it before either writes."""
    read = caching.IndexDataCacheFile._load_index

    def load_index(self):
        got = read(self)
        time.sleep(0.2)
        return got
    monkeypatch.setattr(caching.IndexDataCacheFile, "_load_index", load_index)
    files = [caching.IndexDataCacheFile(str(tmp_path), "kernel-1.py311", ("stamp", 1)) for _ in range(2)]
    threads = [threading.Thread(target=f.save, args=(k, f"code for {k}")) for f, k in zip(files, "ab")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    reader = caching.IndexDataCacheFile(str(tmp_path), "kernel-1.py311", ("stamp", 1))
    return {k: reader.load(k) for k in "ab"}


def test_concurrent_saves_keep_each_signature_with_its_own_code(tmp_path, monkeypatch):
    assert cache_lock.install()  # installed by conftest's pytest_configure already: still True
    assert caching.IndexDataCacheFile.save.locked_across_processes
    assert _race(tmp_path, monkeypatch) == {"a": "code for a", "b": "code for b"}


def test_without_the_lock_the_race_loses_or_swaps_an_entry(tmp_path, monkeypatch):
    """The failure the lock prevents, shown on numba's own save (so the test above could fail)."""
    monkeypatch.setattr(caching.IndexDataCacheFile, "save", caching.IndexDataCacheFile.save.__wrapped__)
    got = _race(tmp_path, monkeypatch)
    assert sum(got[k] == f"code for {k}" for k in "ab") < 2, got  # one signature lost, or given the other's code


def test_every_isthmus_process_takes_the_lock_when_its_kernels_load_numba():
    """Not only the test processes: a server, a cluster task or the demo takes it at jit.available()."""
    import subprocess
    import sys
    code = ("from isthmus import jit; ok = jit.available(); from numba.core import caching; "
            "print(ok, getattr(caching.IndexDataCacheFile.save, 'locked_across_processes', False))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
    assert jit.available()
