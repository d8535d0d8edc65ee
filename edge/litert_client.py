"""The reference phone client: a split's edge part runs in LiteRT, the rest on `isthmus serve`.

    client = LiteRTOffloadClient("cut1.tflite", "127.0.0.1:7000", deadline_ms=500)
    probs, = client.invoke(x)            # x as the model's graph takes it (NCHW float32)

This is, step for step, what an Android or iOS app does with its own LiteRT and gRPC libraries
(docs/phone.md): read the .tflite's "isthmus.tflite" metadata once; per request, put the inputs in
the layout and dtype the metadata gives, run the interpreter, turn each output into the bytes the
cloud part expects (int8 outputs dequantized with the metadata's scale and zero point, NHWC
outputs transposed back to NCHW), send them in one Infer call under their wire names with the
request's deadline, and read the answer's tensors in the part's signature order. Nothing here
falls back or adapts the cut: edge/offload_client.py does that for isthmus's own interpreter.

Needs `ai-edge-litert` (import ai_edge_litert) and grpc; neither is imported by `import isthmus.edge`.
"""
from __future__ import annotations

import json
import uuid
from typing import List, Optional, Sequence, Union

import numpy as np

from ..wire import tensor_codec
from .format import EdgeModelError

METADATA_KEY = "isthmus.tflite"


class OffloadCallError(RuntimeError):
    """The offload service refused the request or missed its deadline (the gRPC status is named)."""


def tflite_metadata(data: bytes) -> dict:
    """The .tflite's isthmus.tflite metadata (JSON), read through the PyPI `tflite` package's schema code
    (its Model reader; edge may not import converters/tflite_schema.py, so it is imported here directly)."""
    try:
        from tflite.Model import Model
    except ImportError as e:
        raise ImportError("reading a .tflite's metadata needs the `tflite` extra: pip install 'isthmus[tflite]'") from e
    try:
        m = Model.GetRootAs(data, 0)
        for k in range(m.MetadataLength()):
            md = m.Metadata(k)
            if md.Name() == METADATA_KEY.encode():
                return json.loads(bytes(m.Buffers(md.Buffer()).DataAsNumpy()).decode("utf-8"))
    except (IndexError, ValueError, UnicodeDecodeError, AttributeError) as e:
        raise EdgeModelError(f"the .tflite's {METADATA_KEY} metadata cannot be read: {e}") from None
    raise EdgeModelError(f"the .tflite has no {METADATA_KEY} metadata (was it written by converters/tflite_write.py?)")


def to_model_input(x: np.ndarray, spec: dict) -> np.ndarray:
    """A graph-layout float array as the .tflite input `spec` takes it (NHWC, int8 where it says)."""
    x = np.asarray(x, np.float32)
    if spec["layout"] == "NHWC":
        x = x.transpose(0, 2, 3, 1)
    if spec["dtype"] == "int8":
        q = spec["quantization"]
        x = np.clip(np.rint(x / q["scale"][0]) + q["zero_point"][0], -128, 127).astype(np.int8)
    return np.ascontiguousarray(x)


def to_wire(y: np.ndarray, spec: dict) -> np.ndarray:
    """A .tflite output as the cloud part takes it: float32, NCHW."""
    if spec["dtype"] == "int8":
        q = spec["quantization"]
        y = ((y.astype(np.float32) - np.float32(q["zero_point"][0])) * np.float32(q["scale"][0])).astype(np.float32)
    if spec["layout"] == "NHWC":
        y = y.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(y, np.float32)


class LiteRTOffloadClient:
    """Runs a cut's edge part in LiteRT and its cloud part remotely: one Infer per invoke."""

    def __init__(self, edge: Union[str, bytes], address: str, security=None, deadline_ms: float = 1000.0,
                 post: Optional[Union[str, bytes]] = None, num_threads: int = 1):
        from ai_edge_litert.interpreter import Interpreter
        self.edge_bytes = _read(edge)
        self.meta = tflite_metadata(self.edge_bytes)
        split = self.meta.get("split")
        if not split:
            raise EdgeModelError("the .tflite is not the edge part of a split (its metadata names no cloud part)")
        self.part, self.wire_outputs = split["cloud_part"], list(split["wire_outputs"])
        self.edge = Interpreter(model_content=self.edge_bytes, num_threads=num_threads)
        self.edge.allocate_tensors()
        self.post = None
        if post is not None:
            pb = _read(post)
            self.post_meta = tflite_metadata(pb)
            self.post = Interpreter(model_content=pb, num_threads=num_threads)
            self.post.allocate_tensors()
        self.address, self.security, self.deadline_s = address, security, deadline_ms / 1e3
        self._channel = self._stub = None

    def invoke(self, *inputs: np.ndarray) -> List[np.ndarray]:
        sent = self.run_edge(*inputs)
        answer = self.call_cloud(sent)
        if self.post is None:
            return answer
        # the post part takes the answer, then the model inputs it reads (named as the edge part names them)
        by_name = {spec["edge_name"]: x for spec, x in zip(self.meta["inputs"], inputs)}
        rest = [by_name[spec["edge_name"]] for spec in self.post_meta["inputs"][len(answer):]]
        return _run(self.post, self.post_meta, list(answer) + rest)

    def run_edge(self, *inputs: np.ndarray) -> List[np.ndarray]:
        """The edge part's outputs, float32 NCHW, in wire_name order (what goes to the cloud)."""
        outs = _run(self.edge, self.meta, inputs, final=False)
        return [to_wire(y, spec) for y, spec in zip(outs, self.meta["outputs"])]

    def call_cloud(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        import grpc
        from isthmus.proto import offload_pb2
        from isthmus.wire import tensor_codec
        self._connect()
        req = offload_pb2.InferRequest(part=self.part, request_id=uuid.uuid4().hex)
        for spec, a in zip(self.meta["outputs"], arrays):
            nt = req.inputs.add()
            nt.name = spec["wire_name"]
            tensor_codec.encode(a, nt.tensor)   # dtype code, shape, raw little-endian bytes
        try:
            resp = self._stub.Infer(req, timeout=self.deadline_s)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            raise OffloadCallError(f"Infer '{self.part}' at {self.address}: {getattr(code, 'name', code)}: "
                                   f"{e.details() if hasattr(e, 'details') else e}") from None
        return [_from_wire(nt, want) for nt, want in _zip_checked(resp.outputs, self.wire_outputs)]

    def _connect(self) -> None:
        if self._stub is not None:
            return
        from isthmus.proto import offload_pb2_grpc
        from isthmus.wire.security import make_channel
        opts = [("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]
        self._channel = make_channel(self.address, self.security, opts)
        self._stub = offload_pb2_grpc.OffloadStub(self._channel)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def __enter__(self) -> "LiteRTOffloadClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read(src: Union[str, bytes]) -> bytes:
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src)
    with open(src, "rb") as f:
        return f.read()


def _run(it, meta: dict, inputs: Sequence[np.ndarray], final: bool = True) -> List[np.ndarray]:
    if len(inputs) < len(meta["inputs"]):
        raise EdgeModelError(f"the .tflite takes {len(meta['inputs'])} inputs, got {len(inputs)}")
    for d, spec, x in zip(it.get_input_details(), meta["inputs"], inputs):
        it.set_tensor(d["index"], to_model_input(x, spec))
    it.reset_all_variables()   # LiteRT keeps an LSTM's h and c across invokes; isthmus starts each from zeros
    it.invoke()
    outs = [it.get_tensor(d["index"]) for d in it.get_output_details()]
    return [to_wire(y, s) for y, s in zip(outs, meta["outputs"])] if final else outs


def _zip_checked(got, want_names):
    if len(got) != len(want_names):
        raise OffloadCallError(f"the service answered {len(got)} tensors, expected {len(want_names)}")
    return zip(got, want_names)


def _from_wire(nt, want_name: str) -> np.ndarray:
    from isthmus.wire import tensor_codec
    if nt.name != want_name:
        raise OffloadCallError(f"the service answered '{nt.name}' where '{want_name}' was expected")
    try:
        return np.array(tensor_codec.decode(nt.tensor))
    except tensor_codec.TensorCodecError as e:
        raise OffloadCallError(f"tensor '{want_name}': {e}") from None


__all__ = ["LiteRTOffloadClient", "OffloadCallError", "tflite_metadata", "to_model_input", "to_wire"]
