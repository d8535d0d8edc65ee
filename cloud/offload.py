"""The offload service: the cloud half of split execution (proto/offload.proto).

    server = OffloadServer("model.cloud", port=0, max_batch_size=32, max_queue_delay_ms=2)
    ...                                  # edge clients call isthmus.Offload/Infer on server.port
    server.stop()

    isthmus serve model.cloud --port 7000 [--max-batch 32 --max-delay-ms 2 --max-queue 256]
                              [--tls-cert C --tls-key K [--tls-client-ca CA]] [--token-file T]

It loads the cloud parts of a split model (cloud/offload_model.py: one part per candidate cut)
and runs each with a core Session, one compiled plan per part. Requests for one part queue;
that part's batcher thread takes the queue's head and waits until max_batch_size rows are
queued or max_queue_delay_ms have passed since the head arrived, concatenates the requests
along dimension 0, runs the plan once and hands each caller its own rows. Requests whose
tensors have different non-batch shapes, or parts that are not batchable, run alone.

Limits, all answered at once with a status naming what is wrong (the server keeps serving):
an unknown part, a missing, extra or duplicated input, a wrong dtype or shape, or more than
max_request_bytes of input -> INVALID_ARGUMENT; more than max_queue requests waiting ->
RESOURCE_EXHAUSTED; a request whose deadline (the client's, else max_wait_s) passes before
its batch runs is dropped -> DEADLINE_EXCEEDED. Counters and recent latencies answer Stats
and, every log_every_s seconds, a log line.

The parts run on this machine's CPU through numpy: the core executor has no GPU path yet
(core/gpu.py, issue #9), so a cloud GPU is not used by this service today.

`OffloadService` is the in-process object (tested without a network); `offload_handler` is the
thin gRPC adapter; `OffloadServer` starts both on a port (TLS and a bearer token through
proto/security.py's ServerSecurity).
"""
from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

import grpc
import numpy as np

from ..core.errors import IsthmusError
from ..proto import offload_pb2
from . import tensor_codec
from .offload_model import CloudModel, CloudPart, CloudPartsError, TensorSpec, load_cloud_parts, \
    save_cloud_parts, cloud_part, cloud_part_from_partition, cloud_parts_from_plans  # noqa: F401  (re-exported)

SERVICE = "isthmus.Offload"
DEFAULT_MAX_BATCH = 32
DEFAULT_MAX_DELAY_MS = 2.0
DEFAULT_MAX_QUEUE = 256
DEFAULT_MAX_REQUEST_BYTES = 64 << 20
DEFAULT_MAX_WAIT_S = 60.0      # a request without a deadline waits at most this long
LATENCY_WINDOW = 4096          # recent requests the percentiles are taken over
THROUGHPUT_WINDOW_S = 10.0


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
    __slots__ = ("values", "rows", "key", "deadline", "t0", "done", "result", "error", "cancelled")

    def __init__(self, values: List[np.ndarray], rows: int, deadline: float):
        self.values, self.rows, self.deadline = values, rows, deadline
        self.key = tuple(v.shape[1:] for v in values)   # requests batch together only with equal row shapes
        self.t0 = time.monotonic()
        self.done = _Signal()
        self.result: Optional[InferResult] = None
        self.error: Optional[OffloadError] = None
        self.cancelled = False

    def abandon(self) -> None:
        """The caller went away (cancelled, disconnected): never run it, free the waiting thread."""
        if self.result is None and self.error is None:
            self.cancelled = True
            self.error = Cancelled("the caller cancelled the request")
        self.done.set()


class _PartRunner:
    """One part: its compiled plan, its queue and the batcher thread that drains it."""

    def __init__(self, part: CloudPart, service: "OffloadService"):
        from ..core.session import Session
        self.part, self.service = part, service
        self.session = Session(part.graph)
        self.run = self.session.make_callable([o.tensor for o in part.outputs], [i.tensor for i in part.inputs])
        self.by_name: Dict[str, int] = {s.name: k for k, s in enumerate(part.inputs)}
        self.queue: collections.deque = collections.deque()
        self.queued_rows = 0
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
    def put(self, r: _Request) -> None:
        with self.cond:
            self.queue.append(r)
            self.queued_rows += r.rows
            self.cond.notify()

    def _take(self) -> Optional[List[_Request]]:
        svc = self.service
        with self.cond:
            while not self.queue and not svc.stopping:
                self.cond.wait()
            if not self.queue:
                return None
            flush_at = self.queue[0].t0 + svc.max_queue_delay_s
            while not svc.stopping and self.queued_rows < svc.max_batch_size and self.part.batchable:
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
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
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

    def _run(self, batch: List[_Request], started: float) -> None:
        rows = sum(r.rows for r in batch)
        try:
            if len(batch) == 1:
                feeds = batch[0].values
            else:
                feeds = [np.concatenate([r.values[k] for r in batch]) for k in range(len(self.part.inputs))]
            outs = [np.asarray(o) for o in self.run(*feeds)]
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
        off = 0
        for r in batch:
            mine = outs if len(batch) == 1 else [o[off:off + r.rows] for o in outs]
            off += r.rows
            r.result = InferResult(mine, (started - r.t0) * 1e3, compute_ms, rows)
            r.done.set()
        self.service.batch_done(len(batch), rows)


class OffloadService:
    """The in-process service: `infer(part, {input name: array}, timeout)` -> InferResult, batched
    with whatever else is queued for that part; raises an OffloadError subclass when refused."""

    def __init__(self, model: Union[CloudModel, str, os.PathLike], max_batch_size: int = DEFAULT_MAX_BATCH,
                 max_queue_delay_ms: float = DEFAULT_MAX_DELAY_MS, max_queue: int = DEFAULT_MAX_QUEUE,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, max_wait_s: float = DEFAULT_MAX_WAIT_S,
                 log_every_s: Optional[float] = None, log: Optional[Callable[[str], None]] = None):
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
        self.stopping = False
        self._lock = threading.Lock()
        self._pending = 0
        self._counts = collections.Counter()
        self._recent: collections.deque = collections.deque(maxlen=LATENCY_WINDOW)  # (end time, latency ms)
        self._started = time.monotonic()
        self.runners = {name: _PartRunner(p, self) for name, p in self.model.parts.items()}
        for r in self.runners.values():
            r.thread.start()
        self._log = log
        self._log_stop = threading.Event()
        if log_every_s:
            threading.Thread(target=self._log_loop, args=(float(log_every_s),), name="isthmus-offload-log",
                             daemon=True).start()

    # ---- serving ---------------------------------------------------------------------------------
    def runner(self, part: str) -> _PartRunner:
        r = self.runners.get(part)
        if r is None:
            raise InvalidRequest(f"unknown part {part!r}; this service runs {sorted(self.runners)}")
        return r

    def infer(self, part: str, inputs: Mapping[str, np.ndarray], timeout: Optional[float] = None,
              on_cancel: Optional[Callable[[Callable[[], None]], bool]] = None) -> InferResult:
        """`on_cancel(fn)` registers fn to call when the caller goes away (a gRPC context's
        add_callback, which returns False when the call has ended already)."""
        t0 = time.monotonic()
        self._count("requests")
        try:
            if self.stopping:
                raise ServiceStopped("the offload service is stopping")
            runner = self.runner(part)
            req = runner.check(inputs, self.max_request_bytes)
            wait = self.max_wait_s if timeout is None else min(float(timeout), self.max_wait_s)
            if wait <= 0:
                raise DeadlineExceeded(f"part '{part}': the request arrived after its deadline")
            req.t0, req.deadline = t0, t0 + wait
            with self._lock:
                if self._pending >= self.max_queue:
                    raise Overloaded(f"part '{part}': {self._pending} requests are queued (limit {self.max_queue}); "
                                     "retry later")
                self._pending += 1
            runner.put(req)
            if on_cancel is not None and not on_cancel(req.abandon):
                req.abandon()
            if not req.done.wait(wait):
                req.cancelled = True
                raise DeadlineExceeded(f"part '{part}': no answer within the deadline ({wait * 1e3:.0f} ms)")
            if req.error is not None:
                raise req.error
        except OffloadError as e:
            self.refused(e)
            raise
        end = time.monotonic()
        with self._lock:
            self._recent.append((end, (end - t0) * 1e3))
        return req.result

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
                "throughput_rps": recent / span if span > 0 else 0.0, "queue_depth": depth}

    def stats_line(self) -> str:
        s = self.stats()
        return (f"offload: {s['requests']} requests ({s['errors']} refused/failed), {s['throughput_rps']:.1f} req/s, "
                f"p50 {s['p50_latency_ms']:.2f} ms, p99 {s['p99_latency_ms']:.2f} ms, "
                f"{s['mean_batch_rows']:.2f} rows/batch over {s['batches']} batches, queue {s['queue_depth']}")

    def _log_loop(self, every: float) -> None:
        out = self._log or (lambda line: print(line, file=sys.stderr, flush=True))
        while not self._log_stop.wait(every):
            out(self.stats_line())

    def describe(self) -> offload_pb2.DescribeResponse:
        resp = offload_pb2.DescribeResponse(model=self.model.model, max_request_bytes=self.max_request_bytes,
                                            max_batch_size=self.max_batch_size,
                                            max_queue_delay_ms=self.max_queue_delay_s * 1e3)
        for p in self.model.parts.values():
            sig = resp.parts.add(name=p.name)
            for specs, dst in ((p.inputs, sig.inputs), (p.outputs, sig.outputs)):
                for s in specs:
                    dst.add(name=s.name, dtype=tensor_codec.dtype_to_enum(s.dtype), shape=list(s.shape))
        return resp

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


# ---- gRPC ----------------------------------------------------------------------------------------
class OffloadServicer:
    """Decode, call the OffloadService, encode."""

    def __init__(self, service: OffloadService):
        self.service = service

    def Describe(self, request, context):
        return self.service.describe()

    def Infer(self, request, context):
        svc = self.service
        try:
            inputs, total = {}, 0
            for nt in request.inputs:
                if nt.name in inputs:
                    err = InvalidRequest(f"part '{request.part}': input '{nt.name}' is given twice")
                    svc.refused(err, new_request=True)
                    raise err
                try:
                    d, shape, nbytes = tensor_codec.check_header(nt.tensor.dtype, nt.tensor.shape,
                                                                 svc.max_request_bytes)
                    total += nbytes
                    if total > svc.max_request_bytes:
                        raise tensor_codec.TensorCodecError(f"takes the request to {total} bytes, over the limit "
                                                            f"of {svc.max_request_bytes}")
                    inputs[nt.name] = tensor_codec.from_bytes(nt.tensor.content, d, shape, nbytes)
                except tensor_codec.TensorCodecError as e:
                    err = InvalidRequest(f"part '{request.part}': input '{nt.name}': {e}")
                    svc.refused(err, new_request=True)
                    raise err from None
            res = svc.infer(request.part, inputs, context.time_remaining(), context.add_callback)
            resp = offload_pb2.InferResponse(request_id=request.request_id, queue_ms=res.queue_ms,
                                             compute_ms=res.compute_ms, batch_size=res.batch_size)
            for spec, v in zip(svc.runner(request.part).part.outputs, res.outputs):
                tensor_codec.encode(v, out=resp.outputs.add(name=spec.name).tensor)
        except OffloadError as e:
            context.abort(e.code, str(e))
        return resp

    def Stats(self, request, context):
        return offload_pb2.StatsResponse(**{k: v for k, v in self.service.stats().items()
                                            if k in offload_pb2.StatsResponse.DESCRIPTOR.fields_by_name})


def offload_handler(service: OffloadService) -> grpc.GenericRpcHandler:
    s = OffloadServicer(service)

    def unary(fn, req):
        return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req.FromString,
                                                   response_serializer=lambda m: m.SerializeToString())
    return grpc.method_handlers_generic_handler(SERVICE, {
        "Describe": unary(s.Describe, offload_pb2.DescribeRequest),
        "Infer": unary(s.Infer, offload_pb2.InferRequest),
        "Stats": unary(s.Stats, offload_pb2.StatsRequest),
    })


class OffloadServer:
    """An OffloadService on a gRPC port (0: a free one); `security`: proto/security.ServerSecurity."""

    def __init__(self, model: Union[CloudModel, str, os.PathLike], host: str = "127.0.0.1", port: int = 0,
                 security=None, max_workers: Optional[int] = None, **limits):
        from .server import start_grpc_server
        self.service = OffloadService(model, **limits)
        s = self.service
        # every queued or running request holds a thread; with one more for each refusal, no request
        # waits unseen inside gRPC (where the queue bound could not refuse it)
        workers = max_workers or s.max_queue + s.max_batch_size * len(s.runners) + 16
        try:
            self.server, self.port = start_grpc_server(
                [offload_handler(s)], host, port, workers, max_message_bytes=2 * s.max_request_bytes + (1 << 20),
                security=security)
        except BaseException:
            s.close()
            raise
        self.host = host

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, grace: Optional[float] = 1.0) -> None:
        self.service.close()
        self.server.stop(grace).wait(10)

    def __enter__(self) -> "OffloadServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# ---- the command ---------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="the cloud-parts file of a split model (cloud/offload_model.py)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s; "
                                                             "0.0.0.0 for every interface: then use TLS and a token)")
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, help="rows per batch (default %(default)s)")
    parser.add_argument("--max-delay-ms", type=float, default=DEFAULT_MAX_DELAY_MS,
                        help="longest wait for a batch to fill (default %(default)s)")
    parser.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                        help="queued requests beyond which new ones get RESOURCE_EXHAUSTED (default %(default)s)")
    parser.add_argument("--max-request-mb", type=float, default=DEFAULT_MAX_REQUEST_BYTES / (1 << 20),
                        help="largest request's input in MiB (default %(default)s)")
    parser.add_argument("--log-every", type=float, default=10.0,
                        help="seconds between counter log lines on stderr (0: none; default %(default)s)")
    parser.add_argument("--blas-threads", type=int, default=None,
                        help="threads BLAS may use (default: its own, often every core); 1 keeps BLAS from "
                             "spinning against the gRPC threads when cores are few (needs threadpoolctl, "
                             "else set OPENBLAS_NUM_THREADS)")
    parser.add_argument("--tls-cert", help="PEM certificate chain: serve TLS (default: $ISTHMUS_TLS_CERT)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert (default: $ISTHMUS_TLS_KEY)")
    parser.add_argument("--tls-client-ca", help="require client certificates signed by this CA "
                                                "(default: $ISTHMUS_TLS_CLIENT_CA)")
    parser.add_argument("--token-file", help="require this bearer token on every call (default: $ISTHMUS_TOKEN_FILE)")


def run(args) -> int:
    from ..proto.security import SecurityError
    from .server import security_from_args
    if args.blas_threads:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            print("isthmus serve: --blas-threads needs threadpoolctl (pip install threadpoolctl); "
                  f"or set OPENBLAS_NUM_THREADS={args.blas_threads}", file=sys.stderr)
            return 2
        threadpool_limits(args.blas_threads, user_api="blas")
    try:
        security, _ = security_from_args(args)
        server = OffloadServer(args.model, host=args.host, port=args.port, security=security,
                               max_batch_size=args.max_batch, max_queue_delay_ms=args.max_delay_ms,
                               max_queue=args.max_queue, max_request_bytes=int(args.max_request_mb * (1 << 20)),
                               log_every_s=args.log_every or None)
    except (CloudPartsError, SecurityError, IsthmusError, ValueError, OSError) as e:
        print(f"isthmus serve: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    mode = security.describe() if security else "plaintext, no token: keep it on a trusted network"
    parts = ", ".join(f"{p.name} ({len(p.inputs)} in, {len(p.outputs)} out{'' if p.batchable else ', unbatched'})"
                      for p in server.service.model.parts.values())
    print(f"isthmus serve: model '{server.service.model.model}' parts {parts}", file=sys.stderr)
    print(f"isthmus serve: listening on {args.host}:{server.port} ({mode}); Ctrl-C stops", file=sys.stderr)
    print(f"ISTHMUS_OFFLOAD {args.host}:{server.port}", flush=True)
    while not stop.wait(0.5):
        pass
    print(server.service.stats_line(), file=sys.stderr)
    server.stop(grace=1.0)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="isthmus serve", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


__all__ = ["OffloadService", "OffloadServicer", "OffloadServer", "offload_handler", "InferResult", "OffloadError",
           "InvalidRequest", "Overloaded", "DeadlineExceeded", "ServiceStopped", "Cancelled", "CloudModel",
           "CloudPart", "TensorSpec", "CloudPartsError", "cloud_part", "cloud_part_from_partition",
           "cloud_parts_from_plans", "save_cloud_parts", "load_cloud_parts"]


if __name__ == "__main__":
    sys.exit(main())
