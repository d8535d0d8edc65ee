"""Process memory settings for the executor: glibc's malloc tuned once, so that the buffers a plan
frees at the end of a run are reused by the next run instead of being unmapped and faulted in anew.

Why: numpy takes its arrays from malloc. glibc serves a request above its mmap threshold (128 KiB
at first, raised on the fly up to 32 MiB as mapped blocks are freed) with a fresh mapping, and
returns the top of its heap to the kernel once more than its trim threshold (twice the mmap
threshold) is free there. A plan's intermediates are freed at the end of every run, so a run at
batch 32 faulted much of its working set in again: 1,500-3,900 minor faults (6-16 MB) per run for the CNN,
the transformer and the Inception-shaped net of benchmarks/converters_infer.py (one model per
process; how many depends on what the process freed before). strace showed heap-top trims (7-17
brk calls per run), no munmap: the outputs and conv scratch of 0.5-8 MB lived on the heap, whose top
was handed back between runs. Setting either threshold alone switches glibc's adaptive threshold
off and makes it worse (up to 31,700 faults per run for the ResNet-50-shaped net, then mapped);
both together remove the faults.

What: M_MMAP_THRESHOLD = 32 MiB (glibc's largest: bigger arrays are mapped, and numpy asks the
kernel for huge pages for them) and M_TRIM_THRESHOLD = 128 MiB (the free memory the heap may keep:
32 MiB left MobileNetV2 at batch 32 with 1,965 faults per run, 64 MiB with none; RSS grew by
0-21 MB). The first Session does it, once per process. Skipped off glibc, when ISTHMUS_MALLOC=0
(or off/false/no), and when the user set glibc's malloc tunables (MALLOC_*_ variables,
GLIBC_TUNABLES=glibc.malloc.*): theirs win.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from dataclasses import dataclass
from typing import Optional

ENV = "ISTHMUS_MALLOC"
MMAP_THRESHOLD = 32 << 20   # glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 128 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # mallopt's parameter numbers (malloc.h)
_USER_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


@dataclass(frozen=True)
class MallocTuning:
    """What tune_malloc did: `applied`, or why not (`reason`), and the thresholds it set."""
    applied: bool
    reason: str
    mmap_threshold: int = 0
    trim_threshold: int = 0


_done: Optional[MallocTuning] = None
_lock = threading.Lock()


def _glibc() -> Optional[ctypes.CDLL]:
    """The process's C library when it is glibc (it alone has gnu_get_libc_version), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (musl and others lack it)
        libc.mallopt
    except (OSError, AttributeError):
        return None
    return libc


def _skip_reason(environ) -> Optional[str]:
    """Why the process's malloc is left alone, or None to tune it."""
    if environ.get(ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return f"{ENV}={environ[ENV]}"
    user = [v for v in _USER_VARS if v in environ]
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        user.append("GLIBC_TUNABLES")
    if user:
        return f"the user tuned malloc ({', '.join(user)})"
    return None


def tune_malloc(environ=None) -> MallocTuning:
    """Sets glibc's mmap and trim thresholds once per process (see the module docstring); later
    calls return the first call's result. Never raises: a process it cannot tune runs as before."""
    global _done
    with _lock:
        if _done is None:
            _done = _tune(os.environ if environ is None else environ)
        return _done


def _tune(environ) -> MallocTuning:
    reason = _skip_reason(environ)
    if reason is not None:
        return MallocTuning(False, reason)
    libc = _glibc()
    if libc is None:
        return MallocTuning(False, f"not glibc ({sys.platform})")
    if not libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        return MallocTuning(False, "mallopt(M_MMAP_THRESHOLD) refused")
    if not libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD):
        return MallocTuning(False, "mallopt(M_TRIM_THRESHOLD) refused", MMAP_THRESHOLD)
    return MallocTuning(True, "glibc", MMAP_THRESHOLD, TRIM_THRESHOLD)


def malloc_tuning() -> Optional[MallocTuning]:
    """What tune_malloc did in this process, or None before the first Session."""
    return _done


def release_memory() -> bool:
    """Gives the heap's free pages back to the kernel now (glibc's malloc_trim), e.g. after a
    large job in a long-lived process; True when glibc released any."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))
