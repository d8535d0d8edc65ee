"""How many threads BLAS uses, as a runtime option: calibration and prediction must agree on it.

    from isthmus.partitioner import set_blas_threads, blas_threads
    set_blas_threads(1)                       # this process, from now on
    ISTHMUS_BLAS_THREADS=1 python app.py      # the same, applied once when isthmus.partitioner is imported

A device profile is only true for the BLAS thread count it was calibrated with: on this 2-core
machine a two-thread GEMM is up to 1.9x faster than one thread for large products, no faster for
small ones, and 2-10x slower than one thread when another process holds the second core (its
threads wait for each other). calibrate.py records the count in the profile (`blas_threads`);
`check_threads` warns when a profile is used to predict a run with another count.

A Session's own `intra_op_threads` (core/threads.py) sets BLAS's count around each of its runs and
restores it after; a session without it keeps the count set here. The count is read and set
through threadpoolctl (OpenBLAS, MKL, BLIS alike). Without
threadpoolctl, `blas_threads()` is None and setting a count raises, naming the env vars that
work before numpy is imported (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS).
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Iterator, Optional

ENV = "ISTHMUS_BLAS_THREADS"
_limiter = None  # the process-wide limit set by set_blas_threads (kept so that it stays applied)


def _threadpoolctl():
    try:
        import threadpoolctl  # deferred: threadpoolctl is optional (its ImportError is handled)
        return threadpoolctl
    except ImportError:
        return None


def blas_threads() -> Optional[int]:
    """The BLAS thread count of this process now (the largest over the loaded BLAS libraries);
    None when threadpoolctl is missing or no BLAS is loaded."""
    tc = _threadpoolctl()
    if tc is None:
        return None
    counts = [int(i["num_threads"]) for i in tc.threadpool_info() if i.get("user_api") == "blas"]
    return max(counts) if counts else None


def _check_count(n, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{what}: BLAS threads must be an integer >= 1, got {n!r}")
    return n


def set_blas_threads(n: int) -> None:
    """Limit BLAS to `n` threads in this process, from now on."""
    global _limiter
    n = _check_count(n, "set_blas_threads")
    tc = _threadpoolctl()
    if tc is None:
        raise RuntimeError(f"set_blas_threads({n}) needs threadpoolctl (pip install threadpoolctl); or set "
                           f"OPENBLAS_NUM_THREADS={n} OMP_NUM_THREADS={n} before numpy is imported")
    _limiter = tc.threadpool_limits(n, user_api="blas")


@contextlib.contextmanager
def limited_blas_threads(n: Optional[int]) -> Iterator[None]:
    """BLAS on `n` threads inside the block (None: leave it as it is); restored after."""
    if n is None:
        yield
        return
    n = _check_count(n, "limited_blas_threads")
    tc = _threadpoolctl()
    if tc is None:
        raise RuntimeError(f"limiting BLAS to {n} threads needs threadpoolctl (pip install threadpoolctl)")
    with tc.threadpool_limits(n, user_api="blas"):
        yield


def apply_env(environ=os.environ) -> Optional[int]:
    """Apply ISTHMUS_BLAS_THREADS if it is set (once per process; the import does it). Returns it."""
    text = environ.get(ENV)
    if text is None or text.strip() == "":
        return None
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"{ENV}={text!r}: expected an integer >= 1") from None
    set_blas_threads(_check_count(n, ENV))
    return n


_applied = False


def apply_env_once() -> None:
    """apply_env at import: a bad value warns (naming the variable) instead of failing the import."""
    global _applied
    if _applied:
        return
    _applied = True
    try:
        apply_env()
    except (ValueError, RuntimeError) as e:
        warnings.warn(f"{ENV} ignored: {e}", RuntimeWarning, stacklevel=2)


def check_threads(profile, threads: Optional[int] = None, what: str = "") -> bool:
    """Warn (RuntimeWarning) when `profile` was calibrated with another BLAS thread count than
    `threads` (default: this process's now). True when they agree or either is unknown."""
    recorded = getattr(profile, "blas_threads", None)
    now = blas_threads() if threads is None else threads
    if recorded is None or now is None or recorded == now:
        return True
    warnings.warn(f"device profile '{profile.name}'{' (' + what + ')' if what else ''} was calibrated with "
                  f"{recorded} BLAS thread(s) but predicts a run with {now}: its times do not hold "
                  f"(recalibrate, or set_blas_threads({recorded}) / {ENV}={recorded})", RuntimeWarning, stacklevel=2)
    return False


__all__ = ["ENV", "blas_threads", "set_blas_threads", "limited_blas_threads", "apply_env", "apply_env_once", "check_threads"]
