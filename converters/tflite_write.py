"""Write the edge part of a split (or a whole graph the edge can run) as a LiteRT .tflite file.

    data = to_tflite(session, [y], int8=True, calibration=feeds, input_type="int8")
    part = split_to_tflite("model.isth", cut="cut1")     # part.edge: the .tflite a phone runs

The source is isthmus's own edge model (fp32, or int8 from converters/quantize.py), so the
.tflite computes what isthmus's edge interpreter computes: same ops (fused conv + bias +
activation), same weights, same quantization parameters (per-channel int8 weights, int32 biases,
per-tensor int8 activations). NCHW image tensors are laid out as NHWC (tflite_write_layout.py);
inputs are NHWC by default, outputs keep the edge model's NCHW so that their bytes are what the
cloud part's signature expects. The file's metadata "isthmus.tflite" (JSON) names every input and
output, its layout, dtype and quantization parameters, and for a split the cloud part and the
wire name each output is sent under (docs/phone.md).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Union

import isthmus.core as ism
import numpy as np

from isthmus.edge.format import EdgeModelError
from isthmus.edge.loader import EdgeModel, loads

from .edge_formats import split_cut
from .tflite_write_fb import TFLiteBuilder
from .tflite_write_layout import LAYOUT_NHWC, PLAIN, TFLiteExportError, Translator
from .tflite_write_ops import HANDLERS
from . import (tflite_write_act, tflite_write_array_ops, tflite_write_convt, tflite_write_unrolled,  # noqa: F401
               tflite_write_lstm, tflite_write_resize)  # (each registers its ops' handlers)
from .edge_export import to_edge
from .quantize import quantize_to_edge
from .tflite_schema import fb

METADATA_KEY = "isthmus.tflite"
METADATA_VERSION = 1
TYPES = ("float32", "int8")


def supported_ops() -> List[str]:
    """The edge ops the TFLite writer translates."""
    return sorted(HANDLERS)


def _select(m: EdgeModel, inputs: List[int], outputs: List[int]) -> List[int]:
    """Indices of the operators computing `outputs` from `inputs` and constants, in file order."""
    producer = {o: k for k, op in enumerate(m.operators) for o in op.outputs}
    need, todo, seen = set(), list(outputs), set()
    while todo:
        e = todo.pop()
        if e in seen or e in inputs or m.tensors[e].data is not None:
            continue
        seen.add(e)
        if e not in producer:
            raise TFLiteExportError(f"TFLite export: tensor '{m.tensors[e].name}' is neither computed by the "
                                    "model nor one of its inputs")
        k = producer[e]
        need.add(k)
        todo.extend(i for i in m.operators[k].inputs if i >= 0)
    return sorted(need)


def _index(m: EdgeModel, ref: Union[int, str]) -> int:
    if isinstance(ref, (int, np.integer)):
        return int(ref)
    for i, t in enumerate(m.tensors):
        if t.name == ref:
            return i
    raise TFLiteExportError(f"TFLite export: no tensor named '{ref}' in the edge model")


def edge_to_tflite(model: Union[bytes, str, EdgeModel], inputs: Optional[Sequence[Union[int, str]]] = None,
                   outputs: Optional[Sequence[Union[int, str]]] = None, input_type: str = "float32",
                   output_type: str = "float32", input_layout: str = "nhwc", output_layout: str = "nchw",
                   batch: int = 1, wire_names: Optional[Sequence[str]] = None,
                   extra: Optional[Dict[str, object]] = None) -> bytes:
    """The .tflite computing `outputs` (tensor names or indices; default the model's) from `inputs`.

    input_type/output_type: "float32" or "int8" (TFLiteConverter's inference_input_type and
    inference_output_type: int8 drops the leading QUANTIZE / trailing DEQUANTIZE of an int8 model).
    input_layout: "nhwc" (rank-4 inputs as images are on phones) or "nchw". output_layout: "nchw"
    (the bytes the cloud part expects) or "nhwc". wire_names: the name each output has on the wire."""
    if isinstance(model, str):
        with open(model, "rb") as f:
            model = f.read()
    m = loads(bytes(model)) if not isinstance(model, EdgeModel) else model
    if input_type not in TYPES or output_type not in TYPES:
        raise ValueError(f"input_type/output_type must be one of {TYPES}, got {input_type!r}/{output_type!r}")
    if input_layout not in ("nhwc", "nchw") or output_layout not in ("nhwc", "nchw"):
        raise ValueError("input_layout/output_layout must be 'nhwc' or 'nchw'")
    ins = [_index(m, r) for r in (m.inputs if inputs is None else inputs)]
    outs = [_index(m, r) for r in (m.outputs if outputs is None else outputs)]
    ops = [m.operators[k] for k in _select(m, ins, outs)]
    b = TFLiteBuilder()
    tr = Translator(m, b, batch)
    tr.wanted = set(outs)
    skip, in_ids, in_meta = _bind_inputs(tr, ops, ins, input_type, input_layout)
    out_src, skip_out = _output_sources(tr, ops, outs, output_type)
    for op in ops:
        if id(op) in skip or id(op) in skip_out:
            continue
        tr.op = op
        handler = HANDLERS.get(op.op)
        if handler is None:
            raise tr.fail(f"op {op.op} has no TFLite form (the writer handles: {', '.join(supported_ops())})")
        try:
            handler(tr, op)
        except EdgeModelError as e:    # the edge's own reading of the attributes (edge_geometry.py) refused
            raise tr.fail(str(e)) from None
    tr.op = None
    b.inputs = in_ids
    out_meta = []
    for k, (e, src) in enumerate(zip(outs, out_src)):
        layout = LAYOUT_NHWC if output_layout == "nhwc" and len(tr.shape(src)) == 4 else PLAIN
        i = tr.get(src, layout)
        b.outputs.append(i)
        out_meta.append(_io_meta(tr, i, src, e, layout, ops,
                                 None if wire_names is None else wire_names[k]))
    meta = {"version": METADATA_VERSION, "producer": "isthmus converters/tflite_write.py",
            "source_producer": m.producer, "inputs": in_meta, "outputs": out_meta}
    meta.update(extra or {})
    b.set_metadata_json(METADATA_KEY, meta)
    return b.to_bytes()


def _bind_inputs(tr: Translator, ops, ins: List[int], input_type: str, input_layout: str):
    """The model's input tensors; with int8 inputs, each float input's QUANTIZE consumers go and
    their int8 outputs become the inputs. (ops to skip, tflite input indices, metadata)."""
    skip, ids, meta = set(), [], []
    m = tr.m
    for e in ins:
        layout = LAYOUT_NHWC if input_layout == "nhwc" and len(tr.shape(e)) == 4 else PLAIN
        src = e
        if input_type == "int8" and m.tensors[e].dtype == np.float32:
            users = [op for op in ops if e in op.inputs]
            qs = [op for op in users if op.op == "Quantize"]
            if not qs or len(qs) != len(users) or any(tr.quant(q.outputs[0]) != tr.quant(qs[0].outputs[0])
                                                      for q in qs):
                raise TFLiteExportError(f"TFLite export: input '{m.tensors[e].name}' is not quantized by one "
                                        "QUANTIZE alone: it cannot be an int8 input (use input_type='float32')")
            src = qs[0].outputs[0]
            skip.update(id(q) for q in qs)
            i = tr.new(src, layout)
            for q in qs[1:]:
                tr.alias(src, q.outputs[0])
        else:
            i = tr.new(e, layout)
        ids.append(i)
        meta.append(_io_meta(tr, i, src, e, layout, ops, None))
    return skip, ids, meta


def _output_sources(tr: Translator, ops, outs: List[int], output_type: str):
    """The edge tensor each output is read from: with int8 outputs, the input of the DEQUANTIZE
    that made a float output (the DEQUANTIZE is skipped when nothing else reads its result)."""
    if output_type != "int8":
        return list(outs), set()
    producer = {o: op for op in ops for o in op.outputs}
    srcs, skip = [], set()
    for e in outs:
        op = producer.get(e)
        if tr.m.tensors[e].dtype == np.int8:
            srcs.append(e)
            continue
        if op is None or op.op != "Dequantize":
            raise TFLiteExportError(f"TFLite export: output '{tr.m.tensors[e].name}' is not an int8 tensor's "
                                    "DEQUANTIZE: it cannot be an int8 output (use output_type='float32')")
        srcs.append(op.inputs[0])
        if not any(e in o.inputs for o in ops):
            skip.add(id(op))
    return srcs, skip


def _twin_quant(tr: Translator, ops, e: int) -> Optional[dict]:
    """The int8 parameters of e itself, or of the int8 tensor a float e was dequantized from or is
    quantized to (what an app may send instead of float32)."""
    if tr.m.tensors[e].dtype == np.int8:
        return tr.quant(e) or None
    for op in ops:
        if op.op == "Dequantize" and e in op.outputs:
            return tr.quant(op.inputs[0]) or None
        if op.op == "Quantize" and e in op.inputs:
            return tr.quant(op.outputs[0]) or None
    return None


def _io_meta(tr: Translator, i: int, src: int, e: int, layout: str, ops, wire: Optional[str]) -> dict:
    t = tr.b.tensors[i]
    q = _twin_quant(tr, ops, src)
    out = {"name": t.name, "tensor": i, "edge_name": tr.m.tensors[e].name, "dtype": str(t.dtype),
           "shape": list(t.shape), "layout": ("NHWC" if layout == LAYOUT_NHWC else "NCHW") if len(t.shape) == 4 else "",
           "quantization": None if q is None else {"scale": q["scale"], "zero_point": q["zero_point"]}}
    if wire is not None:
        out["wire_name"] = wire
    return out


def read_metadata(data: bytes) -> dict:
    """The "isthmus.tflite" metadata of a .tflite written here (for clients and tests)."""
    m = fb.Model.GetRootAs(data, 0)
    for k in range(m.MetadataLength()):
        md = m.Metadata(k)
        if md.Name().decode() == METADATA_KEY:
            raw = m.Buffers(md.Buffer()).DataAsNumpy()
            return json.loads(bytes(raw).decode("utf-8"))
    raise TFLiteExportError(f"the .tflite has no '{METADATA_KEY}' metadata")


def to_tflite(source, outputs: Sequence, inputs: Optional[Sequence] = None, int8: bool = False,
              calibration=None, batch: int = 1, **options) -> bytes:
    """A whole graph (a Session, whose variables are frozen, or a Graph) as a .tflite: the edge
    export (or, with int8, converters/quantize.py's calibrated quantization) written as TFLite."""
    if not int8:
        data = to_edge(source, list(outputs), inputs=inputs, batch=batch)
    else:
        if calibration is None:
            raise ValueError("int8=True needs calibration feeds")
        if not hasattr(source, "run"):
            source = ism.Session(source)
        data, _ = quantize_to_edge(source, list(outputs), calibration, batch=batch)
    return edge_to_tflite(data, batch=batch, **options)


@dataclass
class TFLiteSplitPart:
    """One cut of a split model as .tflite files: `edge` computes what is sent to `cloud_part`
    (outputs in `wire_inputs` order); `post`, when the edge works on after the cloud's answer,
    takes the answer's tensors (`wire_outputs`), then those of the model's inputs it reads."""
    cut: str
    cloud_part: str
    edge: bytes
    wire_inputs: List[str]
    wire_outputs: List[str]
    post: Optional[bytes] = None


def split_to_tflite(split: Union[bytes, str], cut: Optional[str] = None, **options) -> TFLiteSplitPart:
    """The edge part of one cut of an isthmus split model (converters/split_export.py) as .tflite.
    `cut`: a cut name; default the first cut that has a cloud part. `options`: edge_to_tflite's."""
    info, c, m, remote = split_cut(split, cut, TFLiteExportError)
    extra = {"split": {"model": info.get("model", ""), "cut": c["name"], "cloud_part": c["cloud_part"],
                       "wire_inputs": c["inputs"], "wire_outputs": c["outputs"]}}
    edge = edge_to_tflite(m, inputs=m.inputs, outputs=remote.inputs, wire_names=c["inputs"],
                          extra=dict(extra, role="edge"), **options)
    post = None
    if any(o not in remote.outputs for o in m.outputs):
        opts = dict(options, input_layout="nchw")
        ops = _select(m, list(remote.outputs) + list(m.inputs), list(m.outputs))
        read = {i for k in ops for i in m.operators[k].inputs}
        post = edge_to_tflite(m, inputs=list(remote.outputs) + [e for e in m.inputs if e in read],
                              outputs=m.outputs, extra=dict(extra, role="post"), **opts)
    return TFLiteSplitPart(c["name"], c["cloud_part"], edge, list(c["inputs"]), list(c["outputs"]), post)


__all__ = ["edge_to_tflite", "to_tflite", "split_to_tflite", "read_metadata", "supported_ops",
           "TFLiteSplitPart", "TFLiteExportError", "METADATA_KEY"]
