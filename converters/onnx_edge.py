"""Write the edge part of a split (or any isthmus edge model) as ONNX for ONNX Runtime Mobile.

    model = edge_to_onnx("model.isth")                        # an onnx.ModelProto
    part = split_to_onnx("split.isth", cut="cut1")            # part.edge: the cut's edge part

fp32 edge ops become their ONNX ops (NCHW both sides: no layout change). An int8 edge model is
written in QDQ form, which ORT's optimizer turns into its integer kernels (QLinearConv, ...):
each int8 activation is a float tensor between QuantizeLinear and DequantizeLinear with the edge
tensor's scale and zero point; int8 weights and int32 biases are initializers read through
DequantizeLinear (per channel where the edge model quantizes per channel). The graph's outputs
are named by their wire names for a split, so their values go to the cloud part as they are.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from isthmus.edge.format import EdgeModelError
from isthmus.edge.loader import EdgeModel, loads

from .edge_formats import split_cut
from .onnx_edge_ops import TRANSLATORS
from .tflite_write import _index, _select
from .tflite_write_layout import TFLiteExportError

OPSET = 17
IR_VERSION = 8
ACT = {"relu": ("Relu", {}), "tanh": ("Tanh", {}), "sigmoid": ("Sigmoid", {})}
# the edge ops _translate writes (a test keeps this beside edge/capabilities.py's table)
SUPPORTED = frozenset({"Conv2D", "FusedConv2D", "MatMul", "FusedMatMul", "BiasAdd", "Add", "Sub", "Mul", "Div",
                       "Maximum", "Minimum", "Relu", "Tanh", "Sigmoid", "Identity", "Relu6", "MaxPool", "AvgPool",
                       "GlobalAvgPool", "Reshape", "Flatten", "Concat", "Softmax", "Pad", "BatchNorm", "LeakyRelu",
                       "Transpose", "LayerNorm", "Split", "Quantize", "Dequantize"}) | frozenset(TRANSLATORS)


class OnnxEdgeExportError(TFLiteExportError):
    """An edge model the ONNX edge writer cannot express: names the operator and op."""


class _Writer:
    def __init__(self, m: EdgeModel, batch: int):
        from onnx import helper, numpy_helper  # deferred: onnx is heavy; loaded when a model is written
        self.m, self.batch, self.h, self.nh = m, batch, helper, numpy_helper
        self.nodes: List = []
        self.inits: List = []
        self.names: Dict[int, str] = {}       # edge tensor -> the float ONNX tensor holding its value
        self.n = 0
        self.op = None

    def fail(self, why: str) -> OnnxEdgeExportError:
        where = f"operator '{self.m.tensors[self.op.outputs[0]].name}' ({self.op.op})" if self.op else "model"
        return OnnxEdgeExportError(f"ONNX edge export: {where}: {why}")

    def fresh(self, base: str) -> str:
        self.n += 1
        return f"{base}__{self.n}"

    def node(self, op: str, ins: Sequence[str], outs: Sequence[str], **attrs) -> None:
        self.nodes.append(self.h.make_node(op, list(ins), list(outs), name=self.fresh(op), **attrs))

    def init(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.inits.append(self.nh.from_array(np.asarray(value), name))
        return name

    def shape(self, e: int):
        return tuple(self.batch if (d == -1 and k == 0) else d for k, d in enumerate(self.m.tensors[e].shape))

    def qparams(self, e: int):
        t = self.m.tensors[e]
        if not len(t.scale):
            return None
        zp = np.asarray(t.zero_point) if len(t.zero_point) else np.zeros(len(t.scale), np.int64)  # empty: zero
        return np.asarray(t.scale, np.float32), zp, max(t.axis, 0)

    def value(self, e: int) -> str:
        """The float ONNX tensor of edge tensor e (a constant read through DequantizeLinear if quantized)."""
        if e in self.names:
            return self.names[e]
        t = self.m.tensors[e]
        if t.data is None:
            raise self.fail(f"tensor '{t.name}' is used before it is computed")
        data = np.asarray(t.data).reshape(self.shape(e))
        q = self.qparams(e)
        if q is None or t.dtype == np.float32:
            self.names[e] = self.init(t.name, data)
            return self.names[e]
        s, z, axis = q
        zdt = np.int8 if t.dtype == np.int8 else np.int32
        per = len(s) > 1
        ins = [self.init(t.name, data), self.init(t.name + "/scale", s if per else s.reshape(())),
               self.init(t.name + "/zero_point", (z if per else z.reshape(())).astype(zdt))]
        out = self.fresh(t.name + "/dq")
        self.node("DequantizeLinear", ins, [out], **({"axis": axis} if per else {}))
        self.names[e] = out
        return out

    def bias(self, b: int, x: int, w: int) -> str:
        """A conv / matmul bias as a float tensor; an int32 bias without parameters is at s_x * s_w
        (the edge kernels' convention), said here for DequantizeLinear."""
        t = self.m.tensors[b]
        if b in self.names or t.dtype != np.int32 or self.qparams(b) is not None:
            return self.value(b)
        sx, sw = self.qparams(x)[0], self.qparams(w)[0]
        scale = np.broadcast_to(sx[0] * sw, (t.shape[0],)).astype(np.float32)
        ins = [self.init(t.name, np.asarray(t.data).reshape(-1)), self.init(t.name + "/scale", scale),
               self.init(t.name + "/zero_point", np.zeros(len(scale), np.int32))]
        out = self.fresh(t.name + "/dq")
        self.node("DequantizeLinear", ins, [out], axis=0)
        self.names[b] = out
        return out

    def result(self, e: int, raw: str) -> None:
        """Bind edge tensor e to the float `raw`; an int8 e passes QuantizeLinear + DequantizeLinear."""
        t = self.m.tensors[e]
        q = self.qparams(e)
        if t.dtype != np.int8 or q is None:
            self.names[e] = raw
            return
        s, z, _ = q
        if len(s) > 1:
            raise self.fail(f"tensor '{t.name}' is quantized per channel: activations are per tensor")
        sn, zn = self.init(t.name + "/scale", s.reshape(())), self.init(t.name + "/zero_point", z.reshape(()).astype(np.int8))
        qn, out = self.fresh(t.name + "/q"), self.fresh(t.name)
        self.node("QuantizeLinear", [raw, sn, zn], [qn])
        self.node("DequantizeLinear", [qn, sn, zn], [out])
        self.names[e] = out

    def activation(self, x: str, act: str) -> str:
        if act in ("none", "", None):
            return x
        out = self.fresh("act")
        if act == "relu6":
            self.node("Clip", [x, self.init("zero", np.float32(0)), self.init("six", np.float32(6))], [out])
        elif act in ACT:
            self.node(ACT[act][0], [x], [out])
        else:
            raise self.fail(f"activation '{act}' has no ONNX form here")
        return out


def _translate(w: _Writer, op) -> None:
    a = op.attrs
    y = op.outputs[0]
    kind = op.op
    x = w.value(op.inputs[0]) if op.inputs and kind not in TRANSLATORS else None
    out = w.fresh(w.m.tensors[y].name + "/f")
    if kind in ("Conv2D", "FusedConv2D"):
        t, b, l, r = a.get("pads", (0, 0, 0, 0))
        ins = [x, w.value(op.inputs[1])] + ([w.bias(op.inputs[2], op.inputs[0], op.inputs[1])]
                                            if len(op.inputs) > 2 and op.inputs[2] >= 0 else [])
        w.node("Conv", ins, [out], pads=[t, l, b, r], strides=list(a.get("strides", (1, 1))),
               dilations=list(a.get("dilations", (1, 1))), group=int(a.get("groups", 1)))
        out = w.activation(out, a.get("activation", "none"))
    elif kind in ("MatMul", "FusedMatMul"):
        wv = w.value(op.inputs[1])
        ta, tb = int(a.get("transpose_a", 0)), int(a.get("transpose_b", 0))
        if ta or tb:
            perm = lambda n: list(range(n - 2)) + [n - 1, n - 2]  # noqa: E731
            if ta:
                x2 = w.fresh("xt")
                w.node("Transpose", [x], [x2], perm=perm(len(w.shape(op.inputs[0]))))
                x = x2
            if tb:
                w2 = w.fresh("wt")
                w.node("Transpose", [wv], [w2], perm=perm(len(w.shape(op.inputs[1]))))
                wv = w2
        w.node("MatMul", [x, wv], [out])
        if len(op.inputs) > 2 and op.inputs[2] >= 0:
            summed = w.fresh("biased")
            w.node("Add", [out, w.bias(op.inputs[2], op.inputs[0], op.inputs[1])], [summed])
            out = summed
        out = w.activation(out, a.get("activation", "none"))
    elif kind == "BiasAdd":
        rank = len(w.shape(op.inputs[0]))
        axis = int(a.get("axis", -1)) % rank
        shape = w.init("bias_shape", np.asarray((-1,) + (1,) * (rank - axis - 1), np.int64))
        bv = w.fresh("bias")
        w.node("Reshape", [w.value(op.inputs[1]), shape], [bv])
        w.node("Add", [x, bv], [out])
    elif kind in ("Add", "Sub", "Mul", "Div", "Maximum", "Minimum"):
        w.node({"Maximum": "Max", "Minimum": "Min"}.get(kind, kind), [x, w.value(op.inputs[1])], [out])
    elif kind in ("Relu", "Tanh", "Sigmoid", "Identity"):
        w.node(kind, [x], [out])
    elif kind == "Relu6":
        out = w.activation(x, "relu6")
    elif kind in ("MaxPool", "AvgPool"):
        t, b, l, r = a.get("pads", (0, 0, 0, 0))
        k = list(a["ksize"])
        extra = {"count_include_pad": 0} if kind == "AvgPool" else {}
        w.node("MaxPool" if kind == "MaxPool" else "AveragePool", [x], [out], kernel_shape=k,
               strides=list(a.get("strides", k)), pads=[t, l, b, r], **extra)
    elif kind == "GlobalAvgPool":
        w.node("ReduceMean", [x, w.init("axes", np.asarray([2, 3], np.int64))] if OPSET >= 18 else [x], [out],
               keepdims=int(a.get("keepdims", 0)), **({} if OPSET >= 18 else {"axes": [2, 3]}))
    elif kind in ("Reshape", "Flatten"):
        w.node("Reshape", [x, w.init("shape", np.asarray(w.shape(y), np.int64))], [out])
    elif kind == "Concat":
        w.node("Concat", [w.value(i) for i in op.inputs], [out], axis=int(a.get("axis", 0)))
    elif kind == "Softmax":
        w.node("Softmax", [x], [out], axis=int(a.get("axis", -1)))
    elif kind == "Pad":
        p = np.asarray(a["paddings"], np.int64).reshape(-1, 2)
        w.node("Pad", [x, w.init("pads", np.concatenate([p[:, 0], p[:, 1]])),
                       w.init("value", np.float32(a.get("constant_value", 0.0)))], [out], mode="constant")
    elif kind == "BatchNorm":
        w.node("BatchNormalization", [x] + [w.value(i) for i in op.inputs[1:5]], [out],
               epsilon=float(a.get("epsilon", 1e-3)))
    elif kind == "LeakyRelu":
        w.node("LeakyRelu", [x], [out], alpha=float(a.get("alpha", 0.2)))
    elif kind == "Transpose":
        w.node("Transpose", [x], [out], perm=[int(p) for p in a["perm"]])
    elif kind == "LayerNorm":
        w.node("LayerNormalization", [x, w.value(op.inputs[1]), w.value(op.inputs[2])], [out],
               axis=int(a.get("axis", -1)), epsilon=float(a.get("epsilon", 1e-5)))
    elif kind == "Split":
        axis = int(a.get("axis", 0)) % len(w.shape(op.inputs[0]))
        sizes = np.asarray([w.shape(o)[axis] for o in op.outputs], np.int64)
        outs = [w.fresh(w.m.tensors[o].name + "/f") for o in op.outputs]
        w.node("Split", [x, w.init("split", sizes)], outs, axis=axis)
        for o, raw in zip(op.outputs, outs):
            w.result(o, raw)
        return
    elif kind in ("Quantize", "Dequantize"):
        out = x   # the float value; result() adds Q/DQ for an int8 output
    elif kind in TRANSLATORS:
        out = TRANSLATORS[kind](w, op)
        if out is None:    # the translator bound its outputs itself
            return
    else:
        raise w.fail(f"op {kind} has no ONNX form here")
    w.result(y, out)


def edge_to_onnx(model: Union[bytes, str, EdgeModel], inputs: Optional[Sequence[Union[int, str]]] = None,
                 outputs: Optional[Sequence[Union[int, str]]] = None, output_names: Optional[Sequence[str]] = None,
                 batch: int = 1, extra: Optional[Dict[str, object]] = None):
    """An onnx.ModelProto computing `outputs` from `inputs` (default: the model's), fp32 or QDQ int8.
    Inputs and outputs are float32 (int8 boundaries become QuantizeLinear/DequantizeLinear)."""
    from onnx import TensorProto, checker, helper  # deferred: onnx is heavy; loaded when a model is written
    if isinstance(model, str):
        with open(model, "rb") as f:
            model = f.read()
    m = loads(bytes(model)) if not isinstance(model, EdgeModel) else model
    ins = [_index(m, r) for r in (m.inputs if inputs is None else inputs)]
    outs = [_index(m, r) for r in (m.outputs if outputs is None else outputs)]
    w = _Writer(m, batch)
    g_in = []
    for e in ins:
        name = m.tensors[e].name
        if m.tensors[e].dtype == np.int8:   # an int8 input (a slice of an int8 model) arrives as its float value
            w.result(e, name)
        else:
            w.names[e] = name
        dt = m.tensors[e].dtype
        elem = TensorProto.FLOAT if dt in (np.float32, np.int8) else helper.np_dtype_to_tensor_dtype(np.dtype(dt))
        g_in.append(helper.make_tensor_value_info(name, elem, list(w.shape(e))))
    for k in _select(m, ins, outs):
        w.op = m.operators[k]
        try:
            _translate(w, w.op)
        except EdgeModelError as e:    # the edge's own reading of the attributes (edge_geometry.py) refused
            raise w.fail(str(e)) from None
    w.op = None
    g_out, taken = [], set()
    for k, e in enumerate(outs):
        name = output_names[k] if output_names else m.tensors[e].name
        if name in taken:          # the same tensor output twice: ONNX names each output once
            name = f"{name}/{k}"
        taken.add(name)
        if w.value(e) != name:     # (an input passed straight through is its own output)
            w.node("Identity", [w.value(e)], [name])
        g_out.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(w.shape(e))))
    graph = helper.make_graph(w.nodes, "isthmus_edge", g_in, g_out, w.inits)
    model_proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                    producer_name="isthmus converters/onnx_edge.py")
    model_proto.ir_version = IR_VERSION
    meta = {"source_producer": m.producer}
    meta.update(extra or {})
    helper.set_model_props(model_proto, {"isthmus.onnx": json.dumps(meta, sort_keys=True)})
    checker.check_model(model_proto)
    return model_proto


@dataclass
class OnnxSplitPart:
    """One cut of a split model as ONNX: `edge` computes what is sent to `cloud_part` (outputs named by
    `wire_inputs`); `post`, when the edge works on after the cloud's answer, takes the answer's tensors
    (`wire_outputs` order), then the model's inputs it reads, and computes the model's outputs."""
    cut: str
    cloud_part: str
    edge: object                 # onnx.ModelProto; outputs named by their wire names
    wire_inputs: List[str]
    wire_outputs: List[str]
    post: object = None          # onnx.ModelProto or None


def split_to_onnx(split: Union[bytes, str], cut: Optional[str] = None, batch: int = 1) -> OnnxSplitPart:
    """The edge part of one cut of an isthmus split model as ONNX (default: the first cut with a cloud part)."""
    info, c, m, remote = split_cut(split, cut, OnnxEdgeExportError)
    sp = {"model": info.get("model", ""), "cut": c["name"], "cloud_part": c["cloud_part"],
          "wire_inputs": c["inputs"], "wire_outputs": c["outputs"]}
    proto = edge_to_onnx(m, inputs=m.inputs, outputs=remote.inputs, output_names=c["inputs"], batch=batch,
                         extra={"split": sp, "role": "edge"})
    post = None
    if any(o not in remote.outputs for o in m.outputs):
        ops = _select(m, list(remote.outputs) + list(m.inputs), list(m.outputs))
        read = {i for k in ops for i in m.operators[k].inputs}
        post = edge_to_onnx(m, inputs=list(remote.outputs) + [e for e in m.inputs if e in read], outputs=m.outputs,
                            batch=batch, extra={"split": sp, "role": "post"})
    return OnnxSplitPart(c["name"], c["cloud_part"], proto, list(c["inputs"]), list(c["outputs"]), post)


__all__ = ["edge_to_onnx", "split_to_onnx", "OnnxSplitPart", "OnnxEdgeExportError", "SUPPORTED"]
