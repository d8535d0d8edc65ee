"""gRPC over the Worker (proto/worker.proto): a thin servicer, a server helper and a client.

Every client RPC carries a deadline; message sizes are explicit on both ends; tensors
fetched with RecvTensor stream in chunks (one message when small). A malformed request
gets INVALID_ARGUMENT with a clear message and the server keeps serving. Errors reach the
client as WorkerError naming the task's address and the RPC.
"""
from __future__ import annotations

from concurrent import futures
from typing import Any, Mapping, Optional, Sequence, Tuple

import grpc
import numpy as np

from ..core.errors import IsthmusError
from ..core.rendezvous import RendezvousAborted, RendezvousTimeout
from ..proto import worker_pb2, worker_pb2_grpc
from . import graph_codec, tensor_codec
from .worker import (DEFAULT_CHUNK_BYTES, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_RPC_TIMEOUT_S, Worker,
                     WorkerError)


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)]


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, worker: Worker, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        self.worker = worker
        self.chunk_bytes = chunk_bytes

    def _fail(self, context, code, e: BaseException):
        context.abort(code, f"{self.worker.task}: {type(e).__name__}: {e}")

    def RegisterGraph(self, request, context):
        try:
            h = self.worker.register_graph(request.graph, request.device or None)
        except WorkerError as e:
            self._fail(context, grpc.StatusCode.INVALID_ARGUMENT, e)
        return worker_pb2.RegisterGraphResponse(handle=h)

    def RunGraph(self, request, context):
        try:
            feeds = {t.name: tensor_codec.decode(t.tensor, self.worker.max_tensor_bytes) for t in request.feeds}
        except tensor_codec.TensorCodecError as e:
            self._fail(context, grpc.StatusCode.INVALID_ARGUMENT, e)
        try:
            outs = self.worker.run_graph(request.handle, request.step_id, feeds, list(request.fetches),
                                         request.timeout_s or None)
        except WorkerError as e:
            self._fail(context, grpc.StatusCode.NOT_FOUND if "no registered graph" in str(e)
                       else grpc.StatusCode.INVALID_ARGUMENT, e)
        except RendezvousTimeout as e:
            self._fail(context, grpc.StatusCode.DEADLINE_EXCEEDED, e)
        except RendezvousAborted as e:
            self._fail(context, grpc.StatusCode.ABORTED, e)
        except Exception as e:  # noqa: BLE001  (the failing op, named by the executor)
            self._fail(context, grpc.StatusCode.INTERNAL, e)
        resp = worker_pb2.RunGraphResponse()
        for name, v in zip(request.fetches, outs):
            if v is not None:
                nt = resp.outputs.add(name=name)
                tensor_codec.encode(v, out=nt.tensor, max_bytes=self.worker.max_tensor_bytes)
        return resp

    def RecvTensor(self, request, context):
        try:
            v = self.worker.recv_tensor(request.src_device, request.dst_device, request.tensor,
                                        request.step_id, request.timeout_s or None)
        except RendezvousTimeout as e:
            self._fail(context, grpc.StatusCode.DEADLINE_EXCEEDED, e)
        except RendezvousAborted as e:
            self._fail(context, grpc.StatusCode.ABORTED, e)
        try:
            yield from tensor_codec.encode_chunks(v, self.chunk_bytes, self.worker.max_tensor_bytes)
        except tensor_codec.TensorCodecError as e:
            self._fail(context, grpc.StatusCode.FAILED_PRECONDITION, e)

    def DeregisterGraph(self, request, context):
        try:
            self.worker.deregister_graph(request.handle)
        except WorkerError as e:
            self._fail(context, grpc.StatusCode.NOT_FOUND, e)
        return worker_pb2.DeregisterGraphResponse()

    def GetStatus(self, request, context):
        s = self.worker.status()
        return worker_pb2.StatusResponse(task=s["task"], devices=s["devices"], handles=s["handles"],
                                         steps_run=s["steps_run"], pending_tensors=s["pending_tensors"])


def serve(worker: Worker, host: str = "127.0.0.1", port: int = 0, max_workers: int = 16,
          max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
          extra_handlers: Sequence = ()) -> Tuple[grpc.Server, int]:
    """Start a gRPC server for `worker` (port 0: a free port); returns (server, port).

    The standard gRPC health service answers too when grpcio-health-checking is installed.
    """
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                         options=channel_options(max_message_bytes))
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(worker, chunk_bytes), server)
    try:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
        hs = health.HealthServicer()
        hs.set("", health_pb2.HealthCheckResponse.SERVING)
        hs.set("isthmus.Worker", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    except ImportError:
        pass
    if extra_handlers:
        server.add_generic_rpc_handlers(tuple(extra_handlers))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise WorkerError(f"cannot listen on {host}:{port}")
    server.start()
    return server, bound


class WorkerClient:
    """Calls one worker task; the same methods as Worker, each RPC with a deadline."""

    def __init__(self, address: str, timeout: float = DEFAULT_RPC_TIMEOUT_S,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 max_tensor_bytes: int = tensor_codec.DEFAULT_MAX_BYTES, name: Optional[str] = None):
        self.address = address
        self.name = name or address
        self.timeout = timeout
        self.max_tensor_bytes = max_tensor_bytes
        self.channel = grpc.insecure_channel(address, options=channel_options(max_message_bytes))
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)

    def _error(self, rpc: str, e: grpc.RpcError) -> WorkerError:
        code = e.code() if hasattr(e, "code") else None
        if code == grpc.StatusCode.UNAVAILABLE:
            return WorkerError(f"task {self.name} at {self.address} is unreachable ({rpc}): {e.details()}")
        return WorkerError(f"{rpc} on task {self.name} at {self.address} failed "
                           f"[{code.name if code else '?'}]: {e.details() if hasattr(e, 'details') else e}")

    def _call(self, rpc: str, request, timeout: Optional[float] = None):
        try:
            return getattr(self.stub, rpc)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            raise self._error(rpc, e) from None

    def register_graph(self, graph, device: Optional[str] = None) -> str:
        gd = graph if not hasattr(graph, "nodes") else graph_codec.encode(graph)
        if isinstance(gd, (bytes, bytearray)):
            gd = graph_codec.graph_pb2.GraphDef.FromString(bytes(gd))
        return self._call("RegisterGraph", worker_pb2.RegisterGraphRequest(graph=gd, device=device or "")).handle

    def run_graph(self, handle: str, step_id: int, feeds: Optional[Mapping[str, Any]] = None,
                  fetches: Sequence[str] = (), timeout: Optional[float] = None):
        req = worker_pb2.RunGraphRequest(handle=handle, step_id=step_id, fetches=list(fetches),
                                         timeout_s=timeout or 0.0)
        for k, v in (feeds or {}).items():
            tensor_codec.encode(v, out=req.feeds.add(name=k).tensor, max_bytes=self.max_tensor_bytes)
        resp = self._call("RunGraph", req, (timeout or self.timeout) + 1.0 if timeout else None)
        got = {t.name: tensor_codec.decode(t.tensor, self.max_tensor_bytes) for t in resp.outputs}
        return [got.get(f) for f in fetches]

    def recv_tensor(self, src_device: str, dst_device: str, tensor: str, step_id: int,
                    timeout: Optional[float] = None) -> np.ndarray:
        t = timeout or self.timeout
        req = worker_pb2.RecvTensorRequest(src_device=src_device, dst_device=dst_device, tensor=tensor,
                                           step_id=step_id, timeout_s=t)
        try:
            return tensor_codec.decode_chunks(self.stub.RecvTensor(req, timeout=t + 1.0), self.max_tensor_bytes)
        except grpc.RpcError as e:
            raise self._error("RecvTensor", e) from None

    def deregister_graph(self, handle: str) -> None:
        self._call("DeregisterGraph", worker_pb2.DeregisterGraphRequest(handle=handle))

    def status(self):
        r = self._call("GetStatus", worker_pb2.StatusRequest())
        return {"task": r.task, "devices": list(r.devices), "handles": list(r.handles),
                "steps_run": r.steps_run, "pending_tensors": r.pending_tensors}

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
