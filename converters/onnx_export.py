"""Export an inference graph to ONNX (`to_onnx`), one handler per isthmus op.

Variables are frozen to initializers first (pass a Session, or a graph without variables).
The model targets opset 17 and IR version 10 by default, which onnxruntime 1.17+ loads.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np

from isthmus.core import dtypes as _dt
from isthmus.core.errors import GraphError
from isthmus.core.executor import prune
from isthmus.core.graph import Graph, Node, Tensor
from isthmus.core.ops.array import squeeze_axes
from isthmus.core.passes import freeze, optimize as run_passes

OPSET = 17
IR_VERSION = 10


class ExportError(GraphError):
    """The graph holds ops that have no ONNX form (all of them are listed)."""


def _onnx():
    import onnx  # deferred: onnx is a heavy or optional dependency
    from onnx import TensorProto, helper, numpy_helper  # deferred: onnx is a heavy or optional dependency
    return onnx, TensorProto, helper, numpy_helper


class _Ctx:
    def __init__(self, helper, numpy_helper):
        self.h, self.nh = helper, numpy_helper
        self.nodes: List = []
        self.inits: List = []
        self.names: Dict[Tensor, str] = {}
        self._n = 0

    def name(self, t: Tensor) -> str:
        return self.names[t]

    def fresh(self, base: str) -> str:
        self._n += 1
        return f"{base}__{self._n}"

    def const(self, value, base: str = "c") -> str:
        n = self.fresh(base)
        self.inits.append(self.nh.from_array(np.asarray(value), n))
        return n

    def node(self, op: str, ins: Sequence[str], outs: Sequence[str], **attrs) -> None:
        self.nodes.append(self.h.make_node(op, list(ins), list(outs), **attrs))


Handler = Callable[[_Ctx, Node, List[str], List[str]], None]
_HANDLERS: Dict[str, Handler] = {}


def handler(*ops: str):
    def deco(f: Handler) -> Handler:
        for op in ops:
            _HANDLERS[op] = f
        return f
    return deco


def exportable_ops() -> List[str]:
    return sorted(_HANDLERS)


_SAME = {"Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "Div", "Pow": "Pow", "Maximum": "Max", "Minimum": "Min",
         "Neg": "Neg", "Abs": "Abs", "Exp": "Exp", "Log": "Log", "Sqrt": "Sqrt", "Reciprocal": "Reciprocal",
         "Tanh": "Tanh", "Sigmoid": "Sigmoid", "Erf": "Erf", "Floor": "Floor", "Ceil": "Ceil", "Relu": "Relu",
         "Sign": "Sign", "Equal": "Equal", "Less": "Less", "LessEqual": "LessOrEqual", "Greater": "Greater",
         "GreaterEqual": "GreaterOrEqual", "LogicalAnd": "And", "LogicalOr": "Or", "LogicalNot": "Not",
         "Where": "Where", "Identity": "Identity", "StopGradient": "Identity", "Softmax": "Softmax",
         "LogSoftmax": "LogSoftmax", "Transpose": "Transpose", "Concat": "Concat", "Gather": "Gather",
         "Flatten": "Flatten", "Shape": "Shape"}


@handler(*_SAME)
def _same(c, n, ins, outs):
    attrs = {}
    if n.op in ("Softmax", "LogSoftmax", "Concat", "Gather", "Flatten"):
        attrs["axis"] = int(n.attrs["axis"])
    if n.op == "Transpose":
        perm = n.attrs["perm"]
        attrs["perm"] = list(perm) if perm is not None else list(range(len(n.inputs[0].shape)))[::-1]
    if n.op == "Shape":
        tmp = c.fresh("shape64")
        c.node("Shape", ins, [tmp])
        c.node("Cast", [tmp], outs, to=_onnx_dtype(n.attrs["out_type"]))
        return
    c.node(_SAME[n.op], ins, outs, **attrs)


def _onnx_dtype(d) -> int:
    from onnx import helper  # deferred: onnx is a heavy or optional dependency
    return helper.np_dtype_to_tensor_dtype(np.dtype(d))


@handler("Square")
def _square(c, n, ins, outs):
    c.node("Mul", [ins[0], ins[0]], outs)


@handler("Rsqrt")
def _rsqrt(c, n, ins, outs):
    t = c.fresh("sqrt")
    c.node("Sqrt", ins, [t])
    c.node("Reciprocal", [t], outs)


@handler("Relu6")
def _relu6(c, n, ins, outs):
    d = n.inputs[0].dtype
    c.node("Clip", [ins[0], c.const(np.array(0, d)), c.const(np.array(6, d))], outs)


@handler("LeakyRelu")
def _leaky(c, n, ins, outs):
    c.node("LeakyRelu", ins, outs, alpha=float(n.attrs["alpha"]))


@handler("Gelu")
def _gelu(c, n, ins, outs):  # opset 17 has no Gelu: 0.5 x (1 + erf(x / sqrt 2))
    if n.attrs["approximate"] != "none":
        raise ExportError(f"node '{n.name}': tanh-approximated Gelu has no opset-{OPSET} form")
    d = n.inputs[0].dtype
    a, b, e, f = (c.fresh(s) for s in ("gelu_a", "gelu_b", "gelu_e", "gelu_f"))
    c.node("Mul", [ins[0], c.const(np.array(1 / np.sqrt(2), d))], [a])
    c.node("Erf", [a], [b])
    c.node("Add", [b, c.const(np.array(1, d))], [e])
    c.node("Mul", [ins[0], e], [f])
    c.node("Mul", [f, c.const(np.array(0.5, d))], outs)


@handler("Cast")
def _cast(c, n, ins, outs):
    c.node("Cast", ins, outs, to=_onnx_dtype(n.attrs["dtype"]))


def _act(c, name: str, x: str, outs, dtype) -> None:
    if name == "none":
        c.node("Identity", [x], outs)
    elif name == "relu6":
        c.node("Clip", [x, c.const(np.array(0, dtype)), c.const(np.array(6, dtype))], outs)
    else:
        c.node({"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid"}[name], [x], outs)


@handler("MatMul", "FusedMatMul")
def _matmul(c, n, ins, outs):
    a, b = ins[0], ins[1]
    ra = len(n.inputs[0].shape)
    rb = len(n.inputs[1].shape)
    if n.attrs["transpose_a"]:
        t = c.fresh("ta")
        c.node("Transpose", [a], [t], perm=list(range(ra - 2)) + [ra - 1, ra - 2])
        a = t
    if n.attrs["transpose_b"]:
        t = c.fresh("tb")
        c.node("Transpose", [b], [t], perm=list(range(rb - 2)) + [rb - 1, rb - 2])
        b = t
    if n.op == "MatMul":
        c.node("MatMul", [a, b], outs)
        return
    p, q = c.fresh("mm"), c.fresh("bias")
    c.node("MatMul", [a, b], [p])
    c.node("Add", [p, ins[2]], [q])
    _act(c, n.attrs["activation"], q, outs, n.outputs[0].dtype)


def _bias_view(c, n: Node, bias: str, axis: int, rank: int) -> str:
    if axis % rank == rank - 1:
        return bias
    shape = [1] * rank
    shape[axis % rank] = -1
    t = c.fresh("bias_view")
    c.node("Reshape", [bias, c.const(np.array(shape[1:], np.int64))], [t])  # drop the batch axis
    return t


@handler("BiasAdd")
def _bias_add(c, n, ins, outs):
    rank = len(n.inputs[0].shape)
    c.node("Add", [ins[0], _bias_view(c, n, ins[1], n.attrs["axis"], rank)], outs)


@handler("Conv2D", "FusedConv2D")
def _conv(c, n, ins, outs):
    (t, b), (l, r) = n.attrs["pads"]
    attrs = dict(strides=list(n.attrs["strides"]), dilations=list(n.attrs["dilations"]), pads=[t, l, b, r],
                 group=int(n.attrs["groups"]), kernel_shape=list(n.inputs[1].shape[2:]))
    if n.op == "Conv2D":
        c.node("Conv", ins[:2], outs, **attrs)
        return
    y = c.fresh("conv")
    c.node("Conv", ins[:3], [y], **attrs)
    _act(c, n.attrs["activation"], y, outs, n.outputs[0].dtype)


@handler("MaxPool", "AvgPool")
def _pool(c, n, ins, outs):
    (t, b), (l, r) = n.attrs["pads"]
    attrs = dict(kernel_shape=list(n.attrs["ksize"]), strides=list(n.attrs["strides"]), pads=[t, l, b, r])
    if tuple(n.attrs["dilations"]) != (1, 1):
        attrs["dilations"] = list(n.attrs["dilations"])
    if n.op == "AvgPool":
        attrs["count_include_pad"] = 0
    c.node("MaxPool" if n.op == "MaxPool" else "AveragePool", ins, outs, **attrs)


@handler("GlobalAvgPool")
def _gap(c, n, ins, outs):
    if n.attrs["keepdims"]:
        c.node("GlobalAveragePool", ins, outs)
        return
    t = c.fresh("gap")
    c.node("GlobalAveragePool", ins, [t])
    c.node("Flatten", [t], outs, axis=1)


@handler("BatchNorm")
def _bn(c, n, ins, outs):
    if n.attrs["training"]:
        raise ExportError(f"node '{n.name}': batch_norm in training mode is not an inference op")
    axis = n.attrs["axis"] % len(n.inputs[0].shape)
    if axis != 1:
        raise ExportError(f"node '{n.name}': ONNX BatchNormalization normalises axis 1, not {axis}")
    c.node("BatchNormalization", ins, outs[:1], epsilon=float(n.attrs["epsilon"]))


@handler("LayerNorm")
def _ln(c, n, ins, outs):
    c.node("LayerNormalization", ins, outs, axis=int(n.attrs["axis"]), epsilon=float(n.attrs["epsilon"]))


@handler("Dropout")
def _dropout(c, n, ins, outs):
    c.node("Identity", ins, outs[:1])  # inference: dropout is the identity


@handler("Reshape")
def _reshape(c, n, ins, outs):
    c.node("Reshape", [ins[0], c.const(np.array(n.attrs["shape"], np.int64))], outs)


@handler("ExpandAxes")
def _unsqueeze(c, n, ins, outs):
    c.node("Unsqueeze", [ins[0], c.const(np.array(n.attrs["axes"], np.int64))], outs)


@handler("Squeeze")
def _squeeze(c, n, ins, outs):
    c.node("Squeeze", [ins[0], c.const(np.array(squeeze_axes(n), np.int64))], outs)


@handler("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")
def _reduce(c, n, ins, outs):
    rank = len(n.inputs[0].shape)
    axes = list(range(rank)) if n.attrs["axis"] is None else [a % rank for a in n.attrs["axis"]]
    keep = int(bool(n.attrs["keepdims"]))
    if n.op == "ReduceSum":
        c.node("ReduceSum", [ins[0], c.const(np.array(axes, np.int64))], outs, keepdims=keep)
    else:
        c.node(n.op, ins, outs, axes=axes, keepdims=keep)


@handler("ArgMax", "ArgMin")
def _arg(c, n, ins, outs):
    t = c.fresh("arg")
    c.node(n.op, ins, [t], axis=int(n.attrs["axis"]), keepdims=0)
    c.node("Cast", [t], outs, to=_onnx_dtype(n.attrs["output_type"]))


@handler("Split")
def _split(c, n, ins, outs):
    sizes = n.attrs["sizes"]
    if not sizes:
        c.node("Split", ins, outs, axis=int(n.attrs["axis"]))
    else:
        c.node("Split", [ins[0], c.const(np.array(sizes, np.int64))], outs, axis=int(n.attrs["axis"]))


@handler("Pad")
def _pad(c, n, ins, outs):
    p = n.attrs["paddings"]
    pads = [a for a, _ in p] + [b for _, b in p]
    d = n.inputs[0].dtype
    c.node("Pad", [ins[0], c.const(np.array(pads, np.int64)), c.const(np.array(n.attrs["constant_value"], d))],
           outs, mode=n.attrs["mode"])


@handler("StridedSlice")
def _strided(c, n, ins, outs):
    starts, ends, axes, steps, squeeze, unsq = [], [], [], [], [], []
    dim = out_axis = 0
    big = np.iinfo(np.int64).max
    for kind, a, b, s in n.attrs["spec"]:
        if kind == "new":
            unsq.append(out_axis)
            out_axis += 1
            continue
        if kind == "index":
            starts.append(a)
            ends.append(a + 1 if a != -1 else big)
            steps.append(1)
            squeeze.append(dim)
        else:
            st = 1 if s is None else s
            starts.append(a if a is not None else (0 if st > 0 else -1))
            ends.append(b if b is not None else (big if st > 0 else -big))
            steps.append(st)
            out_axis += 1
        axes.append(dim)
        dim += 1
    x = ins[0]
    if axes:
        t = c.fresh("slice")
        c.node("Slice", [x, c.const(np.array(starts, np.int64)), c.const(np.array(ends, np.int64)),
                         c.const(np.array(axes, np.int64)), c.const(np.array(steps, np.int64))], [t])
        x = t
    if squeeze:
        t = c.fresh("squeeze")
        c.node("Squeeze", [x, c.const(np.array(squeeze, np.int64))], [t])
        x = t
    if unsq:
        t = c.fresh("unsqueeze")
        c.node("Unsqueeze", [x, c.const(np.array(unsq, np.int64))], [t])
        x = t
    c.node("Identity", [x], outs)


@handler("Resize")
def _resize(c, n, ins, outs):
    a = n.attrs
    if a.get("antialias") and a["mode"] != "nearest":
        raise ExportError(f"node '{n.name}': an antialiased Resize has no opset-{OPSET} form (Resize-18 has)")
    if a["coordinate_mode"] not in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
        raise ExportError(f"node '{n.name}': Resize coordinate mode '{a['coordinate_mode']}' has no opset-{OPSET} form")
    x_shape = n.inputs[0].shape
    rank = len(x_shape)
    kw = dict(mode=a["mode"], coordinate_transformation_mode=a["coordinate_mode"])
    if a["mode"] == "nearest":
        kw["nearest_mode"] = a["nearest_mode"]
    if a["mode"] == "cubic":
        kw.update(cubic_coeff_a=float(a["cubic_coeff_a"]), exclude_outside=int(a["exclude_outside"]))
    if len(ins) > 1:  # run-time scales or sizes, for every axis
        if a["axes"] and tuple(a["axes"]) != tuple(range(rank)) or a["policy"] != "stretch":
            raise ExportError(f"node '{n.name}': run-time Resize of some axes (or keeping the aspect) has no "
                              f"opset-{OPSET} form")
        if a["param"] == "scales":
            t = c.fresh("scales")
            c.node("Cast", [ins[1]], [t], to=_onnx_dtype(np.dtype(np.float32)))
            c.node("Resize", [ins[0], "", t], outs, **kw)
        else:
            t = c.fresh("sizes")
            c.node("Cast", [ins[1]], [t], to=_onnx_dtype(np.dtype(np.int64)))
            c.node("Resize", [ins[0], "", "", t], outs, **kw)
        return
    if not a["scales"] and not any(s_ > 0 for s_ in a["sizes"]):
        c.node("Identity", ins[:1], outs)
        return
    if a["scales"] and not (a["sizes"] and any(s_ > 0 for s_ in a["sizes"])):
        c.node("Resize", [ins[0], "", c.const(np.array(a["scales"], np.float32))], outs, **kw)
        return
    sizes = [d if s_ <= 0 else s_ for s_, d in zip(a["sizes"], x_shape)]
    if any(d is None for d in sizes):
        raise ExportError(f"node '{n.name}': Resize keeps an axis of unknown size")
    if a["scales"] and any(int(np.floor(d * sc)) != sz for d, sc, sz in zip(x_shape, a["scales"], sizes)):
        raise ExportError(f"node '{n.name}': Resize with a kept aspect ratio has no opset-{OPSET} form")
    c.node("Resize", [ins[0], "", "", c.const(np.array(sizes, np.int64))], outs, **kw)


@handler("LSTMStep")
def _lstm_step(c, n, ins, outs):
    gx, h, cell, rt = ins
    z, zz = c.fresh("lstm_z"), c.fresh("lstm_zz")
    c.node("MatMul", [h, rt], [z])
    c.node("Add", [z, gx], [zz])
    gates = [c.fresh(k) for k in ("i", "o", "f", "g")]
    c.node("Split", [zz], gates, axis=1)
    i, o, f, g = (c.fresh(k) for k in ("si", "so", "sf", "tg"))
    for src, dst, op in zip(gates, (i, o, f, g), ("Sigmoid", "Sigmoid", "Sigmoid", "Tanh")):
        c.node(op, [src], [dst])
    fc, ig, tc = c.fresh("fc"), c.fresh("ig"), c.fresh("tc")
    c.node("Mul", [f, cell], [fc])
    c.node("Mul", [i, g], [ig])
    c.node("Add", [fc, ig], [outs[1]])
    c.node("Tanh", [outs[1]], [tc])
    c.node("Mul", [o, tc], [outs[0]])


def _onnx_rnn_input(c, n, ins, k: int, base: str, pad_zeros: bool = False) -> str:
    """Input k of a sequence op with ONNX's leading direction axis; a constant becomes an initializer
    (onnxruntime prepacks initializer weights). `pad_zeros`: a zero second half (LSTM's R bias)."""
    src = n.inputs[k].node
    if src.op == "Const":
        v = np.asarray(src.attrs["value"])
        return c.const((np.concatenate([v, np.zeros_like(v)]) if pad_zeros else v)[None], base)
    name = ins[k]
    if pad_zeros:
        zeros, name = c.fresh(f"{base}_zero"), c.fresh(f"{base}_padded")
        c.node("Sub", [ins[k], ins[k]], [zeros])
        c.node("Concat", [ins[k], zeros], [name], axis=0)
    out = c.fresh(base)
    c.node("Unsqueeze", [name, c.const(np.array([0], np.int64))], [out])
    return out


@handler("LSTMSequence", "GRUSequence")
def _rnn_sequence(c, n, ins, outs):
    """An ONNX LSTM (the summed bias in B's first half) or GRU of one direction."""
    lstm = n.op == "LSTMSequence"
    lens = ""
    first_state = 4
    if n.attrs["with_lens"]:  # ONNX sequence_lens is int32
        lens, first_state = ins[4], 5
        if n.inputs[4].dtype != np.int32:
            lens = c.fresh("rnn_lens")
            c.node("Cast", [ins[4]], [lens], to=_onnx_dtype(np.dtype(np.int32)))
    args = [ins[0], _onnx_rnn_input(c, n, ins, 1, "rnn_W"), _onnx_rnn_input(c, n, ins, 2, "rnn_R"),
            _onnx_rnn_input(c, n, ins, 3, "rnn_B", pad_zeros=lstm), lens]
    args += [_onnx_rnn_input(c, n, ins, k, f"rnn_state{k}") for k in range(first_state, len(ins))]
    raw = [c.fresh("rnn_Y"), c.fresh("rnn_Yh")] + ([c.fresh("rnn_Yc")] if lstm else [])
    attrs = {} if lstm else {"linear_before_reset": int(n.attrs["linear_before_reset"])}
    c.node("LSTM" if lstm else "GRU", args, raw, hidden_size=int(n.inputs[2].shape[1] or n.outputs[1].shape[1]),
           direction="reverse" if n.attrs["reverse"] else "forward", **attrs)
    c.node("Squeeze", [raw[0], c.const(np.array([1], np.int64))], [outs[0]])
    for src, dst in zip(raw[1:], outs[1:]):
        c.node("Squeeze", [src, c.const(np.array([0], np.int64))], [dst])


@handler("GRUStep")
def _gru_step(c, n, ins, outs):
    gx, h, rt, rbh = ins
    gxz, gxr, gxh = (c.fresh(k) for k in ("gxz", "gxr", "gxh"))
    c.node("Split", [gx], [gxz, gxr, gxh], axis=1)
    rz, rr, rh = (c.fresh(k) for k in ("rz", "rr", "rh"))
    c.node("Split", [rt], [rz, rr, rh], axis=1)

    def gate(gx_part, r_part, base):
        p_, s_, g_ = c.fresh(base + "_hr"), c.fresh(base + "_sum"), c.fresh(base)
        c.node("MatMul", [h, r_part], [p_])
        c.node("Add", [gx_part, p_], [s_])
        c.node("Sigmoid", [s_], [g_])
        return g_
    z, r = gate(gxz, rz, "z"), gate(gxr, rr, "r")
    rec, pre, cand = c.fresh("rec"), c.fresh("pre"), c.fresh("cand")
    if n.attrs["linear_before_reset"]:
        hr, hrb = c.fresh("hr"), c.fresh("hrb")
        c.node("MatMul", [h, rh], [hr])
        c.node("Add", [hr, rbh], [hrb])
        c.node("Mul", [r, hrb], [rec])
    else:
        rh_in = c.fresh("rh_in")
        c.node("Mul", [r, h], [rh_in])
        c.node("MatMul", [rh_in, rh], [rec])
    c.node("Add", [gxh, rec], [pre])
    c.node("Tanh", [pre], [cand])
    d, zd = c.fresh("h_minus_n"), c.fresh("z_d")
    c.node("Sub", [h, cand], [d])
    c.node("Mul", [z, d], [zd])
    c.node("Add", [cand, zd], outs)


@handler("SetRow")
def _set_row(c, n, ins, outs):
    """acc with row i replaced: ScatterND with index [[i]] and the row as a batch of one."""
    acc, idx, value = ins
    i64, ij, row = c.fresh("row_index"), c.fresh("row_index_2d"), c.fresh("row")
    c.node("Cast", [idx], [i64], to=_onnx_dtype(np.dtype(np.int64)))
    c.node("Reshape", [i64, c.const(np.array([1, 1], np.int64))], [ij])
    c.node("Unsqueeze", [value, c.const(np.array([0], np.int64))], [row])
    c.node("ScatterND", [acc, ij, row], outs)


@handler("ReshapeTo")
def _reshape_to(c, n, ins, outs):
    shape = c.fresh("shape64")
    c.node("Cast", [ins[1]], [shape], to=_onnx_dtype(np.dtype(np.int64)))
    c.node("Reshape", [ins[0], shape], outs, allowzero=0 if n.attrs["copy_zero"] else 1)


@handler("Range")
def _range(c, n, ins, outs):
    c.node("Range", ins, outs)


def to_onnx(source: Union[Graph, "object"], outputs: Sequence[Union[Tensor, str]], inputs: Optional[Sequence] = None,
            name: str = "isthmus", opset: int = OPSET, optimize: bool = True):
    """An onnx.ModelProto computing `outputs` from the graph's placeholders (or `inputs`).

    `source` is a Graph without variables, or a Session (its variables are frozen). With
    `optimize`, the graph passes run first (folded batch norm, fused conv/matmul + bias +
    activation), so the model is as lean as the plan isthmus itself would run.
    """
    onnx, TensorProto, helper, numpy_helper = _onnx()
    if hasattr(source, "graph") and hasattr(source, "run"):  # a Session: freeze its variables
        outs_t = [source.graph.tensor(o) if isinstance(o, str) else o for o in outputs]
        graph = freeze(source, outs_t)
        outs = [graph.tensor(t.name) for t in outs_t]
    else:
        graph = source
        outs = [graph.tensor(o) if isinstance(o, str) else o for o in outputs]
    ins = [graph.tensor(i) if isinstance(i, str) else i for i in (inputs or [])]
    if optimize:
        rw = run_passes(graph, prune([t.node for t in outs], set(ins)), outs, ins)
        graph, outs, ins = rw.graph, list(rw.fetches), list(rw.feeds)
    nodes = prune([t.node for t in outs], set(ins))
    bad: Dict[str, List[str]] = {}
    for n in nodes:
        if n.op in ("Const", "Placeholder") or n.op in _HANDLERS:
            continue
        bad.setdefault(n.op, []).append(n.name)
    if bad:
        raise ExportError("cannot export to ONNX: " + "; ".join(
            f"{op} x{len(v)} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})" for op, v in sorted(bad.items()))
            + (" (Variable: pass the Session so variables are frozen)" if "Variable" in bad else ""))
    c = _Ctx(helper, numpy_helper)
    graph_inputs = []
    for t in ins:
        c.names[t] = t.node.name
    for n in nodes:
        if n.op == "Placeholder" or any(t in ins for t in n.outputs):
            for t in n.outputs:
                c.names.setdefault(t, n.name if len(n.outputs) == 1 else f"{n.name}:{t.index}")
            continue
        if n.op == "Const":
            c.names[n.outputs[0]] = n.name
            c.inits.append(numpy_helper.from_array(np.asarray(n.attrs["value"]), n.name))
            continue
        for t in n.outputs:
            c.names[t] = n.name if t.index == 0 else f"{n.name}:{t.index}"
        _HANDLERS[n.op](c, n, [c.names[t] for t in n.inputs], [c.names[t] for t in n.outputs])
    for n in nodes:
        if n.op == "Placeholder":
            graph_inputs.append(n.outputs[0])
    graph_inputs = ins or graph_inputs

    def vi(t: Tensor, nm: str):
        dims = [d if d is not None else f"d{i}" for i, d in enumerate(t.shape)]
        return helper.make_tensor_value_info(nm, _onnx_dtype(t.dtype), dims)
    g = helper.make_graph(c.nodes, name, [vi(t, c.names[t]) for t in graph_inputs],
                          [vi(t, c.names[t]) for t in outs], c.inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="isthmus")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


@handler("Fill")
def _fill(c, n, ins, outs):
    shape = c.fresh("fill_shape")
    c.node("Cast", [ins[0]], [shape], to=_onnx_dtype(np.int64))
    value = c.nh.from_array(np.array([n.attrs["value"]], dtype=n.attrs["dtype"]), c.fresh("fill_value"))
    c.node("ConstantOfShape", [shape], outs, value=value)


from . import onnx_export_control, onnx_export_ops  # noqa: E402,F401  (While/If and the issue-20 ops; need the table above)
