"""Import ONNX models into isthmus graphs (`from_onnx`), one handler per ONNX op.

Handlers are chosen by opset: the highest version not above the model's. Initializers become
constants, or trainable variables with `trainable=True` (to fine-tune an imported model).
Unsupported ops are listed all at once, with counts and node names.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

import isthmus.core as ism
from isthmus.core.errors import GraphError
from isthmus.core.graph import Graph, Tensor


class ImportError_(GraphError):
    """The model cannot be imported (unsupported ops, malformed graph)."""


OnnxImportError = ImportError_

Handler = Callable[["_Ctx", object, List[Optional[Tensor]]], Sequence[Tensor]]
_HANDLERS: Dict[str, List[Tuple[int, Handler]]] = {}


def handler(op: str, since: int = 1):
    def deco(f: Handler) -> Handler:
        _HANDLERS.setdefault(op, []).append((since, f))
        _HANDLERS[op].sort(key=lambda p: p[0])
        return f
    return deco


def _pick(op: str, opset: int) -> Optional[Handler]:
    best = None
    for since, f in _HANDLERS.get(op, ()):
        if since <= opset:
            best = f
    return best


def supported_ops() -> List[str]:
    return sorted(_HANDLERS)


class _Ctx:
    def __init__(self, graph: Graph, consts: Dict[str, np.ndarray]):
        self.g = graph
        self.consts = consts  # names known at import time (initializers, Constant nodes, folded)

    def const_value(self, name: str, what: str, node) -> np.ndarray:
        if name not in self.consts:
            raise ImportError_(f"node '{node.name or node.op_type}' ({node.op_type}): {what} must be a constant "
                               f"(initializer or Constant), '{name}' is computed at run time")
        return self.consts[name]


def owned_constant(arr: np.ndarray, name: str) -> Tensor:
    """A Const over `arr` without the private copy `ism.constant` makes: importers own the arrays
    they read (or hold read-only views of the model file) and never write them. A 90 MB model is
    then imported without copying its weights a second time."""
    from isthmus.core.dtypes import as_dtype
    from isthmus.core.graph import get_default_graph
    from isthmus.core.ops.base import make
    if not isinstance(arr, np.ndarray) or arr.ndim == 0 or not arr.flags.c_contiguous \
            or as_dtype(arr.dtype) != arr.dtype:
        return ism.constant(arr, dtype=np.asarray(arr).dtype, name=name)
    arr.flags.writeable = False
    return make("Const", (), {"value": arr}, name=name, graph=get_default_graph()).outputs[0]


def _attrs(node) -> Dict[str, object]:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


# ---- elementwise ---------------------------------------------------------------------------------
_BINARY = {"Add": ism.add, "Sub": ism.sub, "Mul": ism.mul, "Div": ism.div, "Pow": ism.pow,
           "Equal": ism.equal, "Less": ism.less, "Greater": ism.greater, "LessOrEqual": ism.less_equal,
           "GreaterOrEqual": ism.greater_equal, "And": ism.logical_and, "Or": ism.logical_or}
_UNARY = {"Neg": ism.neg, "Abs": ism.abs, "Exp": ism.exp, "Log": ism.log, "Sqrt": ism.sqrt,
          "Reciprocal": ism.reciprocal, "Tanh": ism.tanh, "Sigmoid": ism.sigmoid, "Erf": ism.erf, "Relu": ism.relu,
          "Floor": ism.floor, "Ceil": ism.ceil, "Sign": ism.sign, "Not": ism.logical_not, "Identity": ism.identity}


def _binary(fn):
    def h(c, node, ins):
        a, b = ins
        if a.dtype != b.dtype:  # ONNX Pow allows mixed types
            b = ism.cast(b, a.dtype)
        if fn is ism.div and a.dtype.kind in "iu":
            return [_trunc_div(a, b)]
        return [fn(a, b)]
    return h


def _trunc_div(a, b):
    """ONNX integer Div truncates toward zero; numpy's // floors."""
    q = ism.floordiv(a, b)
    if a.dtype.kind == "u":
        return q
    zero = ism.constant(np.zeros((), a.dtype))
    inexact = ism.not_equal(ism.mod(a, b), zero)
    opposite = ism.not_equal(ism.less(a, zero), ism.less(b, zero))
    return ism.add(q, ism.cast(ism.logical_and(inexact, opposite), a.dtype))


for _op, _fn in _BINARY.items():
    handler(_op)(_binary(_fn))
for _op, _fn in _UNARY.items():
    handler(_op)((lambda f: lambda c, node, ins: [f(ins[0])])(_fn))


@handler("Max")
@handler("Min")
@handler("Sum")
def _variadic(c, node, ins):
    f = {"Max": ism.maximum, "Min": ism.minimum, "Sum": ism.add}[node.op_type]
    out = ins[0]
    for t in ins[1:]:
        out = f(out, t)
    return [out]


@handler("LeakyRelu")
def _leaky(c, node, ins):
    return [ism.leaky_relu(ins[0], _attrs(node).get("alpha", 0.01))]


@handler("Gelu", 20)
def _gelu(c, node, ins):
    return [ism.gelu(ins[0], "tanh" if _s(_attrs(node).get("approximate", "none")) == "tanh" else "none")]


@handler("Clip", 11)
def _clip(c, node, ins):
    x = ins[0]
    lo = ins[1] if len(ins) > 1 else None
    hi = ins[2] if len(ins) > 2 else None
    if lo is not None and hi is not None and lo.node.op == "Const" and hi.node.op == "Const":
        if float(lo.node.attrs["value"]) == 0.0 and float(hi.node.attrs["value"]) == 6.0:
            return [ism.relu6(x)]
    if lo is not None:
        x = ism.maximum(x, lo)
    if hi is not None:
        x = ism.minimum(x, hi)
    return [x]


@handler("Cast")
def _cast(c, node, ins):
    from onnx import helper
    return [ism.cast(ins[0], helper.tensor_dtype_to_np_dtype(_attrs(node)["to"]))]


@handler("Where")
def _where(c, node, ins):
    return [ism.where(*ins)]


@handler("Dropout")
def _dropout(c, node, ins):
    return [ism.identity(ins[0])] + ([ism.ones_like(ins[0]) > 0.0] if len(node.output) > 1 else [])


def _coerced_2d(fn):
    """Softmax before opset 13: over the flattened dims from `axis` (default 1), shape kept."""
    def h(c, node, ins):
        x = ins[0]
        rank = len(x.shape)
        axis = _attrs(node).get("axis", 1) % max(rank, 1)
        if axis == rank - 1:
            return [fn(x, -1)]
        flat = ism.flatten(x, axis)
        return [ism.reshape(fn(flat, -1), tuple(-1 if d is None else d for d in x.shape))]
    return h


handler("Softmax", 1)(_coerced_2d(ism.softmax))
handler("LogSoftmax", 1)(_coerced_2d(ism.log_softmax))


@handler("Softmax", 13)
def _softmax(c, node, ins):
    return [ism.softmax(ins[0], _attrs(node).get("axis", -1))]


@handler("LogSoftmax", 13)
def _log_softmax(c, node, ins):
    return [ism.log_softmax(ins[0], _attrs(node).get("axis", -1))]


# ---- products and convolutions ----------------------------------------------------------------
@handler("MatMul")
def _matmul(c, node, ins):
    a, b = ins
    if len(a.shape) == 1:
        a = ism.expand_dims(a, 0)
    if len(a.shape) >= 3 and len(b.shape) == 2 and a.shape[-1] is not None and b.shape[1] is not None:
        # [..., K] x [K, N] as one 2-D GEMM: numpy runs a stacked product as many small ones
        y = ism.matmul(ism.reshape(a, (-1, a.shape[-1])), b)
        lead = tuple(a.shape[:-1])
        if all(d is not None for d in lead):
            return [ism.reshape(y, lead + (b.shape[1],))]
        return [ism.reshape_to(y, ism.concat([ism.shape(a, "int64")[:-1],
                                              ism.constant(np.array([b.shape[1]], np.int64))], 0))]
    return [ism.matmul(a, b)]


@handler("Gemm")
def _gemm(c, node, ins):
    at = _attrs(node)
    y = ism.matmul(ins[0], ins[1], transpose_a=bool(at.get("transA", 0)), transpose_b=bool(at.get("transB", 0)))
    if at.get("alpha", 1.0) != 1.0:
        y = y * float(at["alpha"])
    if len(ins) > 2 and ins[2] is not None:
        bias = ins[2] if at.get("beta", 1.0) == 1.0 else ins[2] * float(at["beta"])
        y = ism.bias_add(y, bias) if len(bias.shape) == 1 and bias.shape[0] == y.shape[-1] else y + bias
    return [y]


def _conv_pads(at, spatial_in, kernel, strides, dilations):
    auto = _s(at.get("auto_pad", "NOTSET"))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for n, k, s, d in zip(spatial_in, kernel, strides, dilations):
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return tuple(out)
    if auto == "VALID":
        return ((0, 0), (0, 0))
    p = list(at.get("pads", [0, 0, 0, 0]))
    return ((p[0], p[2]), (p[1], p[3]))


@handler("Conv")
def _conv(c, node, ins):
    at = _attrs(node)
    x, w = ins[0], ins[1]
    if len(x.shape) != 4:
        raise ImportError_(f"node '{node.name}' (Conv): only 2-D convolutions (NCHW) are supported")
    strides = tuple(at.get("strides", [1, 1]))
    dil = tuple(at.get("dilations", [1, 1]))
    pads = _conv_pads(at, x.shape[2:], w.shape[2:], strides, dil)
    y = ism.conv2d(x, w, strides=strides, padding=pads, dilations=dil, groups=int(at.get("group", 1)))
    if len(ins) > 2 and ins[2] is not None:
        y = ism.bias_add(y, ins[2], axis=1)
    return [y]


def _pool(kind):
    def h(c, node, ins):
        at = _attrs(node)
        x = ins[0]
        k = tuple(at["kernel_shape"])
        s = tuple(at.get("strides", [1] * len(k)))
        d = tuple(at.get("dilations", [1] * len(k)))
        pads = _conv_pads(at, x.shape[2:], k, s, d)
        if at.get("ceil_mode", 0):  # extend the bottom/right padding so the last partial window counts
            grown = []
            for n_, kk, ss, dd, (a, b) in zip(x.shape[2:], k, s, d, pads):
                if n_ is None:
                    raise ImportError_(f"node '{node.name}': ceil_mode needs known spatial dims")
                eff = (kk - 1) * dd + 1
                out = -(-(n_ + a + b - eff) // ss) + 1
                if (out - 1) * ss >= n_ + a:
                    out -= 1
                grown.append((a, max(b, (out - 1) * ss + eff - n_ - a)))
            pads = tuple(grown)
        if kind == "avg" and at.get("count_include_pad", 0) and pads != ((0, 0), (0, 0)):
            x = ism.pad(x, ((0, 0), (0, 0)) + pads)
            pads = ((0, 0), (0, 0))
        f = ism.max_pool if kind == "max" else ism.avg_pool
        return [f(x, k, s, pads, dilations=d)]
    return h


handler("MaxPool")(_pool("max"))
handler("AveragePool")(_pool("avg"))


@handler("GlobalAveragePool")
def _gap(c, node, ins):
    return [ism.global_avg_pool(ins[0], keepdims=True)]


@handler("BatchNormalization", 9)
def _bn(c, node, ins):
    at = _attrs(node)
    return [ism.batch_norm(ins[0], *ins[1:5], epsilon=at.get("epsilon", 1e-5), training=False, axis=1)]


@handler("LayerNormalization", 17)
def _ln(c, node, ins):
    at = _attrs(node)
    beta = ins[2] if len(ins) > 2 and ins[2] is not None else ism.zeros_like(ins[1])
    return [ism.layer_norm(ins[0], ins[1], beta, axis=at.get("axis", -1), epsilon=at.get("epsilon", 1e-5))]


# ---- shapes ------------------------------------------------------------------------------------------
@handler("Reshape", 5)
def _reshape(c, node, ins):
    x = ins[0]
    allowzero = _attrs(node).get("allowzero", 0)
    if node.input[1] not in c.consts:  # a shape computed at run time
        return [ism.reshape_to(x, ins[1], copy_zero=not allowzero)]
    shape = [int(d) for d in c.const_value(node.input[1], "the shape", node)]
    if not allowzero:
        shape = [x.shape[i] if d == 0 and x.shape[i] is not None else d for i, d in enumerate(shape)]
        if 0 in shape:
            raise ImportError_(f"node '{node.name}' (Reshape): copies an unknown dim (0 in {shape})")
    return [ism.reshape(x, shape)]


@handler("Flatten")
def _flatten(c, node, ins):
    rank = len(ins[0].shape)
    axis = _attrs(node).get("axis", 1)
    return [ism.flatten(ins[0], axis + rank if axis < 0 else axis)]


@handler("Transpose")
def _transpose(c, node, ins):
    p = _attrs(node).get("perm")
    return [ism.transpose(ins[0], None if p is None else tuple(p))]


@handler("Concat")
def _concat(c, node, ins):
    return [ism.concat(ins, _attrs(node)["axis"])]


@handler("Split", 13)
def _split(c, node, ins):
    at = _attrs(node)
    axis = at.get("axis", 0)
    if len(node.input) > 1 and node.input[1]:
        if node.input[1] not in c.consts:  # sizes computed at run time
            return ism.split_sizes(ins[0], ins[1], len(node.output), axis)
        sizes = [int(s) for s in c.consts[node.input[1]]]
        return ism.split(ins[0], sizes, axis)
    n = at.get("num_outputs", len(node.output))
    size = ins[0].shape[axis]
    if size is not None and size % n:  # opset 18: equal chunks of ceil(size / n), the last one smaller
        chunk = -(-size // n)
        sizes = [min(chunk, size - k * chunk) for k in range(n)]
        if min(sizes) <= 0:
            raise ImportError_(f"node '{node.name}' (Split): {size} elements do not make {n} outputs")
        return ism.split(ins[0], sizes, axis)
    return ism.split(ins[0], n, axis)


@handler("Squeeze", 13)
def _squeeze(c, node, ins):
    if len(node.input) > 1 and node.input[1] and node.input[1] not in c.consts:
        return [ism.squeeze_dynamic(ins[0], ins[1])]  # axes computed at run time
    axes = None if len(node.input) < 2 or not node.input[1] else \
        tuple(int(a) for a in c.const_value(node.input[1], "axes", node))
    return [ism.squeeze(ins[0], axes)]


@handler("Unsqueeze", 13)
def _unsqueeze(c, node, ins):
    if node.input[1] not in c.consts:
        return [ism.expand_dynamic(ins[0], ins[1])]
    return [ism.expand_dims(ins[0], tuple(int(a) for a in c.const_value(node.input[1], "axes", node)))]


@handler("Slice", 10)
def _slice(c, node, ins):
    x = ins[0]
    if any(n and n not in c.consts for n in node.input[1:]):  # bounds computed at run time
        return [ism.slice_dynamic(x, *[t for t in ins[1:] if t is not None])
                if all(t is not None for t in ins[1:]) else
                ism.slice_dynamic(x, ins[1], ins[2], ins[3] if len(ins) > 3 else None, ins[4] if len(ins) > 4 else None)]
    vals = [c.const_value(n, what, node) if n else None for n, what in
            zip(list(node.input[1:]) + [""] * (5 - len(node.input)), ("starts", "ends", "axes", "steps"))]
    starts, ends, axes, steps = vals
    axes = list(range(len(starts))) if axes is None else [int(a) % len(x.shape) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    key = [slice(None)] * len(x.shape)
    big = 2 ** 62
    for a, s, e, st in zip(axes, starts, ends, steps):
        s, e = int(s), int(e)
        key[a] = slice(None if abs(s) >= big else s, None if abs(e) >= big else e, st)
    return [x[tuple(key)]]


@handler("Gather")
def _gather(c, node, ins):
    return [ism.gather(ins[0], ins[1], _attrs(node).get("axis", 0))]


@handler("Shape")
def _shape(c, node, ins):
    at = _attrs(node)
    s = ism.shape(ins[0], "int64")
    start, end = at.get("start", 0), at.get("end")
    if start or end is not None:
        s = s[start:end]
    return [s]


@handler("Pad", 11)
def _pad(c, node, ins):
    x = ins[0]
    p = [int(v) for v in c.const_value(node.input[1], "pads", node)]
    r = len(x.shape)
    value = 0
    if len(node.input) > 2 and node.input[2]:
        value = float(c.const_value(node.input[2], "the pad value", node))
    mode = _s(_attrs(node).get("mode", "constant"))
    return [ism.pad(x, list(zip(p[:r], p[r:])), mode, value)]


def _reduce(fn, kind):
    def h(c, node, ins):
        at = _attrs(node)
        axes = at.get("axes")
        keep, noop = bool(at.get("keepdims", 1)), bool(at.get("noop_with_empty_axes", 0))
        if len(node.input) > 1 and node.input[1]:
            if node.input[1] not in c.consts:  # axes computed at run time
                return [ism.reduce_dynamic(ins[0], ins[1], kind, keep, noop)]
            axes = [int(a) for a in c.consts[node.input[1]]]
        if not axes and noop:
            return [ism.identity(ins[0])]
        return [fn(ins[0], None if not axes else tuple(axes), keepdims=keep)]
    return h


@handler("ReduceSumSquare")
def _reduce_sum_square(c, node, ins):
    return _reduce(ism.reduce_sum, "sum")(c, node, [ism.square(ins[0])] + list(ins[1:]))


for _op, _fn, _kind in [("ReduceSum", ism.reduce_sum, "sum"), ("ReduceMean", ism.reduce_mean, "mean"),
                        ("ReduceMax", ism.reduce_max, "max"), ("ReduceMin", ism.reduce_min, "min")]:
    handler(_op)(_reduce(_fn, _kind))


@handler("ArgMax")
def _argmax(c, node, ins):
    at = _attrs(node)
    y = ism.argmax(ins[0], at.get("axis", 0))
    return [ism.expand_dims(y, at.get("axis", 0)) if at.get("keepdims", 1) else y]


@handler("Constant")
def _constant(c, node, ins):
    from onnx import numpy_helper
    at = node.attribute[0]
    if at.name != "value":
        raise ImportError_(f"node '{node.name}' (Constant): only the 'value' form is supported")
    v = numpy_helper.to_array(at.t)
    c.consts[node.output[0]] = v
    return [ism.constant(v)]


@handler("ConstantOfShape")
def _const_of_shape(c, node, ins):
    from onnx import numpy_helper
    v = numpy_helper.to_array(node.attribute[0].t) if node.attribute else np.zeros(1, np.float32)
    if node.input[0] not in c.consts:  # a shape computed at run time
        return [ism.fill(ins[0], v.reshape(-1)[0].item(), v.dtype)]
    shape = c.const_value(node.input[0], "the shape", node)
    arr = np.full([int(s) for s in shape], v.reshape(-1)[0], dtype=v.dtype)
    c.consts[node.output[0]] = arr
    return [ism.constant(arr)]


@handler("Range", 11)
def _range(c, node, ins):
    from isthmus.core.ops.arange import _count, arange
    if all(n in c.consts for n in node.input):  # known at import: a constant
        start, limit, delta = (np.asarray(c.consts[n]).reshape(()) for n in node.input)
        n = _count(start, limit, delta)
        arr = (np.arange(n, dtype=start.dtype) * delta + start).astype(start.dtype)
        c.consts[node.output[0]] = arr
        return [ism.constant(arr, dtype=arr.dtype)]
    return [arange(*(ism.reshape(t, ()) if t.shape != () else t for t in ins))]


@handler("Expand", 8)
def _expand(c, node, ins):
    shape = [int(s) for s in c.const_value(node.input[1], "the shape", node)]
    x = ins[0]
    target = np.broadcast_shapes(tuple(1 if d is None else d for d in x.shape), tuple(shape))
    return [ism.broadcast_to(x, target)]


# ---- the importer --------------------------------------------------------------------------------------
def from_onnx(model: Union[str, bytes, "object"], trainable: bool = False, graph: Optional[Graph] = None):
    """Import an ONNX model. Returns (graph, inputs, outputs): inputs maps ONNX input names to
    placeholders, outputs is the list of output tensors in the model's order."""
    import onnx
    from onnx import numpy_helper
    if isinstance(model, (str, bytes)) and not isinstance(model, bytes):
        model = onnx.load(model)
    elif isinstance(model, bytes):
        model = onnx.load_from_string(model)
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)
    g_onnx = model.graph
    missing: Dict[str, List[str]] = {}

    def scan(nodes) -> None:  # subgraphs (If/Loop bodies) included
        for n in nodes:
            if n.domain not in ("", "ai.onnx") or _pick(n.op_type, opset) is None:
                missing.setdefault(_text(f"{_text(n.domain) + '.' if n.domain else ''}{_text(n.op_type)}"), []).append(
                    _text(n.name or (n.output[0] if n.output else "?")))
            for a in n.attribute:
                if a.type == a.GRAPH:
                    scan(a.g.node)
    scan(g_onnx.node)
    if missing:
        raise ImportError_(f"cannot import (opset {opset}): " + "; ".join(
            f"{op} x{len(v)} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})" for op, v in sorted(missing.items()))
            + f". Supported: {', '.join(supported_ops())}")
    g = graph or Graph(seed=0)
    values: Dict[str, Tensor] = {}
    consts: Dict[str, np.ndarray] = {}
    with g.as_default():
        inits = {i.name for i in g_onnx.initializer}
        for init in g_onnx.initializer:
            try:
                arr = numpy_helper.to_array(init)
            except Exception as e:
                raise ImportError_(f"initializer '{init.name}' cannot be read: {type(e).__name__}: {e}") from None
            if arr.dtype == object or arr.dtype.kind not in "fiub":
                raise ImportError_(f"initializer '{init.name}' has unsupported dtype {arr.dtype}")
            consts[init.name] = arr
            if trainable and arr.dtype.kind == "f" and arr.ndim >= 1:
                values[init.name] = ism.Variable(arr, name=_clean(init.name))
            else:
                values[init.name] = owned_constant(arr, _clean(init.name))
        inputs = {}
        from onnx import helper
        for vi in g_onnx.input:
            if vi.name in inits:
                continue
            tt = vi.type.tensor_type
            try:
                dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
            except Exception:
                raise ImportError_(f"graph input '{vi.name}': unsupported element type {tt.elem_type}") from None
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            try:
                t = ism.placeholder(dtype, dims, name=_clean(vi.name))
            except (TypeError, ValueError) as e:
                raise ImportError_(f"graph input '{vi.name}': {e}") from None
            values[vi.name] = inputs[vi.name] = t
        c = _Ctx(g, consts)
        c.opset = opset
        _run_nodes(c, g_onnx.node, values)
        unknown_out = [o.name for o in g_onnx.output if o.name not in values]
        if unknown_out:
            raise ImportError_(f"graph outputs {unknown_out} are produced by no node")
        outputs = [values[o.name] for o in g_onnx.output]
    return g, inputs, outputs


def _run_nodes(c: "_Ctx", nodes, values) -> None:
    """Import `nodes` into the default graph (a cond or loop body when called for a subgraph),
    reading and writing `values` (name -> Tensor; a body sees its enclosing graph's names too)."""
    from isthmus.core.graph import get_default_graph
    g = get_default_graph()
    for k, n in enumerate(nodes):
        where = f"node {k} '{n.name or n.op_type}' ({n.op_type})"
        missing_in = [i for i in n.input if i and i not in values]
        if missing_in:
            raise ImportError_(f"{where}: input(s) {missing_in} are defined by no earlier node, initializer "
                               "or graph input (the model is malformed or not topologically sorted)")
        ins = [values[i] if i else None for i in n.input]
        with g.name_scope(_clean(n.name or n.op_type)):
            try:
                outs = list(_pick(n.op_type, c.opset)(c, n, ins, values) if n.op_type in _SUBGRAPH_OPS
                            else _pick(n.op_type, c.opset)(c, n, ins))
            except (ImportError_, ism.ShapeError, GraphError):
                raise
            except Exception as e:  # malformed attributes or inputs: say where, keep one error type
                raise ImportError_(f"{where}: {type(e).__name__}: {e}") from e
        if len(outs) < len([o for o in n.output if o]):
            raise ImportError_(f"{where}: declares {len(n.output)} outputs, the op makes {len(outs)}")
        for name, t in zip(n.output, outs):
            if name:
                values[name] = t


# ---- control flow: If -> cond, Loop -> while_loop --------------------------------------------------
_SUBGRAPH_OPS = {"If", "Loop"}


def _body(c, gp, values, bind):
    """A function building ONNX subgraph `gp` in the current (body) graph: `bind` names its formal
    inputs; outer names resolve through `values` and are captured by the body graph."""
    from collections import ChainMap

    def build(*args):
        from onnx import numpy_helper
        scope = ChainMap(dict(zip(bind, args)), values)
        for init in gp.initializer:  # a subgraph's own constants
            arr = numpy_helper.to_array(init)
            c.consts[init.name] = arr
            scope[init.name] = ism.constant(arr, dtype=arr.dtype, name=_clean(init.name))
        _run_nodes(c, gp.node, scope)
        missing = [o.name for o in gp.output if o.name not in scope]
        if missing:
            raise ImportError_(f"subgraph '{gp.name}': outputs {missing} are produced by no node")
        return [scope[o.name] for o in gp.output]
    return build


@handler("If", 11)
def _if(c, node, ins, values):
    at = _attrs(node)
    then_f, else_f = _body(c, at["then_branch"], values, []), _body(c, at["else_branch"], values, [])
    pred = ins[0]
    if pred.shape not in ((), (1,)):
        pred = ism.reshape(pred, ())
    out = ism.cond(pred, then_f, else_f)
    return out if isinstance(out, list) else [out]


@handler("Loop", 11)
def _loop(c, node, ins, values):
    at = _attrs(node)
    body = at["body"]
    n_state = len(ins) - 2
    if len(body.output) != 1 + n_state:
        raise ImportError_(f"node '{node.name}' (Loop): scan outputs are not supported "
                           f"({len(body.output) - 1 - n_state} found)")
    trip, cond0 = ins[0], ins[1]
    names = [i.name for i in body.input]  # iteration number, condition, state...
    build = _body(c, body, values, names)
    state = list(ins[2:])
    i0 = ism.constant(np.array(0, np.int64))
    go0 = cond0 if cond0 is not None else ism.constant(np.array(True))
    if go0.shape != ():
        go0 = ism.reshape(go0, ())
    limit = trip if trip is not None else ism.constant(np.array(np.iinfo(np.int64).max, np.int64))
    if limit.shape != ():
        limit = ism.reshape(limit, ())

    def cond_fn(i, go, *vs):
        return ism.logical_and(ism.less(i, limit), go)

    def body_fn(i, go, *vs):
        outs = build(i, go, *vs)
        go2 = outs[0] if outs[0].shape == () else ism.reshape(outs[0], ())
        return [i + np.int64(1), go2] + [ism.cast(o, v.dtype) for o, v in zip(outs[1:], vs)]
    invariants = [(), ()] + [tuple(None for _ in v.shape) for v in state]
    res = ism.while_loop(cond_fn, body_fn, [i0, go0] + state, shape_invariants=invariants)
    return res[2:]


def _text(v) -> str:
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)


def _clean(name) -> str:
    if isinstance(name, bytes):  # protobuf hands back bytes for a name that is not valid UTF-8
        name = name.decode("utf-8", errors="replace")
    out = "".join(ch if ch.isalnum() or ch in "_-." else "_" for ch in name)
    return out or "onnx"


from . import onnx_resize, onnx_rnn  # noqa: E402,F401  (register Resize, LSTM, GRU, RNN: need the table above)
from . import onnx_ops_elementwise, onnx_ops_indexing, onnx_ops_norm, onnx_ops_conv, onnx_ops_quant  # noqa: E402,F401,I001  (issue 20: the added ops' handlers)
