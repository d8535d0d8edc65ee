"""The BLAS libraries' thread counts (OpenBLAS's, through threadpoolctl's view of the loaded libraries):
read and set per library, held to fewer threads inside a block (BlasThreads) with the count before the
first hold restored when the last ends. core.threads builds the session's thread options on these; the
lock is one with its (a run's count and a hold must never interleave their sets)."""
from __future__ import annotations

import threading
from typing import Optional

_lock = threading.Lock()
_controller = None  # threadpoolctl's view of the BLAS libraries, made once numpy's BLAS is loaded


def _blas_libs():
    global _controller
    if _controller is None:
        try:
            import threadpoolctl  # deferred: its library scan costs milliseconds
        except ImportError:
            return []
        _controller = threadpoolctl.ThreadpoolController().select(user_api="blas")
    return _controller.lib_controllers


def _blas_to(libs, counts) -> None:
    """Each library's count to counts[i], under _lock. While another thread's BlasThreads holds BLAS
    (a split's one-thread GEMMs), the count is left at the hold's and becomes the one the hold
    restores: a run starting or ending beside a hold changed BLAS's count under its GEMMs (two
    sessions at two threads, one thread's input gradient now and then off in its last bits)."""
    if _hold["held"]:
        if _hold["saved"] is not None:
            _hold["saved"] = list(counts) + _hold["saved"][len(counts):]
        return
    for lib, k in zip(libs, counts):
        if _get_blas(lib) != k:
            _set_blas(lib, k)


_setters: dict = {}  # BLAS library path -> its own set_num_threads (None: threadpoolctl's)


def _set_blas(lib, n: int) -> None:
    """Set one BLAS library's thread count from whatever thread calls. threadpoolctl (3.6 and
    later) lets only one Python thread change a pthreads OpenBLAS's count, the first to set it
    while that thread lives, and drops every other thread's call without a word: a gRPC
    handler thread's one-BLAS-thread block then ran its GEMM parts on two BLAS threads, so a
    product's bits depended on which thread ran the step. isthmus serialises the count itself
    (_lock, the refcounted blocks below), so it calls the library's own setter."""
    key = getattr(lib, "filepath", id(lib))
    if key not in _setters:
        _setters[key] = _openblas_symbol(lib, "openblas_set_num_threads")
    setter = _setters[key]
    if setter is not None:
        setter(int(n))
    else:
        lib.set_num_threads(n)


_getters: dict = {}  # BLAS library path -> its own get_num_threads (None: threadpoolctl's property)


def _get_blas(lib) -> int:
    """One BLAS library's thread count, through OpenBLAS's own getter where there is one (a
    ctypes call, ~0.2 us; threadpoolctl's property costs about 1 us, and every hold reads it)."""
    key = getattr(lib, "filepath", id(lib))
    if key not in _getters:
        _getters[key] = _openblas_symbol(lib, "openblas_get_num_threads")
    getter = _getters[key]
    return int(getter()) if getter is not None else lib.num_threads


def _openblas_symbol(lib, name: str):
    """A pthreads OpenBLAS's function `name` (with the build's symbol affixes), else None."""
    if getattr(lib, "internal_api", None) != "openblas" or getattr(lib, "threading_layer", None) == "openmp":
        return None
    dynlib = getattr(lib, "dynlib", None)  # threadpoolctl's ctypes handle and the build's symbol affixes
    pre, suf = getattr(lib, "_symbol_prefix", ""), getattr(lib, "_symbol_suffix", "")
    return getattr(dynlib, f"{pre}{name}{suf}", None) if dynlib is not None else None


_hold = {"held": [], "saved": None}  # the BLAS counts held now (any thread) and the count before


class BlasThreads:
    """BLAS on at most `n` threads inside the block. BLAS's count is process-wide: overlapping
    blocks (any thread) get the least count any of them asked for, and the count before the first
    is restored when the last ends (per-call save/restore let two overlapping blocks leave it at
    1 for good). While a block holds, intra_threads() reports the count before it, so that how
    other threads split their work does not depend on timing."""

    def __init__(self, n: int = 1):
        self.n = max(1, int(n))

    def __enter__(self):
        with _lock:
            libs = _blas_libs()
            held = _hold["held"]
            if not held:  # the first hold: the counts just read are the ones it compares against
                saved = _hold["saved"] = [_get_blas(lib) for lib in libs]
                held.append(self.n)
                for lib, k in zip(libs, saved):
                    if self.n < k:
                        _set_blas(lib, self.n)
                return self
            held.append(self.n)
            _apply_hold(libs, min(held))
        return self

    def __exit__(self, *exc):
        with _lock:
            _hold["held"].remove(self.n)
            libs = _blas_libs()
            if _hold["held"]:
                _apply_hold(libs, min(_hold["held"]))
            else:
                for lib, k in zip(libs, _hold["saved"] or []):
                    if _get_blas(lib) != k:
                        _set_blas(lib, k)
                _hold["saved"] = None
        return False


def _apply_hold(libs, n: int) -> None:
    """Each library at min(n, its count before the holds)."""
    for lib, k in zip(libs, _hold["saved"] or []):
        want = min(n, k)
        if _get_blas(lib) != want:
            _set_blas(lib, want)


_readers: list = []  # [(the libraries, a function reading their largest count)] once _blas_libs found them


def blas_threads_now() -> Optional[int]:
    """The BLAS thread count now (the largest over the loaded libraries); None without BLAS. Every
    default run and every split asks (intra_threads): with one pthreads OpenBLAS it is one ctypes call
    (0.3 us, against 2 us through the per-library look-ups)."""
    libs = _blas_libs()
    if not _readers or _readers[0][0] is not libs:
        _readers[:] = [(libs, _reader(libs))]
    return _readers[0][1]()


def _reader(libs):
    if not libs:
        return lambda: None
    if len(libs) == 1:
        key = getattr(libs[0], "filepath", id(libs[0]))
        if key not in _getters:
            _getters[key] = _openblas_symbol(libs[0], "openblas_get_num_threads")
        getter = _getters[key]
        if getter is not None:
            return lambda: int(getter())
    return lambda: max(_get_blas(lib) for lib in libs)


__all__ = ["BlasThreads", "blas_threads_now"]
