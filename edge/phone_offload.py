"""What a phone-runtime client does around its runtime: offload protocol v1's Infer call (docs/phone.md).

The LiteRT client (edge/litert_client.py) and the onnxruntime client (edge/onnxruntime_client.py)
differ only in how they run the edge part and the part after the answer; this base holds the rest:
per request, run the edge part, send its outputs under their wire names in one Infer call with the
request's deadline, check the answer's names against the cut's wire outputs, then run the post part
(if the cut has one) on the answer and the model inputs it reads. Nothing here falls back or adapts
the cut: edge/offload_client.py does that for isthmus's own interpreter. grpc is imported lazily.
"""
from __future__ import annotations

import uuid
from typing import List, Sequence, Union

import numpy as np

from isthmus.wire import tensor_codec
from isthmus.wire.security import make_channel

GRPC_OPTIONS = [("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]


class OffloadCallError(RuntimeError):
    """The offload service refused the request or missed its deadline (the gRPC status is named)."""


def read_bytes(src: Union[str, bytes]) -> bytes:
    """A model given as bytes or as a path, as bytes."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src)
    with open(src, "rb") as f:
        return f.read()


class PhoneOffloadClient:
    """One Infer per invoke: run_edge -> call_cloud -> run_post. Subclasses set `send_names` (the wire
    name of each run_edge output, in order) and define run_edge, and run_post where `has_post`."""

    send_names: List[str]
    has_post = False

    def __init__(self, part: str, wire_outputs: Sequence[str], address: str, security=None,
                 deadline_ms: float = 1000.0):
        self.part, self.wire_outputs = part, list(wire_outputs)
        self.address, self.security, self.deadline_s = address, security, deadline_ms / 1e3
        self._channel = self._stub = None

    def run_edge(self, *inputs: np.ndarray) -> List[np.ndarray]:
        """The edge part's outputs as the cloud part takes them (float32, the graph's layout)."""
        raise NotImplementedError

    def run_post(self, answer: Sequence[np.ndarray], inputs: Sequence[np.ndarray]) -> List[np.ndarray]:
        """The model's outputs from the cloud's answer and the model inputs (cuts with a post part)."""
        raise NotImplementedError

    def invoke(self, *inputs: np.ndarray) -> List[np.ndarray]:
        answer = self.call_cloud(self.run_edge(*inputs))
        return self.run_post(answer, inputs) if self.has_post else answer

    def call_cloud(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        """One Infer call: `arrays` under send_names; the answer's tensors in wire_outputs order."""
        import grpc  # deferred: grpc is heavy and only a client that calls needs it
        from isthmus.proto import offload_pb2  # deferred: protobuf's generated code, with grpc
        self._connect()
        req = offload_pb2.InferRequest(part=self.part, request_id=uuid.uuid4().hex)
        for name, a in zip(self.send_names, arrays):
            nt = req.inputs.add()
            nt.name = name
            tensor_codec.encode(np.ascontiguousarray(a), nt.tensor)   # dtype code, shape, raw little-endian bytes
        try:
            resp = self._stub.Infer(req, timeout=self.deadline_s)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            raise OffloadCallError(f"Infer '{self.part}' at {self.address}: {getattr(code, 'name', code)}: "
                                   f"{e.details() if hasattr(e, 'details') else e}") from None
        if len(resp.outputs) != len(self.wire_outputs):
            raise OffloadCallError(f"the service answered {len(resp.outputs)} tensors, expected {len(self.wire_outputs)}")
        return [_from_wire(nt, want) for nt, want in zip(resp.outputs, self.wire_outputs)]

    def _connect(self) -> None:
        if self._stub is not None:
            return
        from isthmus.proto import offload_pb2_grpc  # deferred: imports grpc
        self._channel = make_channel(self.address, self.security, GRPC_OPTIONS)
        self._stub = offload_pb2_grpc.OffloadStub(self._channel)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _from_wire(nt, want_name: str) -> np.ndarray:
    if nt.name != want_name:
        raise OffloadCallError(f"the service answered '{nt.name}' where '{want_name}' was expected")
    try:
        return np.array(tensor_codec.decode(nt.tensor))
    except tensor_codec.TensorCodecError as e:
        raise OffloadCallError(f"tensor '{want_name}': {e}") from None


__all__ = ["PhoneOffloadClient", "OffloadCallError", "read_bytes"]
