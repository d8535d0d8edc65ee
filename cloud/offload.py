"""The offload service: the cloud half of split execution (proto/offload.proto).

    server = OffloadServer("model.cloud", port=0, max_batch_size=32, max_queue_delay_ms=2)
    ...                                  # edge clients call isthmus.Offload/Infer on server.port
    server.stop()

    isthmus serve model.cloud --port 7000 [--max-batch 32 --max-delay-ms 2 --max-queue 256]
                              [--tls-cert C --tls-key K [--tls-client-ca CA]] [--token-file T]

It loads the cloud parts of a split model (cloud/offload_model.py: one part per candidate cut)
and runs each with a core Session, one compiled plan per part. Requests for one part queue;
that part's batcher thread takes the queue's head and, while more requests for the part are on
their way in (being decoded by other gRPC threads), waits for them until max_batch_size rows are
queued or max_queue_delay_ms have passed since the head arrived; then it concatenates the
requests along dimension 0, runs the plan once and hands each caller its own rows. A request
with nothing else arriving runs at once (no fixed sleep: a lone request used to wait the whole
delay); when nothing is queued, running or arriving for its part, it runs on its own gRPC
thread, without the hand-off to the batcher thread and back. Under load the queue fills while
the previous batch runs. Requests whose tensors
have different non-batch shapes, or parts that are not batchable, run alone. Answers are written
as InferResponse bytes directly, each output's payload copied once from its rows.

Limits, all answered at once with a status naming what is wrong (the server keeps serving):
an unknown part, a missing, extra or duplicated input, a wrong dtype or shape, or more than
max_request_bytes of input -> INVALID_ARGUMENT; more than max_queue requests waiting ->
RESOURCE_EXHAUSTED; a request whose deadline (the client's, else max_wait_s) passes before
its batch runs is dropped -> DEADLINE_EXCEEDED; a request its caller cancels is dropped too
(CANCELLED) and never runs. A failing batch answers INTERNAL, naming the node, to each of its
requests. Counters and recent latencies answer Stats and, every log_every_s seconds, a log line.

Overhead: Stats' overhead_p50_ms is our code's share of a request (arrival in the servicer to
answer built, less its batch's compute; queue_p50_ms of it waiting for the batch). The whole
round trip beyond compute, gRPC included, is measured by `OffloadServer.measure_overhead()`
(sequential loopback requests of zeros; `isthmus serve --measure-overhead` at start), which
Describe then answers as overhead_ms: what a cost model adds per cloud round trip.

Tracing: a request with `trace: true` runs its batch traced (node by node) and its answer carries
a StepTrace (proto/worker.proto; decode with cloud/tracing.decode) on a wall-clock timeline whose
origin is the request's arrival: spans decode, queue (checks + the wait for its batch), batch
(named with its rows and requests, on the batcher's thread, with the part's node events inside),
handoff (back to the request's thread) and encode, all on the service's `trace_device` track.
A Python client merges it with RunMetadata.merge; the edge client (edge/offload_client.py,
`OffloadClient(trace=True)`) decodes it strictly (edge/offload_trace.decode_service_trace) and, when clock
skew puts the service's first..last span outside its own call, re-centres it inside the call.

Memory: a batch's buffers are sized by its rows. With glibc's dynamic mmap threshold they come
from the batcher thread's heap once large ones have been freed, and that heap keeps what it
grew to: a batched server's RSS climbs with the mix of batch sizes it has run, then plateaus
(MobileNet tail, 64 clients: +7..14% over 12,800 requests after a concurrent warm-up, flat after
the second of four rounds; the growth is free heap space in a non-main arena, which malloc_trim
does not return). --malloc-mmap-threshold-kb / --malloc-trim-threshold-kb (pin_malloc) trade
CPU for a flatter RSS (benchmarks/offload_load.py --compare-serve-flags measures both).

Deployment: on few cores shared with other work, give BLAS one thread (--blas-threads 1, or
OPENBLAS_NUM_THREADS=1): multithreaded BLAS spin-waits against the gRPC threads (measured here:
the benchmark's three 1024-wide dense layers at batch 1 took 43 ms under load with default threads,
0.34 ms with one).
Without TLS and a token the service binds 127.0.0.1 whatever --host says (--insecure overrides, with a
warning); see docs/security.md.

The parts run on this machine's CPU through numpy by default; `--device gpu` (or `auto`, or
ISTHMUS_DEVICE) makes every part's Session place its nodes on the GPU (core/gpu.py, docs/gpu.md):
requests' inputs go up through copy nodes once per batch and the outputs come back once.

`OffloadService` is the in-process object (tested without a network); `offload_handler` is the
thin gRPC adapter; `OffloadServer` starts both on a port (TLS and a bearer token through
wire/security.py's ServerSecurity).
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from typing import Optional, Sequence, Union

import grpc
import numpy as np

from ..core.device_runtime import apply_device_flag
from ..core.errors import IsthmusError
from ..core.trace import NodeEvent, RunMetadata
from ..proto import offload_pb2, tensor_pb2
from ..wire import tensor_codec
from ..wire.security import SecurityError, make_channel
from . import recv_layout, tracing
from .server import safe_bind_host, security_from_args, start_grpc_server
from .offload_batching import (DEFAULT_MAX_BATCH, DEFAULT_MAX_DELAY_MS, DEFAULT_MAX_QUEUE,  # noqa: F401
                               DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_WAIT_S, Cancelled, DeadlineExceeded,  # noqa: F401
                               InferResult, InvalidRequest, OffloadError, OffloadService, Overloaded,
                               ServiceStopped)
from .offload_model import (CloudModel, CloudPart, CloudPartsError, TensorSpec, cloud_part,  # noqa: F401
                            cloud_part_from_partition, cloud_parts_from_plans, load_cloud_parts, save_cloud_parts)

SERVICE = "isthmus.Offload"
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3    # glibc's mallopt parameters
DEFAULT_MMAP_THRESHOLD_KB = 0     # glibc's own (a fixed 256 KiB kept RSS flat but cost 1.7x server CPU)


# ---- gRPC ----------------------------------------------------------------------------------------
class OffloadServicer:
    """Decode, call the OffloadService, encode."""

    def __init__(self, service: OffloadService):
        self.service = service

    def Describe(self, request, context):
        return describe(self.service)

    def Infer(self, request, context) -> bytes:
        """The answer as the bytes of an InferResponse (built by `response_bytes`, one copy of each output)."""
        arrived = time.monotonic()
        svc, part = self.service, request.part
        announced = svc.arriving(part)  # a batch filling for this part waits while we decode
        try:
            try:
                inputs = decode_inputs(svc, request)
            except BaseException:
                if announced:
                    svc.not_arriving(part)
                raise
            decoded = time.monotonic()
            res = svc.infer(part, inputs, context.time_remaining(), context.add_callback, trace=request.trace,
                            announced=announced, arrived=arrived, record=False)
            outputs = svc.runner(part).part.outputs
            data = response_bytes(request.request_id, res, [(spec.name, v) for spec, v in zip(outputs, res.outputs)])
            done = time.monotonic()
            svc.answered(res, done)
            if request.trace:
                md = request_trace(svc, part, res, decoded, done, sum(v.nbytes for v in inputs.values()),
                                   len(data))
                data += _field_bytes(6, tracing.encode(md).SerializeToString())
        except OffloadError as e:
            context.abort(e.code, str(e))
        except Exception as e:  # noqa: BLE001  (a bug here must not leave the caller without a status)
            svc.refused(OffloadError(str(e)))
            context.abort(grpc.StatusCode.INTERNAL, f"offload: {type(e).__name__}: {e}")
        return data

    def Stats(self, request, context):
        return offload_pb2.StatsResponse(**{k: v for k, v in self.service.stats().items()
                                            if k in offload_pb2.StatsResponse.DESCRIPTOR.fields_by_name})


def decode_inputs(svc: OffloadService, request) -> dict:
    """{name: zero-copy array view} of an InferRequest's inputs, header-checked before any payload is
    touched; a bad one is counted and raised as InvalidRequest naming the part and the tensor."""
    inputs, total = {}, 0
    for nt in request.inputs:
        if nt.name in inputs:
            err = InvalidRequest(f"part '{request.part}': input '{nt.name}' is given twice")
            svc.refused(err, new_request=True)
            raise err
        try:
            d, shape, nbytes = tensor_codec.check_header(nt.tensor.dtype, nt.tensor.shape, svc.max_request_bytes)
            total += nbytes
            if total > svc.max_request_bytes:
                raise tensor_codec.TensorCodecError(f"takes the request to {total} bytes, over the limit "
                                                    f"of {svc.max_request_bytes}")
            inputs[nt.name] = tensor_codec.from_bytes(nt.tensor.content, d, shape, nbytes)
        except tensor_codec.TensorCodecError as e:
            err = InvalidRequest(f"part '{request.part}': input '{nt.name}': {e}")
            svc.refused(err, new_request=True)
            raise err from None
    return inputs


def _varint(n: int) -> bytes:
    return _SMALL_VARINTS[n] if n < 128 else recv_layout.varint(n)


_SMALL_VARINTS = [bytes((i,)) for i in range(128)]


def _field_bytes(field: int, payload) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return b"".join((_varint(field << 3 | 2), _varint(len(payload)), payload))


def response_bytes(request_id: str, res: InferResult, outputs) -> bytes:
    """The bytes protobuf would write for InferResponse(outputs=[NamedTensor(name, TensorProto)],
    request_id, queue_ms, compute_ms, batch_size), with each output's payload copied once, straight
    from its array (protobuf's Python runtime would copy it three times: into bytes, into the
    message, into the serialized answer). Tests compare the bytes with protobuf's own."""
    parts = []
    for name, v in outputs:
        v = tensor_codec.as_array(v)
        n = v.nbytes
        head = tensor_pb2.TensorProto(dtype=tensor_codec.dtype_to_enum(v.dtype), shape=v.shape).SerializeToString()
        content = (b"\x1a" + _varint(n)) if n else b""
        tensor_len = len(head) + len(content) + n
        name_b = name.encode("utf-8")
        named = b"".join((b"\x0a", _varint(len(name_b)), name_b, b"\x12", _varint(tensor_len), head, content))
        parts += [b"\x0a", _varint(len(named) + n), named, recv_layout.payload(v)]
    parts.append(offload_pb2.InferResponse(request_id=request_id, queue_ms=res.queue_ms, compute_ms=res.compute_ms,
                                           batch_size=res.batch_size).SerializeToString())
    return b"".join(parts)


def request_trace(svc: OffloadService, part: str, res: InferResult, decoded: float, done: float,
                  bytes_in: int, bytes_out: int) -> RunMetadata:
    """One request's time in the service on a wall-clock timeline (origin: its arrival): decode,
    queue (checks and the wait for its batch), the batch run (with every node of the part when the
    batch ran traced), the hand-off back to the request's thread, encode."""
    now_wall, now = time.time(), time.monotonic()
    md = RunMetadata(origin_s=now_wall - (now - res.arrived))
    dev, me = svc.trace_device, threading.get_ident() % 100000

    def us(t: float) -> float:
        return (t - res.arrived) * 1e6
    rows = f"{res.batch_size} rows, {res.requests} requests"
    for name, op, t0, t1, thread, nbytes in (
            ("decode", "OffloadDecode", res.arrived, decoded, me, bytes_in),
            ("queue", "OffloadQueue", decoded, res.started, me, 0),
            (f"batch ({rows})", "OffloadBatch", res.started, res.ended, res.thread, 0),
            ("handoff", "OffloadHandoff", res.ended, res.woke, me, 0),
            ("encode", "OffloadEncode", res.woke, done, me, bytes_out)):
        md.events.append(NodeEvent(f"offload:{part}/{name}", op, dev, thread, us(t0), us(max(t1, t0)), nbytes))
    if res.trace is not None:
        md.merge(res.trace, device=dev)
        md.events.sort(key=lambda e: e.start_us)
    return md


def describe(service: OffloadService) -> offload_pb2.DescribeResponse:
    resp = offload_pb2.DescribeResponse(model=service.model.model, max_request_bytes=service.max_request_bytes,
                                        max_batch_size=service.max_batch_size,
                                        max_queue_delay_ms=service.max_queue_delay_s * 1e3,
                                        overhead_ms=(service.measured_overhead or {}).get("overhead_ms", 0.0))
    for p in service.model.parts.values():
        sig = resp.parts.add(name=p.name)
        for specs, dst in ((p.inputs, sig.inputs), (p.outputs, sig.outputs)):
            for s in specs:
                dst.add(name=s.name, dtype=tensor_codec.dtype_to_enum(s.dtype), shape=list(s.shape))
    return resp


def offload_handler(service: OffloadService) -> grpc.GenericRpcHandler:
    s = OffloadServicer(service)

    def unary(fn, req):
        return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req.FromString,
                                                   response_serializer=lambda m: m.SerializeToString())
    return grpc.method_handlers_generic_handler(SERVICE, {
        "Describe": unary(s.Describe, offload_pb2.DescribeRequest),
        "Infer": grpc.unary_unary_rpc_method_handler(s.Infer, request_deserializer=offload_pb2.InferRequest.FromString,
                                                     response_serializer=None),  # Infer answers bytes
        "Stats": unary(s.Stats, offload_pb2.StatsRequest),
    })


class OffloadServer:
    """An OffloadService on a gRPC port (0: a free one); `security`: wire/security.ServerSecurity."""

    def __init__(self, model: Union[CloudModel, str, os.PathLike], host: str = "127.0.0.1", port: int = 0,
                 security=None, max_workers: Optional[int] = None, insecure: bool = False, **limits):
        self.service = OffloadService(model, **limits)
        s = self.service
        # every queued or running request holds a thread; with one more for each refusal, no request
        # waits unseen inside gRPC (where the queue bound could not refuse it)
        workers = max_workers or s.max_queue + s.max_batch_size * len(s.runners) + 16
        try:
            self.server, self.port = start_grpc_server(
                [offload_handler(s)], host, port, workers, max_message_bytes=2 * s.max_request_bytes + (1 << 20),
                security=security, health_services=("", "isthmus.Offload"), insecure=insecure)
        except BaseException:
            s.close()
            raise
        self.host = safe_bind_host(host, security, insecure, quiet=True)   # what start_grpc_server bound
        self.security = security

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def measure_overhead(self, part: Optional[str] = None, requests: int = 50, rows: int = 1,
                         client_security=None, timeout_s: float = 10.0) -> dict:
        """What one request costs beyond its part's compute, measured: `requests` sequential Infer calls
        (after 5 unmeasured ones) of `rows` zero rows to `part` (default: the first) over this server's own
        port. Returns medians in ms: {"rtt_ms", "compute_ms", "overhead_ms": round trip less compute
        (gRPC both ways, decode, hand-offs, encode: what a cost model adds per cloud round trip on an idle
        server), "server_ms": the service's own share (Stats' overhead), "part", "rows", "requests"}. Best
        run while the server is idle; the client here shares this process (its gRPC costs count, as an
        edge client's would). A TLS or token server needs `client_security` (wire/security.ClientSecurity).
        The result is kept as `service.measured_overhead`; Describe answers its overhead_ms."""
        if self.security is not None and client_security is None:
            raise ValueError("measure_overhead: this server requires TLS or a token; pass client_security")
        if requests < 1 or rows < 1:
            raise ValueError(f"measure_overhead: requests ({requests}) and rows ({rows}) must be >= 1")
        svc = self.service
        p = svc.runner(part or next(iter(svc.runners))).part
        if not p.batchable and any(s.shape and s.shape[0] != -1 for s in p.inputs):
            rows = p.inputs[0].shape[0]
        req = offload_pb2.InferRequest(part=p.name, request_id="overhead")
        for spec in p.inputs:
            shape = [rows] + [1 if d < 0 else d for d in spec.shape[1:]] if spec.shape else []
            tensor_codec.encode(np.zeros(shape, spec.dtype), out=req.inputs.add(name=spec.name).tensor)
        data = req.SerializeToString()
        rtt, compute = [], []
        with make_channel(f"127.0.0.1:{self.port}", client_security) as ch:
            call = ch.unary_unary(f"/{SERVICE}/Infer", request_serializer=None,
                                  response_deserializer=offload_pb2.InferResponse.FromString)
            for i in range(5 + requests):
                t0 = time.perf_counter()
                resp = call(data, timeout=timeout_s)
                dt = (time.perf_counter() - t0) * 1e3
                if i >= 5:
                    rtt.append(dt)
                    compute.append(resp.compute_ms)
        med = lambda v: round(float(np.median(v)), 4)  # noqa: E731
        result = {"part": p.name, "rows": rows, "requests": requests, "rtt_ms": med(rtt),
                  "compute_ms": med(compute), "overhead_ms": med(np.array(rtt) - np.array(compute)),
                  "server_ms": round(svc.stats()["overhead_p50_ms"], 4)}
        svc.measured_overhead = result
        return result

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
                                                             "another host needs TLS and a token, or --insecure; "
                                                             "without them the service binds 127.0.0.1)")
    parser.add_argument("--insecure", action="store_true",
                        help="listen on --host even without TLS and a token (prints a warning)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu", "auto"],
                        help="where the cloud parts run (default cpu)")
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
    parser.add_argument("--malloc-mmap-threshold-kb", type=int, default=DEFAULT_MMAP_THRESHOLD_KB,
                        help="glibc: allocations from this size up are mapped and returned to the system when "
                             "freed (default 0: glibc's own, which rises with the largest buffer freed). 256 keeps "
                             "RSS flat under batching but costs CPU: every batch maps, faults in and unmaps its "
                             "buffers (measured: 1.7x server CPU per request on the MobileNet tail)")
    parser.add_argument("--malloc-trim-threshold-kb", type=int, default=0,
                        help="glibc: free memory at the top of a heap beyond this is returned to the system "
                             "(default 0: glibc's own; setting it also fixes the mmap threshold at glibc's 128 KiB "
                             "unless --malloc-mmap-threshold-kb says otherwise)")
    parser.add_argument("--warm-up", action="store_true",
                        help="before serving, run every part on zeros at batch sizes 1, 2, 4, .. --max-batch and "
                             "--max-batch twice more: the server takes its peak memory (its largest batch's "
                             "buffers) at start instead of growing to it under load")
    parser.add_argument("--measure-overhead", action="store_true",
                        help="before serving, time 50 loopback requests of zeros to the first part and report "
                             "the per-request overhead (round trip less compute) in the log and in Describe")
    parser.add_argument("--tls-cert", help="PEM certificate chain: serve TLS (default: $ISTHMUS_TLS_CERT)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert (default: $ISTHMUS_TLS_KEY)")
    parser.add_argument("--tls-client-ca", help="require client certificates signed by this CA "
                                                "(default: $ISTHMUS_TLS_CLIENT_CA)")
    parser.add_argument("--token-file", help="require this bearer token on every call (default: $ISTHMUS_TOKEN_FILE)")
    parser.add_argument("--client-token-file", help="also accept this token for Describe/Infer/Stats "
                                                    "(default: $ISTHMUS_CLIENT_TOKEN_FILE)")


def pin_malloc(param: int, nbytes: int) -> bool:
    """Fix glibc's mmap threshold (M_MMAP_THRESHOLD) or trim threshold (M_TRIM_THRESHOLD) at `nbytes`
    (mallopt); either stops both from adapting. By default glibc raises the threshold to the size of the largest mapped block freed
    (up to 32 MiB), after which a part's batch buffers (their size varies with the batch's rows) come
    from the heap and the heap grows with the mix of batch sizes seen (MobileNet tail, 64 clients:
    RSS +7..14% over 12,800 requests, plateauing; the heap's free space 30 -> 52 MiB). Mapped, each is
    returned when freed and RSS stays flat, but every batch then maps, faults in and unmaps its
    buffers: 1.7x server CPU per request there (benchmarks/offload_load.py --compare-malloc), so it is
    off by default. False where not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(param, int(nbytes)))
    except (OSError, AttributeError):
        return False


def run(args) -> int:
    apply_device_flag(getattr(args, "device", "cpu"), None, "isthmus serve")
    if args.malloc_mmap_threshold_kb:
        pin_malloc(M_MMAP_THRESHOLD, args.malloc_mmap_threshold_kb << 10)
    if args.malloc_trim_threshold_kb:
        pin_malloc(M_TRIM_THRESHOLD, args.malloc_trim_threshold_kb << 10)
    if args.blas_threads:
        try:
            # deferred: threadpoolctl is optional (its ImportError is handled)
            from threadpoolctl import threadpool_limits
        except ImportError:
            print("isthmus serve: --blas-threads needs threadpoolctl (pip install threadpoolctl); "
                  f"or set OPENBLAS_NUM_THREADS={args.blas_threads}", file=sys.stderr)
            return 2
        threadpool_limits(args.blas_threads, user_api="blas")
    try:
        security, client_security = security_from_args(args)
        server = OffloadServer(args.model, host=args.host, port=args.port, security=security,
                               insecure=getattr(args, "insecure", False),
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
    if args.warm_up:
        t0 = time.monotonic()
        runs = server.service.warm_up()
        print(f"isthmus serve: warmed up with {runs} batches in {time.monotonic() - t0:.2f} s", file=sys.stderr)
    if args.measure_overhead:
        try:
            m = server.measure_overhead(client_security=client_security if security else None)
            print(f"isthmus serve: per-request overhead {m['overhead_ms']:.3f} ms (round trip {m['rtt_ms']:.3f} ms "
                  f"less compute {m['compute_ms']:.3f} ms; median of {m['requests']} requests of {m['rows']} "
                  f"zero row(s) to part '{m['part']}')", file=sys.stderr)
        except Exception as e:  # noqa: BLE001  (a failed measurement must not stop the service)
            print(f"isthmus serve: could not measure the overhead: {type(e).__name__}: {e}", file=sys.stderr)
    print(f"isthmus serve: listening on {server.address} ({mode}); Ctrl-C stops", file=sys.stderr)
    print(f"ISTHMUS_OFFLOAD {server.address}", flush=True)
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
