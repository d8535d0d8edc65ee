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
its batch runs is dropped -> DEADLINE_EXCEEDED; a request its caller cancels is dropped too
(CANCELLED) and never runs. A failing batch answers INTERNAL, naming the node, to each of its
requests. Counters and recent latencies answer Stats and, every log_every_s seconds, a log line.

Deployment: on few cores shared with other work, give BLAS one thread (--blas-threads 1, or
OPENBLAS_NUM_THREADS=1): multithreaded BLAS spin-waits against the gRPC threads (measured here:
the benchmark's three 1024-wide dense layers at batch 1 took 43 ms under load with default threads,
0.34 ms with one).
Bind 0.0.0.0 only with TLS and a token (docs/security.md).

The parts run on this machine's CPU through numpy: the core executor has no GPU path yet
(core/gpu.py, issue #9), so a cloud GPU is not used by this service today.

`OffloadService` is the in-process object (tested without a network); `offload_handler` is the
thin gRPC adapter; `OffloadServer` starts both on a port (TLS and a bearer token through
proto/security.py's ServerSecurity).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Optional, Sequence, Union

import grpc

from ..core.errors import IsthmusError
from ..proto import offload_pb2
from . import tensor_codec
from .offload_batching import (DEFAULT_MAX_BATCH, DEFAULT_MAX_DELAY_MS, DEFAULT_MAX_QUEUE,  # noqa: F401
                               DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_WAIT_S, Cancelled, DeadlineExceeded,
                               InferResult, InvalidRequest, OffloadError, OffloadService, Overloaded,
                               ServiceStopped)
from .offload_model import (CloudModel, CloudPart, CloudPartsError, TensorSpec, cloud_part,  # noqa: F401
                            cloud_part_from_partition, cloud_parts_from_plans, load_cloud_parts, save_cloud_parts)

SERVICE = "isthmus.Offload"


# ---- gRPC ----------------------------------------------------------------------------------------
class OffloadServicer:
    """Decode, call the OffloadService, encode."""

    def __init__(self, service: OffloadService):
        self.service = service

    def Describe(self, request, context):
        return describe(self.service)

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
        except Exception as e:  # noqa: BLE001  (a bug here must not leave the caller without a status)
            svc.refused(OffloadError(str(e)))
            context.abort(grpc.StatusCode.INTERNAL, f"offload: {type(e).__name__}: {e}")
        return resp

    def Stats(self, request, context):
        return offload_pb2.StatsResponse(**{k: v for k, v in self.service.stats().items()
                                            if k in offload_pb2.StatsResponse.DESCRIPTOR.fields_by_name})


def describe(service: OffloadService) -> offload_pb2.DescribeResponse:
    resp = offload_pb2.DescribeResponse(model=service.model.model, max_request_bytes=service.max_request_bytes,
                                        max_batch_size=service.max_batch_size,
                                        max_queue_delay_ms=service.max_queue_delay_s * 1e3)
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
                security=security, health_services=("", "isthmus.Offload"))
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
