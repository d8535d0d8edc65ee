"""gRPC over the Worker (proto/worker.proto): a thin servicer and a client.

The servicer decodes, calls the in-process Worker, encodes. RecvTensor answers with the
bytes the Send laid out (cloud/recv_layout.py): one message when the tensor is small; a bigger
one answers `streamed` and its chunks follow on RecvTensorStream (a client that saw a key
stream asks for the stream at once the next time). A caller on the same host offers its
host identity and may be answered with a shared-memory segment's name instead of the
bytes (cloud/shm.py); one it cannot read it reports, and gets the bytes. Every client RPC carries
a deadline; message sizes are explicit on both ends. A malformed request gets
INVALID_ARGUMENT with a clear message and the server keeps serving; a failure reaches the
client as the same error class (cloud/errors.py), naming the task.
"""
from __future__ import annotations

import struct
import threading
from typing import Any, Dict, Mapping, Optional, Sequence

import grpc
import numpy as np

from ..core.rendezvous import RendezvousAborted
from ..core.trace import RunMetadata
from ..proto import worker_pb2
from ..wire import tensor_codec
from ..wire.security import ClientSecurity, make_channel
from . import graph_codec, recv_layout, shm, tracing
from .errors import TaskUnavailable, WorkerError, abort_with, from_rpc_error
from .limits import DEFAULT_MAX_WAIT_S, MAX_STEP_TIMEOUT_S, WaitLimits, caller_identity
from .rendezvous import show
from .worker import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_RPC_TIMEOUT_S, Worker

SERVICE = "isthmus.Worker"
_RECV_SLACK_S = 2.0   # a RecvTensor call's deadline over the wait it asks the task for
_STREAMED_KEPT = 4096             # keys remembered as streamed (then forgotten all at once)
_DOUBLE_5 = struct.Struct("<Bd")   # field 5 (timeout_s), a double: its key byte and value
_UNARY_BELOW_BYTES = 64 << 10     # a key remembered as streamed whose value came back smaller: unary again
_SHM_FAILURES_KEPT = 3            # segments a client could not read before it stops offering shared memory


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
    # a restarted peer is found again within about a second (gRPC's default reconnect backoff grows
    # from 1 s to 120 s, which slows recovery after a task comes back)
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000)]


def _identity(b):
    return b


class WorkerServicer:
    """`limits`: the server-side cap on a RecvTensor's wait and the bounds on waiting calls
    (cloud/limits.py); RunGraph's wait is capped at MAX_STEP_TIMEOUT_S."""

    def __init__(self, worker: Worker, limits: Optional[WaitLimits] = None):
        self.worker = worker
        self.limits = limits or WaitLimits(max(DEFAULT_MAX_WAIT_S, worker.recv_timeout))

    def RegisterGraph(self, request, context):
        try:
            h = self.worker.register_graph(request.graph, request.device or None)
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, self.worker.task)
        return worker_pb2.RegisterGraphResponse(handle=h)

    def RunGraph(self, request, context):
        w = self.worker
        try:
            feeds = {t.name: tensor_codec.decode(t.tensor, w.max_tensor_bytes) for t in request.feeds}
            md = RunMetadata() if request.trace else None
            outs = w.run_graph(request.handle, request.step_id, feeds, list(request.fetches),
                               min(request.timeout_s or w.recv_timeout, MAX_STEP_TIMEOUT_S), run_metadata=md)
            resp = worker_pb2.RunGraphResponse()
            if md is not None:
                tracing.encode(md, out=resp.trace)
            for name, v in zip(request.fetches, outs):
                if v is not None:
                    tensor_codec.encode(v, out=resp.outputs.add(name=name).tensor, max_bytes=w.max_tensor_bytes)
        except Exception as e:  # noqa: BLE001  (the failing op, named by the executor)
            abort_with(context, e, w.task)
        return resp

    def RecvTensor(self, request, context) -> bytes:
        try:
            t = self.limits.cap(request.timeout_s, self.worker.recv_timeout)
            with self.limits.waiting(caller_identity(context), "RecvTensor"):
                if request.shm_host or request.shm_failed:
                    wt = self.worker.recv_shared(request.src_device, request.dst_device, request.tensor,
                                                 request.step_id, t, request.shm_host, request.shm_failed)
                    if isinstance(wt, shm.Segment):
                        return recv_layout.shm_response(wt)
                else:
                    if self.worker.shm is not None:  # a caller that stopped offering: lay its values out for gRPC
                        self.worker.shm.peers.discard(request.dst_device)
                    wt = self.worker.recv_wire(request.src_device, request.dst_device, request.tensor,
                                               request.step_id, t)
            if wt.inline is not None:
                return wt.inline
            self.worker.put_back(request.src_device, request.dst_device, request.tensor, request.step_id, wt)
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, self.worker.task)
        return wt.header

    def RecvTensorStream(self, request, context):
        try:
            with self.limits.waiting(caller_identity(context), "RecvTensorStream"):
                wt = self.worker.recv_wire(request.src_device, request.dst_device, request.tensor,
                                           request.step_id, self.limits.cap(request.timeout_s, self.worker.recv_timeout))
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, self.worker.task)
        yield from wt.chunk_messages()

    def AbortStep(self, request, context):
        self.worker.abort_step(request.step_id, RendezvousAborted(request.reason or "aborted by the master"))
        return worker_pb2.AbortStepResponse()

    def DeregisterGraph(self, request, context):
        try:
            self.worker.deregister_graph(request.handle)
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, self.worker.task)
        return worker_pb2.DeregisterGraphResponse()

    def GetStatus(self, request, context):
        s = self.worker.status()
        return worker_pb2.StatusResponse(task=s["task"], devices=s["devices"], handles=s["handles"],
                                         steps_run=s["steps_run"], pending_tensors=s["pending_tensors"],
                                         shm_lent=s["shm_lent"])


def worker_handler(worker: Worker, limits: Optional[WaitLimits] = None) -> grpc.GenericRpcHandler:
    """The Worker service's handler; the tensor answers go out as the bytes laid out for them."""
    s = WorkerServicer(worker, limits)
    req = {name: getattr(worker_pb2, name + "Request").FromString for name in (
        "RegisterGraph", "RunGraph", "RecvTensor", "AbortStep", "DeregisterGraph", "Status")}

    def unary(fn, req_de, out=lambda m: m.SerializeToString()):
        return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req_de, response_serializer=out)
    return grpc.method_handlers_generic_handler(SERVICE, {
        "RegisterGraph": unary(s.RegisterGraph, req["RegisterGraph"]),
        "RunGraph": unary(s.RunGraph, req["RunGraph"]),
        "RecvTensor": unary(s.RecvTensor, req["RecvTensor"], _identity),
        "RecvTensorStream": grpc.unary_stream_rpc_method_handler(
            s.RecvTensorStream, request_deserializer=req["RecvTensor"], response_serializer=_identity),
        "AbortStep": unary(s.AbortStep, req["AbortStep"]),
        "DeregisterGraph": unary(s.DeregisterGraph, req["DeregisterGraph"]),
        "GetStatus": unary(s.GetStatus, req["Status"]),
    })


class WorkerClient:
    """Calls one worker task; the same methods as Worker, each RPC with a deadline."""

    def __init__(self, address: str, timeout: float = DEFAULT_RPC_TIMEOUT_S,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 max_tensor_bytes: int = tensor_codec.DEFAULT_MAX_BYTES, name: Optional[str] = None,
                 channel: Optional[grpc.Channel] = None, security: Optional[ClientSecurity] = None,
                 shm_enabled: Optional[bool] = None):
        """`shm_enabled`: offer this host's identity on RecvTensor, so that a task on the same host
        may answer with a shared-memory segment (None: $ISTHMUS_SHM, on unless 0)."""
        self.address = address
        self.name = name or address
        self.timeout = timeout
        self.max_tensor_bytes = max_tensor_bytes
        self._own_channel = channel is None
        self.channel = channel or make_channel(address, security, channel_options(max_message_bytes))
        ch = self.channel

        def unary(name, resp):
            return ch.unary_unary(f"/{SERVICE}/{name}", request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=resp)
        self._rpc = {
            "RegisterGraph": unary("RegisterGraph", worker_pb2.RegisterGraphResponse.FromString),
            "RunGraph": unary("RunGraph", worker_pb2.RunGraphResponse.FromString),
            "AbortStep": unary("AbortStep", worker_pb2.AbortStepResponse.FromString),
            "DeregisterGraph": unary("DeregisterGraph", worker_pb2.DeregisterGraphResponse.FromString),
            "GetStatus": unary("GetStatus", worker_pb2.StatusResponse.FromString),
        }
        # RecvTensor requests go out as bytes laid out here (recv_request), answers come back as bytes
        self._recv = ch.unary_unary(f"/{SERVICE}/RecvTensor", request_serializer=None, response_deserializer=None)
        self._streamed: Dict[tuple, bool] = {}   # (src, dst, tensor) keys whose last value streamed
        self._heads: Dict[tuple, bytes] = {}     # (src, dst, tensor) -> its requests' first bytes
        on = shm.enabled_by_env() if shm_enabled is None else bool(shm_enabled)
        self.shm_host = shm.host_identity() if on else ""   # offered on every RecvTensor ("" : none)
        self.shm_failures = 0                               # segments named to us that we could not read
        self.shm_reads = 0                                  # tensors received through shared memory
        self._recv_stream = ch.unary_stream(f"/{SERVICE}/RecvTensorStream", request_serializer=None,
                                            response_deserializer=recv_layout.read_chunk)

    def _error(self, rpc: str, e: grpc.RpcError) -> BaseException:
        return from_rpc_error(e, rpc, self.name, self.address)

    def _call(self, rpc: str, request, timeout: Optional[float] = None):
        try:
            return self._rpc[rpc](request, timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            raise self._error(rpc, e) from None

    def register_graph(self, graph, device: Optional[str] = None) -> str:
        gd = graph if not hasattr(graph, "nodes") else graph_codec.encode(graph)
        if isinstance(gd, (bytes, bytearray)):
            gd = graph_codec.graph_pb2.GraphDef.FromString(bytes(gd))
        return self._call("RegisterGraph", worker_pb2.RegisterGraphRequest(graph=gd, device=device or "")).handle

    def run_graph(self, handle: str, step_id: int, feeds: Optional[Mapping[str, Any]] = None,
                  fetches: Sequence[str] = (), timeout: Optional[float] = None,
                  run_metadata: Optional[RunMetadata] = None):
        return self.run_graph_future(handle, step_id, feeds, fetches, timeout, run_metadata).result()

    def run_graph_future(self, handle: str, step_id: int, feeds: Optional[Mapping[str, Any]] = None,
                         fetches: Sequence[str] = (), timeout: Optional[float] = None,
                         run_metadata: Optional[RunMetadata] = None) -> "_Pending":
        """Start a step of a part without waiting: `.result()` gives its outputs (or raises).
        With `run_metadata` the step is traced and `.result()` adds the task's events to it."""
        req = worker_pb2.RunGraphRequest(handle=handle, step_id=step_id, fetches=list(fetches),
                                         timeout_s=timeout or 0.0, trace=run_metadata is not None)
        for k, v in (feeds or {}).items():
            tensor_codec.encode(v, out=req.feeds.add(name=k).tensor, max_bytes=self.max_tensor_bytes)
        deadline = (timeout + _RECV_SLACK_S) if timeout else self.timeout
        fut = self._rpc["RunGraph"].future(req, timeout=deadline)
        return _Pending(self, fut, list(fetches), run_metadata)

    def recv_tensor(self, src_device: str, dst_device: str, tensor: str, step_id: int,
                    timeout: Optional[float] = None) -> np.ndarray:
        """The value a Send on that task deposited for (src, dst, tensor, step).

        A key whose last value streamed (steps send the same tensors again and again) asks
        for the stream at once: one call, not the unary answer `streamed` and then the
        stream. Any choice is answered correctly whatever the value is this time."""
        return self.recv_tensor_future(src_device, dst_device, tensor, step_id, timeout, _blocking=True).result()

    def recv_tensor_future(self, src_device: str, dst_device: str, tensor: str, step_id: int,
                           timeout: Optional[float] = None, _blocking: bool = False) -> "_PendingRecv":
        """Start a RecvTensor without waiting: `.result()` gives the array (or raises as
        recv_tensor would); `.cancel()` gives it up. A part's Recvs start this way together
        when its step starts (cloud/worker.py), so their round trips overlap."""
        t = timeout or self.timeout
        key = (src_device, dst_device, tensor)
        req = self.recv_request(key, step_id, t)
        try:
            if key in self._streamed:
                kind, call = "stream", self._recv_stream(req, timeout=t + _RECV_SLACK_S)
            elif _blocking:
                kind, call = "blocking", None
            else:
                kind, call = "unary", self._recv.future(req, timeout=t + _RECV_SLACK_S)
        except grpc.RpcError as e:
            raise self._error("RecvTensor", e) from None
        return _PendingRecv(self, req, key, kind, call, t, step_id)

    def recv_request(self, key: tuple, step_id: int, timeout_s: float) -> bytes:
        """A RecvTensorRequest's bytes (what protobuf writes for it): the key's fields are laid
        out once, the step id and timeout appended per call."""
        head = self._heads.get(key)
        if head is None:
            if len(self._heads) >= _STREAMED_KEPT:
                self._heads.clear()
            head = self._heads[key] = worker_pb2.RecvTensorRequest(
                src_device=key[0], dst_device=key[1], tensor=key[2]).SerializeToString()
        step = int(step_id)
        tail = b"\x20" + recv_layout.varint(step & 0xFFFFFFFFFFFFFFFF) if step else b""
        out = head + tail + (_DOUBLE_5.pack(0x29, timeout_s) if timeout_s else b"")
        if self.shm_host:  # field 6, shm_host (protobuf writes fields in number order: after 5)
            h = self.shm_host.encode("ascii")
            out += b"\x32" + recv_layout.varint(len(h)) + h
        return out

    def _finish_recv(self, req: bytes, key, kind: str, call, t: float, step_id: int) -> np.ndarray:
        try:
            if kind == "stream":
                arr = recv_layout.chunks_array(call, self.max_tensor_bytes)
                if arr.nbytes < _UNARY_BELOW_BYTES:  # small now: a unary call next time
                    self._streamed.pop(key, None)
                return arr
            data = call.result() if kind == "unary" else self._recv(req, timeout=t + _RECV_SLACK_S)
            dtype, shape, content, streamed = recv_layout.read_response(data)
            if not streamed and len(content) == 0:   # no bytes: maybe a segment's name instead
                named = recv_layout.read_shm(data)
                if named is not None:
                    return self._read_shared(named, dtype, shape, key, step_id, t)
            d, shp, nbytes = tensor_codec.check_header(dtype, shape, self.max_tensor_bytes)
            if not streamed:
                return tensor_codec.from_bytes(content, d, shp, nbytes)
            if len(self._streamed) >= _STREAMED_KEPT:
                self._streamed.clear()
            self._streamed[key] = True
            again = self.recv_request(key, step_id, 1.0)  # the value is there already
            return recv_layout.chunks_array(self._recv_stream(again, timeout=t + _RECV_SLACK_S), self.max_tensor_bytes,
                                     expect=(dtype, shape))
        except grpc.RpcError as e:
            raise self._error("RecvTensor", e) from None

    def _read_shared(self, named, dtype: int, shape, key, step_id: int, t: float) -> np.ndarray:
        """The tensor an answer placed in a shared-memory segment; one this process cannot open
        is reported to the sender, which answers with its bytes (and after a few such
        failures this client stops offering shared memory)."""
        name, size = named
        what = f"RecvTensor of {show((key[0], key[1], key[2], step_id))} (answered by {self.name})"
        try:
            arr = shm.read_segment(name, size, dtype, shape, self.max_tensor_bytes, what)
            self.shm_reads += 1
            return arr
        except shm.ShmUnavailable:
            self.shm_failures += 1
            if self.shm_failures >= _SHM_FAILURES_KEPT:
                self.shm_host = ""
        req = self.recv_request(key, step_id, t)
        req += b"\x3a" + recv_layout.varint(len(name)) + name.encode("ascii")   # field 7, shm_failed
        data = self._recv(req, timeout=t + _RECV_SLACK_S)
        dtype, shape, content, streamed = recv_layout.read_response(data)
        d, shp, nbytes = tensor_codec.check_header(dtype, shape, self.max_tensor_bytes)
        if not streamed:
            return tensor_codec.from_bytes(content, d, shp, nbytes)
        again = self.recv_request(key, step_id, 1.0)
        return recv_layout.chunks_array(self._recv_stream(again, timeout=t + _RECV_SLACK_S), self.max_tensor_bytes,
                                 expect=(dtype, shape))

    def abort_step(self, step_id: int, error: BaseException, timeout: Optional[float] = None) -> None:
        self._call("AbortStep", worker_pb2.AbortStepRequest(step_id=step_id, reason=f"{type(error).__name__}: {error}"),
                   timeout)

    def deregister_graph(self, handle: str) -> None:
        self._call("DeregisterGraph", worker_pb2.DeregisterGraphRequest(handle=handle))

    def status(self, timeout: Optional[float] = None):
        r = self._call("GetStatus", worker_pb2.StatusRequest(), timeout)
        return {"task": r.task, "devices": list(r.devices), "handles": list(r.handles),
                "steps_run": r.steps_run, "pending_tensors": r.pending_tensors, "shm_lent": r.shm_lent}

    def close(self) -> None:
        if self._own_channel:
            self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _PendingRecv:
    """A RecvTensor in flight (or, for a blocking call, about to be made)."""
    __slots__ = ("client", "req", "key", "kind", "call", "t", "step_id")

    def __init__(self, client: WorkerClient, req: bytes, key, kind: str, call, t: float, step_id: int):
        self.client, self.req, self.key, self.kind, self.call, self.t = client, req, key, kind, call, t
        self.step_id = step_id

    def result(self) -> np.ndarray:
        return self.client._finish_recv(self.req, self.key, self.kind, self.call, self.t, self.step_id)

    def cancel(self) -> None:
        if self.call is not None:
            self.call.cancel()


class _Pending:
    """A RunGraph in flight."""

    def __init__(self, client: WorkerClient, fut, fetches, run_metadata: Optional[RunMetadata] = None):
        self.client, self.fut, self.fetches = client, fut, fetches
        self.run_metadata = run_metadata
        self._done: Optional[tuple] = None   # (outputs, error) once read
        self._lock = threading.Lock()

    def add_done_callback(self, fn) -> None:
        self.fut.add_done_callback(lambda _f: fn(self))

    def result(self):
        """The outputs (decoded once, however often asked), or the error."""
        with self._lock:
            if self._done is None:
                try:
                    self._done = (self._read(), None)
                except BaseException as e:  # noqa: BLE001
                    self._done = (None, e)
        if self._done[1] is not None:
            raise self._done[1]
        return self._done[0]

    def _read(self):
        try:
            resp = self.fut.result()
        except grpc.RpcError as e:
            raise self.client._error("RunGraph", e) from None
        got = {t.name: tensor_codec.decode(t.tensor, self.client.max_tensor_bytes) for t in resp.outputs}
        if self.run_metadata is not None:
            if not resp.HasField("trace"):
                raise WorkerError(f"{self.client.name}: RunGraph was asked for a trace and returned none")
            try:
                self.run_metadata.merge(tracing.decode(resp.trace, self.client.name))
            except tracing.TraceDecodeError as e:
                raise WorkerError(f"RunGraph on {self.client.name}: malformed trace: {e}") from None
        return [got.get(f) for f in self.fetches]


__all__ = ["WorkerServicer", "WorkerClient", "worker_handler", "serve", "channel_options", "WorkerError",
           "TaskUnavailable"]
