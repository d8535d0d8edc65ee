"""gRPC over the Master (proto/master.proto): a thin servicer and a client with deadlines."""
from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

import grpc

from ..core.trace import RunMetadata
from ..proto import master_pb2, master_pb2_grpc
from ..wire import tensor_codec
from ..wire.security import CLUSTER, ClientSecurity, caller_role, make_channel
from . import graph_codec, tracing
from .errors import WorkerError, abort_with, from_rpc_error
from .master import Master
from .rpc import channel_options
from .worker import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_RPC_TIMEOUT_S

_STEP_SLACK_S = 5.0  # a RunStep's deadline over the step timeout it asks for


def _writes() -> bool:
    """May this call's graphs write state? (the cluster token, or a server without tokens)"""
    return caller_role() == CLUSTER


class MasterServicer:
    def __init__(self, master: Master, name: str = "master"):
        self.master = master
        self.name = name

    def CreateSession(self, request, context):
        try:
            h = self.master.create_session(request.graph, writes=_writes())
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, self.name)
        return master_pb2.CreateSessionResponse(session_handle=h, graph_version=1)

    def ExtendSession(self, request, context):
        try:
            v = self.master.extend_session(request.session_handle, request.graph, request.current_graph_version,
                                            writes=_writes())
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, self.name)
        return master_pb2.ExtendSessionResponse(new_graph_version=v)

    def RunStep(self, request, context):
        try:
            feeds = {t.name: tensor_codec.decode(t.tensor) for t in request.feeds}
            md = RunMetadata() if request.trace else None
            outs, step_id = self.master.run_step(request.session_handle, feeds, list(request.fetches),
                                                 list(request.targets), request.timeout_s or None, run_metadata=md,
                                                 writes=_writes())
            resp = master_pb2.RunStepResponse(step_id=step_id)
            if md is not None:
                tracing.encode(md, out=resp.trace)
            for name, v in zip(request.fetches, outs):
                tensor_codec.encode(v, out=resp.outputs.add(name=name).tensor)
        except Exception as e:  # noqa: BLE001  (the original error, naming its node and task)
            abort_with(context, e, self.name)
        return resp

    def CloseSession(self, request, context):
        try:
            self.master.close_session(request.session_handle, writes=_writes())
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, self.name)
        return master_pb2.CloseSessionResponse()

    def ListDevices(self, request, context):
        try:
            devs = self.master.list_devices()
        except Exception as e:  # noqa: BLE001
            abort_with(context, e, self.name)
        return master_pb2.ListDevicesResponse(devices=[master_pb2.DeviceAttributes(**d) for d in devs])


def master_handler(master: Master, name: str = "master") -> grpc.GenericRpcHandler:
    s = MasterServicer(master, name)

    def unary(rpc: str):
        return grpc.unary_unary_rpc_method_handler(
            getattr(s, rpc), request_deserializer=getattr(master_pb2, rpc + "Request").FromString,
            response_serializer=lambda m: m.SerializeToString())
    return grpc.method_handlers_generic_handler("isthmus.Master", {r: unary(r) for r in (
        "CreateSession", "ExtendSession", "RunStep", "CloseSession", "ListDevices")})


class MasterClient:
    """Calls a master task; the same methods as Master, each RPC with a deadline."""

    def __init__(self, address: str, timeout: float = DEFAULT_RPC_TIMEOUT_S,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, security: Optional[ClientSecurity] = None):
        """`security`: TLS / bearer token (wire/security.py); None: from the environment
        ($ISTHMUS_TLS_CA, $ISTHMUS_TOKEN_FILE, ...), plaintext when it sets nothing."""
        self.address = address.split("://", 1)[1] if "://" in address else address
        self.timeout = timeout
        security = ClientSecurity.from_env() if security is None else security
        self.channel = make_channel(self.address, security, channel_options(max_message_bytes))
        self.stub = master_pb2_grpc.MasterStub(self.channel)

    def _call(self, rpc: str, request, timeout: Optional[float] = None):
        try:
            return getattr(self.stub, rpc)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, rpc, "master", self.address) from None

    def create_session(self, graph) -> str:
        gd = graph_codec.encode(graph) if hasattr(graph, "nodes") else graph
        return self._call("CreateSession", master_pb2.CreateSessionRequest(graph=gd)).session_handle

    def extend_session(self, handle: str, graph, current_version: int = 0) -> int:
        gd = graph_codec.encode(graph) if hasattr(graph, "nodes") else graph
        return self._call("ExtendSession", master_pb2.ExtendSessionRequest(
            session_handle=handle, graph=gd, current_graph_version=current_version)).new_graph_version

    def run_step(self, handle: str, feeds: Mapping[str, Any], fetches: Sequence[str],
                 targets: Sequence[str] = (), timeout: Optional[float] = None,
                 run_metadata: Optional[RunMetadata] = None) -> Tuple[List[Any], int]:
        """With `run_metadata` the step is traced: every task's events are added to it."""
        req = master_pb2.RunStepRequest(session_handle=handle, fetches=list(fetches), targets=list(targets),
                                        timeout_s=timeout or 0.0, trace=run_metadata is not None)
        for k, v in feeds.items():
            tensor_codec.encode(v, out=req.feeds.add(name=k).tensor)
        deadline = (timeout or self.timeout) + _STEP_SLACK_S
        resp = self._call("RunStep", req, deadline)
        got = {t.name: tensor_codec.decode(t.tensor) for t in resp.outputs}
        if run_metadata is not None:
            if not resp.HasField("trace"):
                raise WorkerError(f"master {self.address}: RunStep was asked for a trace and returned none")
            try:
                run_metadata.merge(tracing.decode(resp.trace, f"master {self.address}", tracing.MAX_STEP_EVENTS))
            except tracing.TraceDecodeError as e:
                raise WorkerError(f"RunStep on master {self.address}: malformed trace: {e}") from None
        return [got.get(f) for f in fetches], resp.step_id

    def close_session(self, handle: str) -> None:
        self._call("CloseSession", master_pb2.CloseSessionRequest(session_handle=handle))

    def list_devices(self):
        r = self._call("ListDevices", master_pb2.ListDevicesRequest())
        return [{"name": d.name, "device_type": d.device_type, "address": d.address} for d in r.devices]

    def close(self) -> None:
        self.channel.close()
