"""Where Send and Recv kernels meet: an in-process rendezvous keyed by (key, step).

The parts of a partitioned graph run in separate Sessions (one per device) that share a
rendezvous. A Send deposits a value under a key; the matching Recv takes it, waiting at
most a bounded time. The cloud runtime puts the same interface over gRPC.

Every wait is bounded: a Recv that waits longer than its timeout raises a
RendezvousTimeout naming the key, and `abort(error)` wakes every waiter at once (a part
that failed must not leave the others hanging until their timeouts).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Hashable, Optional, Tuple

from .errors import IsthmusError

DEFAULT_TIMEOUT_S = 60.0


class RendezvousError(IsthmusError, RuntimeError):
    """A transfer failed: the rendezvous was aborted, or a value arrived malformed."""


class RendezvousTimeout(RendezvousError, TimeoutError):
    """No value arrived for a key within the timeout."""


class RendezvousAborted(RendezvousError):
    """Another party aborted the rendezvous (it failed); the waiter gives up at once."""


class InProcessRendezvous:
    """A table of values in flight, for parts running in one process.

    `delay(key, value) -> seconds`, when given, makes each value visible only that long
    after it was sent: an emulated link (bytes / bandwidth + latency) for measured runs.
    A sent value is never waited for by its sender; buffers are unbounded (the plans
    that use this send each tensor once per step, so a step holds at most one value per key).
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S,
                 delay: Optional[Callable[[Hashable, Any], float]] = None):
        if not timeout > 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.delay = delay
        self._values: Dict[Hashable, Tuple[float, Any]] = {}  # key -> (visible at, value)
        self._cond = threading.Condition()
        self._aborted: Optional[BaseException] = None
        self.sent = 0  # counters, for tests and reports
        self.received = 0

    def send(self, key: Hashable, value: Any) -> None:
        ready = time.perf_counter() + (self.delay(key, value) if self.delay is not None else 0.0)
        with self._cond:
            self._check_aborted(key)
            if key in self._values:
                raise RendezvousError(f"rendezvous key {_show(key)} was sent twice before being received")
            self._values[key] = (ready, value)
            self.sent += 1
            self._cond.notify_all()

    def recv(self, key: Hashable, timeout: Optional[float] = None) -> Any:
        timeout = self.timeout if timeout is None else float(timeout)
        deadline = time.perf_counter() + timeout
        with self._cond:
            while True:
                self._check_aborted(key)
                now = time.perf_counter()
                entry = self._values.get(key)
                if entry is not None and entry[0] <= now:
                    del self._values[key]
                    self.received += 1
                    return entry[1]
                if now >= deadline:
                    raise RendezvousTimeout(f"rendezvous: nothing arrived for key {_show(key)} "
                                            f"within {timeout:g} s (did the sending part run?)")
                wake = deadline if entry is None else min(deadline, entry[0])
                self._cond.wait(wake - now)

    def abort(self, error: BaseException) -> None:
        """Fail every pending and future wait with `error` (the first abort wins)."""
        with self._cond:
            if self._aborted is None:
                self._aborted = error
            self._cond.notify_all()

    @property
    def aborted(self) -> Optional[BaseException]:
        return self._aborted

    def pending(self) -> list:
        """Keys sent but not yet received."""
        with self._cond:
            return list(self._values)

    def _check_aborted(self, key: Hashable) -> None:
        if self._aborted is not None:
            raise RendezvousAborted(f"rendezvous aborted while handling key {_show(key)}: "
                                  f"{type(self._aborted).__name__}: {self._aborted}") from self._aborted


def _show(key: Hashable) -> str:
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], int):
        return f"'{key[0]}' (step {key[1]})"
    return repr(key)
