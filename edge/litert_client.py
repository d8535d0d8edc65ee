"""The reference phone client: a split's edge part runs in LiteRT, the rest on `isthmus serve`.

    client = LiteRTOffloadClient("cut1.tflite", "127.0.0.1:7000", deadline_ms=500)
    probs, = client.invoke(x)            # x as the model's graph takes it (NCHW float32)

This is, step for step, what an Android or iOS app does with its own LiteRT and gRPC libraries
(docs/phone.md): read the .tflite's "isthmus.tflite" metadata once; per request, put the inputs in
the layout and dtype the metadata gives, run the interpreter, turn each output into the bytes the
cloud part expects (int8 outputs dequantized with the metadata's scale and zero point, NHWC
outputs transposed back to NCHW), send them in one Infer call under their wire names with the
request's deadline, and read the answer's tensors in the part's signature order (that request and
response glue is edge/phone_offload.py's, shared with the onnxruntime client). Nothing here falls
back or adapts the cut: edge/offload_client.py does that for isthmus's own interpreter.

Needs `ai-edge-litert` (import ai_edge_litert) and grpc; neither is imported by `import isthmus.edge`.
"""
from __future__ import annotations

import json
from typing import List, Optional, Sequence, Union

import numpy as np

from .format import EdgeModelError
from .phone_offload import OffloadCallError, PhoneOffloadClient, read_bytes

METADATA_KEY = "isthmus.tflite"


def tflite_metadata(data: bytes) -> dict:
    """The .tflite's isthmus.tflite metadata (JSON), read through the PyPI `tflite` package's schema code
    (its Model reader; edge may not import converters/tflite_schema.py, so it is imported here directly)."""
    try:
        from tflite.Model import Model  # deferred: the tflite extra is optional
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


class LiteRTOffloadClient(PhoneOffloadClient):
    """Runs a cut's edge part in LiteRT and its cloud part remotely: one Infer per invoke."""

    def __init__(self, edge: Union[str, bytes], address: str, security=None, deadline_ms: float = 1000.0,
                 post: Optional[Union[str, bytes]] = None, num_threads: int = 1):
        from ai_edge_litert.interpreter import Interpreter  # deferred: the litert extra is optional
        self.edge_bytes = read_bytes(edge)
        self.meta = tflite_metadata(self.edge_bytes)
        split = self.meta.get("split")
        if not split:
            raise EdgeModelError("the .tflite is not the edge part of a split (its metadata names no cloud part)")
        super().__init__(split["cloud_part"], split["wire_outputs"], address, security, deadline_ms)
        self.send_names = [spec["wire_name"] for spec in self.meta["outputs"]]
        self.edge = Interpreter(model_content=self.edge_bytes, num_threads=num_threads)
        self.edge.allocate_tensors()
        self.post = None
        if post is not None:
            pb = read_bytes(post)
            self.post_meta = tflite_metadata(pb)
            self.post = Interpreter(model_content=pb, num_threads=num_threads)
            self.post.allocate_tensors()
        self.has_post = self.post is not None

    def run_edge(self, *inputs: np.ndarray) -> List[np.ndarray]:
        """The edge part's outputs, float32 NCHW, in wire_name order (what goes to the cloud)."""
        outs = _run(self.edge, self.meta, inputs, final=False)
        return [to_wire(y, spec) for y, spec in zip(outs, self.meta["outputs"])]

    def run_post(self, answer: Sequence[np.ndarray], inputs: Sequence[np.ndarray]) -> List[np.ndarray]:
        # the post part takes the answer, then the model inputs it reads (named as the edge part names them)
        by_name = {spec["edge_name"]: x for spec, x in zip(self.meta["inputs"], inputs)}
        rest = [by_name[spec["edge_name"]] for spec in self.post_meta["inputs"][len(answer):]]
        return _run(self.post, self.post_meta, list(answer) + rest)


def _run(it, meta: dict, inputs: Sequence[np.ndarray], final: bool = True) -> List[np.ndarray]:
    if len(inputs) < len(meta["inputs"]):
        raise EdgeModelError(f"the .tflite takes {len(meta['inputs'])} inputs, got {len(inputs)}")
    for d, spec, x in zip(it.get_input_details(), meta["inputs"], inputs):
        it.set_tensor(d["index"], to_model_input(x, spec))
    it.reset_all_variables()   # LiteRT keeps an LSTM's h and c across invokes; isthmus starts each from zeros
    it.invoke()
    outs = [it.get_tensor(d["index"]) for d in it.get_output_details()]
    return [to_wire(y, s) for y, s in zip(outs, meta["outputs"])] if final else outs


__all__ = ["LiteRTOffloadClient", "OffloadCallError", "tflite_metadata", "to_model_input", "to_wire"]
