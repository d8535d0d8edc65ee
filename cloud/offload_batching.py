"""The offload service's in-process core: per-part request queues and dynamic batching.

`OffloadService(model).infer(part, {input name: array}, timeout)` checks the request against the
part's signature, queues it, and returns its own rows of the batch it ran in; cloud/offload.py
puts a gRPC adapter and a command around it. See that module's docstring for the behaviour.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

import grpc
import numpy as np

from ..core.errors import IsthmusError
from ..core.session import Session
from ..core.trace import RunMetadata, RunOptions
from ..partitioner.devices import CLOUD_DEVICE
from .offload_model import CloudModel, CloudPart, load_cloud_parts

DEFAULT_MAX_BATCH = 32
DEFAULT_MAX_DELAY_MS = 2.0
DEFAULT_MAX_QUEUE = 256
DEFAULT_MAX_REQUEST_BYTES = 64 << 20
DEFAULT_MAX_WAIT_S = 60.0      # a request without a deadline waits at most this long
LATENCY_WINDOW = 4096          # recent requests the percentiles are taken over
THROUGHPUT_WINDOW_S = 10.0
_DEADLINE_SLACK_S = 0.1        # a caller gone this close to its deadline (or a quarter of its wait) went for it


class OffloadError(IsthmusError, RuntimeError):
    """A request the service refuses or cannot answer; `code` is the gRPC status it ends with."""
    code = grpc.StatusCode.INTERNAL


class InvalidRequest(OffloadError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class Overloaded(OffloadError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(OffloadError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class ServiceStopped(OffloadError):
    code = grpc.StatusCode.UNAVAILABLE


class Cancelled(OffloadError):
    code = grpc.StatusCode.CANCELLED


@dataclass
class InferResult:
    outputs: List[np.ndarray]   # in signature order, this request's rows only
    queue_ms: float
    compute_ms: float
    batch_size: int             # rows in the batch it ran in
    requests: int = 1           # requests in that batch
    arrived: float = 0.0        # time.monotonic() instants: the request's arrival, its batch's start and end,
    started: float = 0.0        # and its own thread taking the answer (the hand-off back from the batcher)
    ended: float = 0.0
    woke: float = 0.0
    thread: int = 0             # the batcher thread's id (a trace track)
    trace: Optional[RunMetadata] = None  # the batch's node events, when a request in it asked for a trace


class _Signal:
    """A one-shot event: one lock, held until set (a third of threading.Event's cost per request)."""
    __slots__ = ("_lock",)

    def __init__(self):
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:  # set twice (an answer racing the service's close): once is enough
            pass

    def wait(self, timeout: float) -> bool:
        return self._lock.acquire(timeout=timeout)


class _Request:
    __slots__ = ("values", "rows", "key", "deadline", "t0", "done", "result", "error", "cancelled", "trace")

    def __init__(self, values: List[np.ndarray], rows: int, deadline: float):
        self.values, self.rows, self.deadline = values, rows, deadline
        self.key = tuple(v.shape[1:] for v in values)   # requests batch together only with equal row shapes
        self.t0 = time.monotonic()
        self.trace = False
        self.done = _Signal()
        self.result: Optional[InferResult] = None
        self.error: Optional[OffloadError] = None
        self.cancelled = False

    def abandon(self) -> None:
        """The caller went away (cancelled, disconnected, or its deadline passed: gRPC cancels the
        call then too, and that callback can beat the waiting thread's own timeout, so a call gone
        at its deadline counts as deadline_exceeded): never run it, free the waiting thread."""
        if self.result is None and self.error is None:
            self.cancelled = True
            # the caller's deadline fires before ours by its request's transit time (12 ms seen on a
            # loaded machine): a cancel that close to the deadline is the deadline
            slack = min(_DEADLINE_SLACK_S, 0.25 * (self.deadline - self.t0))
            if self.deadline and time.monotonic() >= self.deadline - slack:
                self.error = DeadlineExceeded("no answer within the deadline (the caller's deadline passed)")
            else:
                self.error = Cancelled("the caller cancelled the request")
        self.done.set()


class _PartRunner:
    """One part: its compiled plan, its queue and the batcher thread that drains it."""

    def __init__(self, part: CloudPart, service: "OffloadService"):
        self.part, self.service = part, service
        self.session = Session(part.graph)
        self.run = self.session.make_callable([o.tensor for o in part.outputs], [i.tensor for i in part.inputs])
        self.fetches = [o.tensor for o in part.outputs]
        self.feeds = [i.tensor for i in part.inputs]
        self.by_name: Dict[str, int] = {s.name: k for k, s in enumerate(part.inputs)}
        self.queue: collections.deque = collections.deque()
        self.queued_rows = 0
        self.arriving = 0   # requests for this part being decoded and checked: the batcher waits for them
        self.busy = False   # a batch of this part is running (on the batcher's thread, or inline on a caller's)
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._loop, name=f"isthmus-offload-{part.name}", daemon=True)

    # ---- checks, before anything queues ----------------------------------------------------------
    def check(self, inputs: Mapping[str, np.ndarray], max_bytes: int) -> _Request:
        p = self.part
        extra = [k for k in inputs if k not in self.by_name]
        if extra:
            raise InvalidRequest(f"part '{p.name}': input '{extra[0]}' is not in its signature; it takes "
                                 f"{[s.name for s in p.inputs]}")
        missing = [s.name for s in p.inputs if s.name not in inputs]
        if missing:
            raise InvalidRequest(f"part '{p.name}': input '{missing[0]}' is missing")
        values, rows, total = [], None, 0
        for s in p.inputs:
            v = inputs[s.name]
            if not isinstance(v, np.ndarray):
                v = np.asarray(v)
            total += v.nbytes
            if total > max_bytes:
                raise InvalidRequest(f"part '{p.name}': input '{s.name}' takes the request to {total} bytes, "
                                     f"over the limit of {max_bytes}")
            if v.dtype != s.dtype:
                raise InvalidRequest(f"part '{p.name}': input '{s.name}' is {v.dtype.name}; "
                                     f"the part takes {s.dtype.name}")
            if v.ndim != len(s.shape) or any(w != -1 and d != w for d, w in zip(v.shape[1:], s.shape[1:])) \
                    or (s.shape and s.shape[0] != -1 and v.shape[0] != s.shape[0]):
                raise InvalidRequest(f"part '{p.name}': input '{s.name}' has shape {list(v.shape)}; the part takes "
                                     f"{list(s.shape)} (-1: any)")
            if v.ndim:
                if rows is not None and v.shape[0] != rows:
                    raise InvalidRequest(f"part '{p.name}': input '{s.name}' has {v.shape[0]} rows; "
                                         f"{p.inputs[0].name} has {rows}")
                rows = v.shape[0]
            values.append(v)
        if rows == 0:
            raise InvalidRequest(f"part '{p.name}': input '{p.inputs[0].name}' has no rows")
        return _Request(values, rows or 1, 0.0)

    # ---- the batcher -----------------------------------------------------------------------------
    def arrive(self) -> None:
        """A request for this part is on its way in (decoding): a filling batch waits for it."""
        with self.cond:
            self.arriving += 1

    def left(self) -> None:
        """An arrival that will not queue after all (refused)."""
        with self.cond:
            self.arriving -= 1
            self.cond.notify()

    def put(self, r: _Request, arrived: bool = False) -> None:
        with self.cond:
            self.queue.append(r)
            self.queued_rows += r.rows
            self.arriving -= arrived
            self.cond.notify()

    def try_inline(self, r: _Request, announced: bool) -> bool:
        """Run `r` at once on the caller's thread when nothing is queued, running or arriving for this
        part: a lone request then costs no hand-off to the batcher thread and back. Meanwhile others
        queue, and the batcher runs them (batched) once this one is done."""
        with self.cond:
            if self.busy or self.queue or self.arriving > announced or self.service.stopping:
                return False
            self.busy = True
            self.arriving -= announced
        try:
            self._run([r], time.monotonic())
        finally:
            with self.cond:
                self.busy = False
                self.cond.notify()
        return True

    def _take(self) -> Optional[List[_Request]]:
        svc = self.service
        with self.cond:
            while (not self.queue or self.busy) and not svc.stopping:
                self.cond.wait()
            if not self.queue:
                return None
            # a batch waits to fill only while more requests are on their way in (decoding, checks), and at
            # most max_queue_delay after its first request arrived: a request alone runs at once, no fixed sleep
            flush_at = self.queue[0].t0 + svc.max_queue_delay_s
            while not svc.stopping and self.queued_rows < svc.max_batch_size and self.part.batchable \
                    and self.arriving > 0:
                left = flush_at - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            batch, rows = [], 0
            while self.queue:
                r = self.queue[0]
                if batch and (not self.part.batchable or r.key != batch[0].key or rows + r.rows > svc.max_batch_size):
                    break
                self.queue.popleft()
                self.queued_rows -= r.rows
                svc.dequeued(1)
                if not r.cancelled:
                    batch.append(r)
                    rows += r.rows
            self.busy = bool(batch)
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            try:
                now = time.monotonic()
                live = []
                for r in batch:
                    if now >= r.deadline:
                        r.error = DeadlineExceeded(f"part '{self.part.name}': the deadline passed after "
                                                   f"{(now - r.t0) * 1e3:.1f} ms in the queue, before the request ran")
                        r.done.set()
                    else:
                        live.append(r)
                if live:
                    self._run(live, now)
            finally:
                with self.cond:
                    self.busy = False

    def _run(self, batch: List[_Request], started: float) -> None:
        rows = sum(r.rows for r in batch)
        try:
            if len(batch) == 1:
                feeds = batch[0].values
            else:
                feeds = [np.concatenate([r.values[k] for r in batch]) for k in range(len(self.part.inputs))]
            md = None
            if any(r.trace for r in batch):  # the whole batch runs traced (node by node, on this thread)
                md = RunMetadata()
                outs = self.session.run(self.fetches, dict(zip(self.feeds, feeds)), RunOptions(trace=True), md)
            else:
                outs = self.run(*feeds)
            outs = [np.asarray(o) for o in outs]
            if len(batch) > 1 and any(o.ndim == 0 or o.shape[0] != rows for o in outs):
                raise OffloadError(f"part '{self.part.name}' returned {[list(o.shape) for o in outs]} "
                                   f"for a batch of {rows} rows")
        except Exception as e:  # noqa: BLE001  (the failing node is named by the executor)
            err = e if isinstance(e, OffloadError) else OffloadError(
                f"part '{self.part.name}' failed: {type(e).__name__}: {e}")
            for r in batch:
                r.error = err
                r.done.set()
            self.service.batch_done(len(batch), rows)
            return
        end = time.monotonic()
        compute_ms = (end - started) * 1e3
        off, n, tid = 0, len(batch), threading.get_ident() % 100000
        for r in batch:
            mine = outs if n == 1 else [o[off:off + r.rows] for o in outs]
            off += r.rows
            r.result = InferResult(mine, (started - r.t0) * 1e3, compute_ms, rows, n, r.t0, started, end, 0.0, tid,
                                   md if r.trace else None)
            r.done.set()
        self.service.batch_done(len(batch), rows)


class OffloadService:
    """The in-process service: `infer(part, {input name: array}, timeout)` -> InferResult, batched
    with whatever else is queued for that part; raises an OffloadError subclass when refused."""

    def __init__(self, model: Union[CloudModel, str, os.PathLike], max_batch_size: int = DEFAULT_MAX_BATCH,
                 max_queue_delay_ms: float = DEFAULT_MAX_DELAY_MS, max_queue: int = DEFAULT_MAX_QUEUE,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, max_wait_s: float = DEFAULT_MAX_WAIT_S,
                 log_every_s: Optional[float] = None, log: Optional[Callable[[str], None]] = None,
                 trace_device: str = CLOUD_DEVICE):
        if max_batch_size < 1 or max_queue < 1 or max_queue_delay_ms < 0 or max_request_bytes < 1 or max_wait_s <= 0:
            raise ValueError(f"offload limits must be positive: max_batch_size={max_batch_size}, "
                             f"max_queue={max_queue}, "
                             f"max_queue_delay_ms={max_queue_delay_ms}, max_request_bytes={max_request_bytes}, "
                             f"max_wait_s={max_wait_s}")
        self.model = model if isinstance(model, CloudModel) else load_cloud_parts(model)
        self.max_batch_size = int(max_batch_size)
        self.max_queue_delay_s = float(max_queue_delay_ms) / 1e3
        self.max_queue = int(max_queue)
        self.max_request_bytes = int(max_request_bytes)
        self.max_wait_s = float(max_wait_s)
        self.trace_device = trace_device  # the track a traced request's service spans are drawn on
        self.measured_overhead: Optional[dict] = None  # OffloadServer.measure_overhead's last result
        self.stopping = False
        self._lock = threading.Lock()
        self._pending = 0
        self._counts = collections.Counter()
        self._recent: collections.deque = collections.deque(maxlen=LATENCY_WINDOW)  # (end time, latency ms)
        # (overhead, queue, compute) ms of recent answered requests; overhead = our code's time outside the batch
        self._parts: collections.deque = collections.deque(maxlen=LATENCY_WINDOW)
        self._started = time.monotonic()
        self.runners = {name: _PartRunner(p, self) for name, p in self.model.parts.items()}
        for r in self.runners.values():
            r.thread.start()
        self._log = log
        self._log_stop = threading.Event()
        if log_every_s:
            threading.Thread(target=self._log_loop, args=(float(log_every_s),), name="isthmus-offload-log",
                             daemon=True).start()

    def warm_up(self, sizes: Optional[Sequence[int]] = None) -> int:
        """Run every part on zeros at each batch size in `sizes` (default: 1, 2, 4, ... up to
        max_batch_size, then max_batch_size twice more; a part that is not batchable: once, at its fixed
        size) before serving. The largest batch's buffers are the server's peak working set (MobileNet
        tail at 64 rows: 41 MiB, against 17 at 26 rows); glibc maps them the first time and serves them
        from the heap once its mmap threshold has risen, so a server that has run its largest batch a
        few times holds its peak from the start instead of growing to it under load. Returns the
        batches run. Call it before serving: it runs alongside the batchers, not through them."""
        if sizes is None:
            m = self.max_batch_size
            sizes = [1 << k for k in range(m.bit_length()) if 1 << k < m] + [m] * 3
        runs = 0
        for r in self.runners.values():
            p = r.part
            for rows in sizes if p.batchable else [None]:
                feeds = [np.zeros([rows if (rows and i == 0) else (1 if d < 0 else d)
                                   for i, d in enumerate(s.shape)], s.dtype) for s in p.inputs]
                try:
                    r.run(*feeds)
                except Exception as e:  # noqa: BLE001  (zeros may be outside a part's domain: say so, go on)
                    if self._log:
                        self._log(f"offload: warm-up of part '{p.name}' at {rows} rows failed: {e}")
                    break
                runs += 1
        return runs

    # ---- serving ---------------------------------------------------------------------------------
    def runner(self, part: str) -> _PartRunner:
        r = self.runners.get(part)
        if r is None:
            raise InvalidRequest(f"unknown part {part!r}; this service runs {sorted(self.runners)}")
        return r

    def arriving(self, part: str) -> bool:
        """Announce a request for `part` that is being decoded (the gRPC servicer, before it decodes the
        tensors): that part's filling batch waits for it. Pass `announced=True` to `infer`, or call
        `not_arriving(part)` if it never gets there. False (nothing announced) for an unknown part."""
        r = self.runners.get(part)
        if r is None:
            return False
        r.arrive()
        return True

    def not_arriving(self, part: str) -> None:
        self.runners[part].left()

    def infer(self, part: str, inputs: Mapping[str, np.ndarray], timeout: Optional[float] = None,
              on_cancel: Optional[Callable[[Callable[[], None]], bool]] = None, trace: bool = False,
              announced: bool = False, arrived: Optional[float] = None, record: bool = True) -> InferResult:
        """`on_cancel(fn)` registers fn to call when the caller goes away (a gRPC context's
        add_callback, which returns False when the call has ended already). `trace`: run its batch
        traced (InferResult.trace). `announced`: the caller called `arriving(part)` for it; `arrived`:
        the time.monotonic() at which the caller took the request (default: now); `record=False`: the
        caller calls `answered` itself once it has built the answer."""
        t0 = time.monotonic()
        arrived = t0 if arrived is None else arrived
        self._count("requests")
        runner = None
        try:
            if self.stopping:
                raise ServiceStopped("the offload service is stopping")
            runner = self.runner(part)
            req = runner.check(inputs, self.max_request_bytes)
            req.trace = trace
            wait = self.max_wait_s if timeout is None else min(float(timeout), self.max_wait_s)
            if wait <= 0:
                raise DeadlineExceeded(f"part '{part}': the request arrived after its deadline")
            req.t0, req.deadline = t0, t0 + wait
            if self._pending < self.max_queue and runner.try_inline(req, announced):  # full: refuse, as queued
                announced = False
            else:
                with self._lock:
                    if self._pending >= self.max_queue:
                        raise Overloaded(f"part '{part}': {self._pending} requests are queued "
                                         f"(limit {self.max_queue}); retry later")
                    self._pending += 1
                runner.put(req, announced)
                announced = False
                if on_cancel is not None and not on_cancel(req.abandon):
                    req.abandon()
                if not req.done.wait(wait):
                    req.cancelled = True
                    raise DeadlineExceeded(f"part '{part}': no answer within the deadline ({wait * 1e3:.0f} ms)")
            if req.error is not None:
                raise req.error
        except OffloadError as e:
            if announced and runner is not None:
                runner.left()
            self.refused(e)
            raise
        end = time.monotonic()
        res = req.result
        res.arrived, res.woke = arrived, end
        with self._lock:
            self._recent.append((end, (end - t0) * 1e3))
        if record:
            self.answered(res)
        return res

    def answered(self, res: InferResult, done: Optional[float] = None) -> None:
        """Record where an answered request's time went (Stats' overhead/queue/compute medians);
        `done`: when its answer was built (default: when its thread took it)."""
        done = res.woke if done is None else done
        compute = res.ended - res.started
        with self._lock:
            self._parts.append(((done - res.arrived - compute) * 1e3, res.queue_ms, compute * 1e3))

    def refused(self, e: OffloadError, new_request: bool = False) -> None:
        """Count a refusal (`new_request`: one that never reached infer, refused while decoding)."""
        if new_request:
            self._count("requests")
        kind = {InvalidRequest: "rejected_invalid", Overloaded: "rejected_overload",
                DeadlineExceeded: "deadline_exceeded", Cancelled: "cancelled"}.get(type(e), "failed")
        self._count(kind, errors=1)

    def _count(self, what, errors: int = 0) -> None:
        with self._lock:
            self._counts[what] += 1
            self._counts["errors"] += errors

    def dequeued(self, n: int) -> None:
        with self._lock:
            self._pending -= n

    def batch_done(self, requests: int, rows: int) -> None:
        with self._lock:
            self._counts["batches"] += 1
            self._counts["batch_rows"] += rows
            self._counts["batched_requests"] += requests

    # ---- counters --------------------------------------------------------------------------------
    def stats(self) -> dict:
        now = time.monotonic()
        with self._lock:
            c = dict(self._counts)
            lat = [ms for _, ms in self._recent]
            parts = np.array(self._parts, dtype=np.float64).reshape(-1, 3)
            span = min(THROUGHPUT_WINDOW_S, now - self._started)
            recent = sum(1 for t, _ in self._recent if t >= now - THROUGHPUT_WINDOW_S)
            depth = self._pending
        batches = c.get("batches", 0)
        return {"requests": c.get("requests", 0), "errors": c.get("errors", 0),
                "rejected_overload": c.get("rejected_overload", 0), "rejected_invalid": c.get("rejected_invalid", 0),
                "deadline_exceeded": c.get("deadline_exceeded", 0), "batches": batches,
                "mean_batch_rows": c.get("batch_rows", 0) / batches if batches else 0.0,
                "mean_batch_requests": c.get("batched_requests", 0) / batches if batches else 0.0,
                "p50_latency_ms": float(np.percentile(lat, 50)) if lat else 0.0,
                "p99_latency_ms": float(np.percentile(lat, 99)) if lat else 0.0,
                "throughput_rps": recent / span if span > 0 else 0.0, "queue_depth": depth,
                **{f"{k}_p50_ms": float(np.median(parts[:, i])) if len(parts) else 0.0
                   for i, k in enumerate(("overhead", "queue", "compute"))}}

    def stats_line(self) -> str:
        s = self.stats()
        return (f"offload: {s['requests']} requests ({s['errors']} refused/failed), {s['throughput_rps']:.1f} req/s, "
                f"p50 {s['p50_latency_ms']:.2f} ms, p99 {s['p99_latency_ms']:.2f} ms, "
                f"{s['mean_batch_rows']:.2f} rows/batch over {s['batches']} batches, queue {s['queue_depth']}, "
                f"per request: overhead {s['overhead_p50_ms']:.2f} ms (queue {s['queue_p50_ms']:.2f}), "
                f"compute {s['compute_p50_ms']:.2f} ms")

    def _log_loop(self, every: float) -> None:
        out = self._log or (lambda line: print(line, file=sys.stderr, flush=True))
        while not self._log_stop.wait(every):
            out(self.stats_line())

    def close(self) -> None:
        """Stop the batchers; queued requests end UNAVAILABLE."""
        self.stopping = True
        self._log_stop.set()
        for r in self.runners.values():
            with r.cond:
                for q in r.queue:
                    q.error = ServiceStopped("the offload service stopped before the request ran")
                    q.done.set()
                self.dequeued(len(r.queue))
                r.queue.clear()
                r.queued_rows = 0
                r.cond.notify_all()
        for r in self.runners.values():
            r.thread.join(10)
            r.session.close()
