"""Compiled loop kernels (numba), for the few ops numpy cannot do in a handful of passes.

numpy runs a depthwise convolution as about twenty elementwise passes per output (one multiply
and one add per kernel tap); a compiled loop does it in one, keeping the nine products in
registers (MobileNetV2-96's depthwise layers at batch 32: about 80 ms in numpy passes against
about 12 ms compiled, one thread). This package is a leaf: it imports numpy and, lazily, numba,
and nothing of isthmus, so core and edge may both use it.

numba is imported on the first kernel call, not at `import isthmus` (it costs about 0.4 s);
each kernel compiles on its first call for a given dtype (about a second) and is cached on disk
(numba's cache, beside this file or in NUMBA_CACHE_DIR) for later processes, stamped with a digest
of this whole package (cache_stamp: a kernel inlines other modules' functions). Without numba, or
with ISTHMUS_JIT=0 in the environment, `available()` is False and callers keep their numpy
kernels: results agree to float rounding either way (tests run both).
"""
from __future__ import annotations

import importlib
import os
import threading

__all__ = ["available", "enabled_by_env", "loaded"]

_MODULES: dict = {}


def loaded(name: str):
    """The kernel module isthmus.jit.<name>, imported on first use (it loads numba) and kept: a
    function-level import costs ~0.6 us a call, and the hot paths of a batch-1 run ask a few dozen
    times a run (a dict lookup here)."""
    m = _MODULES.get(name)
    if m is None:
        m = _MODULES[name] = importlib.import_module(f"{__name__}.{name}")
    return m

_state = {"checked": False, "ok": False}
_lock = threading.Lock()


# os.environ.get costs about 1 us (it encodes the key and decodes the value), and a batch-1 run asks
# once per convolution; where os.environ keeps its bytes-keyed dict (CPython on POSIX) the raw value
# is looked up there (about 0.1 us) and its verdict remembered. os.environ's own writes (monkeypatch,
# putenv through os.environ) update that dict, so a flip is still seen at the next call.
_RAW = getattr(os.environ, "_data", None) if os.name == "posix" else None
_RAW = _RAW if isinstance(_RAW, dict) else None
_KEY = b"ISTHMUS_JIT"
_verdicts: dict = {}  # raw value -> enabled


def enabled_by_env() -> bool:
    """False when ISTHMUS_JIT is set to 0/false/no/off (read at each call: tests flip it)."""
    if _RAW is None:
        return _parse(os.environ.get("ISTHMUS_JIT", "1"))
    raw = _RAW.get(_KEY)
    v = _verdicts.get(raw)
    if v is None:
        if len(_verdicts) > 16:  # a caller cycling through many spellings: stay bounded
            _verdicts.clear()
        v = _verdicts[raw] = _parse("1" if raw is None else os.fsdecode(raw))
    return v


def _parse(value: str) -> bool:
    return value.strip().lower() not in ("0", "false", "no", "off")


def available() -> bool:
    """Whether compiled kernels may be used now: numba imports and ISTHMUS_JIT does not say no."""
    if not enabled_by_env():
        return False
    if not _state["checked"]:
        with _lock:
            if not _state["checked"]:
                try:
                    # deferred: numba is optional (its ImportError is handled)
                    import numba  # noqa: F401

                    from . import cache_lock, cache_stamp  # deferred: they import numba's caching module
                    cache_stamp.install()  # a change anywhere here recompiles every kernel once
                    cache_lock.install()  # processes compiling the same kernel cold do not mix their files
                    _state["ok"] = True
                except Exception:  # not installed, or broken against this numpy: numpy kernels serve
                    _state["ok"] = False
                _state["checked"] = True
    return _state["ok"]
