"""A task's rendezvous: values in flight, keyed by (src device, dst device, tensor, step id).

core's Send/Recv kernels key a transfer by ("src;dst;tensor", invocation count) (see
core/ops/comm.py); `PartRendezvous` is what one registered part's Session sees, and maps
those keys to the step id the part is running. Every wait is bounded, and aborting a step
wakes all of that step's waiters at once.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

from ..core.rendezvous import RendezvousAborted, RendezvousError, RendezvousTimeout
from .shm import release_value

DEFAULT_RECV_TIMEOUT_S = 30.0
_ABORTED_KEPT = 4096   # aborted step ids remembered (a late Send of one is refused)

Key = Tuple[str, str, str, int]  # (src device, dst device, tensor, step id)


def show(key: Key) -> str:
    return f"'{key[2]}' from {key[0]} to {key[1]} (step {key[3]})"


class StepRendezvous:
    """The table of one task. A value is taken once; `put` of an aborted step is refused."""

    def __init__(self, timeout: float = DEFAULT_RECV_TIMEOUT_S):
        self.timeout = float(timeout)
        self._values: Dict[Key, Any] = {}
        self._aborted: "OrderedDict[int, BaseException]" = OrderedDict()
        self._cond = threading.Condition()
        self._closed = False   # the task stops: every wait ends at once

    def put(self, key: Key, value: Any) -> None:
        with self._cond:
            err = self._aborted.get(key[3])
            if err is not None:
                raise RendezvousAborted(f"step {key[3]} was aborted: {err}") from err
            if key in self._values:
                raise RendezvousError(f"tensor {show(key)} was sent twice")
            self._values[key] = value
            self._cond.notify_all()

    def take(self, key: Key, timeout: Optional[float] = None) -> Any:
        timeout = self.timeout if timeout is None or timeout <= 0 else float(timeout)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise RendezvousAborted(f"the task stopped while waiting for {show(key)}")
                err = self._aborted.get(key[3])
                if err is not None:
                    raise RendezvousAborted(f"step {key[3]} was aborted while waiting for {show(key)}: "
                                            f"{type(err).__name__}: {err}") from err
                if key in self._values:
                    return self._values.pop(key)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RendezvousTimeout(f"nothing arrived for {show(key)} within {timeout:g} s")
                self._cond.wait(left)

    def abort_step(self, step_id: int, error: BaseException) -> None:
        with self._cond:
            self._aborted.setdefault(step_id, error)
            while len(self._aborted) > _ABORTED_KEPT:
                self._aborted.popitem(last=False)
            for k in [k for k in self._values if k[3] == step_id]:
                release_value(self._values.pop(k))
            self._cond.notify_all()

    def aborted(self, step_id: int) -> Optional[BaseException]:
        with self._cond:
            return self._aborted.get(step_id)

    def forget_step(self, step_id: int) -> None:
        with self._cond:
            self._aborted.pop(step_id, None)
            for k in [k for k in self._values if k[3] == step_id]:
                release_value(self._values.pop(k))

    def close(self) -> None:
        """End every wait now, and every later one at once (the task stops)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def clear(self) -> None:
        """Drop every value and end every wait (the task stops), freeing what they hold."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            values = list(self._values.values())
            self._values.clear()
        for v in values:
            release_value(v)

    def pending(self) -> List[Key]:
        with self._cond:
            return list(self._values)


class PartRendezvous:
    """The rendezvous one registered part's Session sees.

    `deposit(key, value)` stores a Send's value (the worker may lay it out for the wire
    first); `fetch(src, dst, tensor, step, timeout)` gets a Recv's value, locally or from
    the task that ran the Send; `take` takes it from this task's table, for the keys in
    `local` (values the master puts there itself: cloud/master.py, pushes). Steps of one
    part run one at a time (the Send/Recv kernels count invocations per compiled plan), so
    `step_id` is set per step.
    """

    def __init__(self, deposit: Callable[[Key, Any], None], fetch: Callable[..., Any],
                 abort: Callable[[int, BaseException], None], timeout: float = DEFAULT_RECV_TIMEOUT_S,
                 take: Optional[Callable[..., Any]] = None, local: Optional[set] = None):
        self._deposit, self._fetch, self._abort = deposit, fetch, abort
        # keys in `local` are taken from this task's own table (`take`): the master puts them there
        self._take, self._local = take, (local if local is not None else set())
        self.prefetched: Dict[Tuple[str, str, str], Any] = {}  # this step's Recvs already started
        self.step_id = 0
        self.default_timeout = float(timeout)
        self.timeout = self.default_timeout

    @staticmethod
    def split(key: Hashable) -> Tuple[str, str, str]:
        k = key[0] if isinstance(key, tuple) else key
        parts = str(k).split(";", 2)
        if len(parts) != 3:
            raise RendezvousError(f"malformed transfer key {k!r}; expected 'src;dst;tensor'")
        return parts[0], parts[1], parts[2]

    def send(self, key: Hashable, value: Any) -> None:
        src, dst, tensor = self.split(key)
        self._deposit((src, dst, tensor, self.step_id), value)

    def recv(self, key: Hashable, timeout: Optional[float] = None) -> Any:
        src, dst, tensor = self.split(key)
        if self.prefetched:
            started = self.prefetched.pop((src, dst, tensor), None)
            if started is not None:
                return started.result()
        if self._local and (src, dst, tensor) in self._local and self._take is not None:
            return self._take(src, dst, tensor, self.step_id, timeout or self.timeout)
        return self._fetch(src, dst, tensor, self.step_id, timeout or self.timeout)

    def abort(self, error: BaseException) -> None:
        self._abort(self.step_id, error)
