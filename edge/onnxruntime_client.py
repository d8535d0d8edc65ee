"""The ONNX Runtime phone client: a split's edge part (.onnx) runs in onnxruntime, the rest on `isthmus serve`.

    client = OnnxRuntimeOffloadClient("cut1.onnx", "127.0.0.1:7000", deadline_ms=500)
    probs, = client.invoke(x)            # x as the model's graph takes it (NCHW float32)

What an app with ONNX Runtime Mobile does (docs/phone.md): read the model's "isthmus.onnx" metadata
property once (the cut, its cloud part, the wire names); per request, run the session on float32
inputs (an int8 edge part is QDQ: quantization happens inside the graph), send its outputs, which
are already named by their wire names, in one Infer call, and read the answer (edge/phone_offload.py
holds that glue, shared with the LiteRT client). Where the edge works on after the answer, the
.post.onnx takes the answer's tensors, then the model inputs it reads (by name).

Needs onnxruntime and grpc, both imported lazily; the metadata is read through onnxruntime's own
model metadata, so the onnx package is not needed.
"""
from __future__ import annotations

import json
from typing import List, Optional, Sequence, Union

import numpy as np

from .format import EdgeModelError
from .phone_offload import OffloadCallError, PhoneOffloadClient, read_bytes

METADATA_KEY = "isthmus.onnx"


def ort_session(model: Union[str, bytes], num_threads: int = 1):
    """An onnxruntime CPU session over `model` (a path or bytes) with `num_threads` intra-op threads."""
    try:
        import onnxruntime as ort  # deferred: onnxruntime is heavy and optional
    except ImportError as e:
        raise ImportError("running an .onnx edge part needs onnxruntime: pip install onnxruntime") from e
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = num_threads
    opts.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(read_bytes(model), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001  (onnxruntime raises its own classes for a malformed file)
        raise EdgeModelError(f"onnxruntime cannot load the model: {type(e).__name__}: {e}") from None


def onnx_metadata(sess) -> dict:
    """The session's model's isthmus.onnx metadata (JSON) as onnx_edge.py writes it."""
    raw = sess.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    if raw is None:
        raise EdgeModelError(f"the .onnx has no {METADATA_KEY} metadata (was it written by converters/onnx_edge.py?)")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise EdgeModelError(f"the .onnx's {METADATA_KEY} metadata is not JSON: {e}") from None


def run_session(sess, inputs: Sequence[np.ndarray]) -> List[np.ndarray]:
    """The session's outputs for float32 `inputs` given in the session's input order."""
    names = [i.name for i in sess.get_inputs()]
    if len(inputs) < len(names):
        raise EdgeModelError(f"the .onnx takes {len(names)} inputs ({', '.join(names)}), got {len(inputs)}")
    feeds = {n: np.ascontiguousarray(x, np.float32) for n, x in zip(names, inputs)}
    return [np.asarray(y) for y in sess.run(None, feeds)]


class OnnxRuntimeOffloadClient(PhoneOffloadClient):
    """Runs a cut's edge part in onnxruntime and its cloud part remotely: one Infer per invoke."""

    def __init__(self, edge: Union[str, bytes], address: str, security=None, deadline_ms: float = 1000.0,
                 post: Optional[Union[str, bytes]] = None, num_threads: int = 1):
        self.edge = ort_session(edge, num_threads)
        self.meta = onnx_metadata(self.edge)
        split = self.meta.get("split")
        if not split or self.meta.get("role", "edge") != "edge":
            raise EdgeModelError("the .onnx is not the edge part of a split (its metadata names no cloud part)")
        super().__init__(split["cloud_part"], split["wire_outputs"], address, security, deadline_ms)
        self.send_names = [o.name for o in self.edge.get_outputs()]   # onnx_edge.py names them by wire name
        if self.send_names != list(split["wire_inputs"]):
            raise EdgeModelError(f"the .onnx's outputs {self.send_names} are not its cut's wire names "
                                 f"{split['wire_inputs']}")
        self.post = ort_session(post, num_threads) if post is not None else None
        self.has_post = self.post is not None

    def run_edge(self, *inputs: np.ndarray) -> List[np.ndarray]:
        """The edge part's outputs, float32, in wire-name order (what goes to the cloud)."""
        return [np.ascontiguousarray(y, np.float32) for y in run_session(self.edge, inputs)]

    def run_post(self, answer: Sequence[np.ndarray], inputs: Sequence[np.ndarray]) -> List[np.ndarray]:
        by_name = {i.name: x for i, x in zip(self.edge.get_inputs(), inputs)}
        rest = [by_name[i.name] for i in self.post.get_inputs()[len(answer):]]
        return run_session(self.post, list(answer) + rest)


__all__ = ["OnnxRuntimeOffloadClient", "OffloadCallError", "onnx_metadata", "ort_session", "run_session"]
