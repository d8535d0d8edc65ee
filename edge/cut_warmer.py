"""Warming the offload client's cuts: each prepared interpreter run once on zeros, so that no request pays first use.

A fresh process pays on its first run of a kernel what later runs do not: compiled kernels load
(numba's cache, about 165 ms of CPU for MobileNetV2 here, multiplied by a slow edge), the arena's
pages and the mapped weights are touched for the first time. The client prepares every cut at start;
this runs each one (its edge kernels only: a remote part is skipped, its outputs read as zeros)
once, in a background thread or at once. A request on a cut not yet warm waits for that cut's
warm-up (or does it itself), never for the others'; while a request runs, the background thread
waits between kernels unless that request needs the cut it is warming. No I/O, no clock beyond
the seconds each warm-up took (`seconds`), which the client reports in its stats.
"""
from __future__ import annotations

import threading
import time
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np

from .interpreter import Interpreter

WARM_MODES = ("background", "now", "off")


def warm_interpreter(interp: Interpreter, pause=None) -> None:
    """Run `interp`'s kernels once on zero inputs, its arena zeroed first (every page touched); a
    remote part's step is skipped (its outputs stay zero). `pause()`, when given, is called before
    each kernel (the background thread waits there while a request runs)."""
    interp.arena.fill(0)
    interp.set_inputs(*[np.zeros(v.shape, v.dtype) for _, v in interp._inputs])
    with np.errstate(all="ignore"):  # zeros may divide by zero, take a log of 0: only the code paths matter
        for (kind, _), (_, step) in zip(interp.steps_info, interp.kernels):
            if kind == "remote":
                continue
            if pause is not None:
                pause()
            step()


class CutWarmer:
    """Warms interpreters given as (key, interpreter) in that order (the cut requests run now first).
    `mode`: "background" (a daemon thread), "now" (before the constructor returns) or "off"."""

    def __init__(self, jobs: Sequence[Tuple[Hashable, Interpreter]], mode: str = "background"):
        if mode not in WARM_MODES:
            raise ValueError(f"warm must be one of {WARM_MODES}, got {mode!r}")
        self.mode = mode
        self._jobs: Dict[Hashable, Interpreter] = dict(jobs)
        self._order: List[Hashable] = [k for k, _ in jobs]
        self._locks = {k: threading.Lock() for k in self._order}
        self._done = set() if mode != "off" else set(self._order)
        self.seconds: Dict[Hashable, float] = {}      # CPU seconds each warm-up took (of the thread that ran it)
        self.errors: Dict[Hashable, str] = {}         # a warm-up that raised: the request will meet it for real
        self._idle = threading.Event()                # set while no request runs
        self._idle.set()
        self._wanted: Optional[Hashable] = None       # the cut a waiting request needs: never paused
        self._thread: Optional[threading.Thread] = None
        if mode == "now":
            for k in self._order:
                self.ensure(k)
        elif mode == "background" and self._order:
            self._thread = threading.Thread(target=self._run_all, name="isthmus-cut-warmer", daemon=True)
            self._thread.start()

    @property
    def done(self) -> bool:
        return len(self._done) == len(self._order)

    def ensure(self, key: Hashable) -> None:
        """Return once `key` is warm: at once if it is, else after the background thread's warm-up
        of it, or after warming it here. Other keys are never waited for."""
        if key in self._done or key not in self._jobs:
            return
        self._wanted = key
        try:
            with self._locks[key]:
                if key not in self._done:
                    self._warm(key, pause=None)
        finally:
            self._wanted = None

    def request_started(self) -> None:
        self._idle.clear()

    def request_finished(self) -> None:
        self._idle.set()

    def wait(self, timeout: float) -> bool:
        """Wait (up to `timeout` s) for the background thread to warm everything; True when done."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.done

    def _pause_for(self, key: Hashable):
        def pause():
            # between kernels, give way to a running request unless it waits for this very cut
            while not self._idle.is_set() and self._wanted != key:
                self._idle.wait(0.05)
        return pause

    def _run_all(self) -> None:
        for k in self._order:
            self._pause_for(k)()
            with self._locks[k]:
                if k not in self._done:
                    self._warm(k, pause=self._pause_for(k))

    def _warm(self, key: Hashable, pause) -> None:
        c = time.thread_time()
        try:
            warm_interpreter(self._jobs[key], pause)
        except Exception as e:  # noqa: BLE001 - warming is best effort; the real request reports the error
            self.errors[key] = f"{type(e).__name__}: {e}"
        self.seconds[key] = time.thread_time() - c
        self._done.add(key)


__all__ = ["CutWarmer", "warm_interpreter", "WARM_MODES"]
