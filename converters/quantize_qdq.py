"""The quantization a QDQ model carries, for the edge quantizer: QuantizeLinear -> DequantizeLinear pairs
folded away (their scale and zero point kept per tensor), DequantizeLinear of constant weights and biases
folded into float constants (their integer scales kept per constant), and the checks that the edge's int8
conventions (int8 activations per tensor, symmetric weights per output channel) hold for those numbers."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from isthmus.core.graph import Graph, Node, Tensor
from isthmus.core.passes import Rewrite, freeze
from isthmus.core.passes.fusion import Builder

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


@dataclass
class ConstQuant:
    """A constant's integer form in the QDQ file: scale and zero point (scalars or per `axis`)."""
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int
    node: str  # the DequantizeLinear that gave it, for messages


@dataclass
class QdqParams:
    """Per tensor name of the stripped graph: activations (scale, int8 zero point), constants ConstQuant."""
    activations: Dict[str, Tuple[float, int]] = field(default_factory=dict)
    constants: Dict[str, ConstQuant] = field(default_factory=dict)
    source: Dict[str, str] = field(default_factory=dict)  # activation tensor -> the QuantizeLinear node

    def merged(self, other: Optional["QdqParams"]) -> "QdqParams":
        """These parameters, completed by `other`'s (ours win where both name a tensor)."""
        if other is None:
            return self
        return QdqParams({**other.activations, **self.activations}, {**other.constants, **self.constants},
                         {**other.source, **self.source})

    def with_aliases(self, aliases: Mapping[str, str]) -> "QdqParams":
        """A copy where tensor `new` also has the parameters of `old`, for each new -> old (a split's
        received tensors, which become placeholders of another name)."""
        act = dict(self.activations)
        act.update({new: act[old] for new, old in aliases.items() if old in act})
        src = dict(self.source)
        src.update({new: src[old] for new, old in aliases.items() if old in src})
        return QdqParams(act, dict(self.constants), src)


def has_qdq(nodes: Sequence[Node]) -> bool:
    """Whether a graph (its needed nodes) is in QDQ form."""
    return any(n.op in QDQ_OPS for n in nodes)


def _const(t: Tensor) -> Optional[np.ndarray]:
    return np.asarray(t.node.attrs["value"]) if t.node.op == "Const" else None


def _activation_params(q: Node) -> Tuple[float, int]:
    """(scale, zero point on the edge's int8 grid) of a per-tensor QuantizeLinear; uint8 shifts by 128."""
    s, z = _const(q.inputs[1]), _const(q.inputs[2])
    if s is None or z is None:
        raise ValueError(f"node '{q.name}' (QuantizeLinear): scale and zero point must be constants to go to "
                         "the edge as int8")
    if s.size != 1 or z.size != 1:
        raise ValueError(f"node '{q.name}' (QuantizeLinear): a scale per channel on an activation; the edge's "
                         "int8 activations have one scale per tensor")
    if z.dtype == np.uint8:
        return float(s.reshape(())), int(z.reshape(())) - 128
    if z.dtype == np.int8:
        return float(s.reshape(())), int(z.reshape(()))
    raise ValueError(f"node '{q.name}' (QuantizeLinear): {z.dtype} values; the edge's int8 kernels take int8 or "
                     "uint8 (shifted by 128) only")


def _pairs(g: Graph, fetched: set) -> Tuple[Dict[Node, Node], set]:
    """DequantizeLinear -> the QuantizeLinear it undoes (same constant scale and zero point), and the
    QuantizeLinear nodes that only such pairs read (they disappear)."""
    users: Dict[Tensor, List[Node]] = {}
    for n in g.nodes:
        for t in n.inputs:
            users.setdefault(t, []).append(n)
    pairs = {}
    for n in g.nodes:
        if n.op != "DequantizeLinear" or n.inputs[0].node.op != "QuantizeLinear":
            continue
        q = n.inputs[0].node
        same = all(_const(a) is not None and _const(b) is not None and np.array_equal(_const(a), _const(b))
                   for a, b in zip(q.inputs[1:], n.inputs[1:]))
        if not same:
            raise ValueError(f"node '{n.name}' (DequantizeLinear): its scale or zero point differs from those of "
                             f"'{q.name}' (QuantizeLinear) before it; a QDQ pair must share them")
        pairs[n] = q
    gone = {q for q in set(pairs.values())
            if q.outputs[0] not in fetched and all(u in pairs for u in users.get(q.outputs[0], []))}
    return pairs, gone


def strip_qdq(graph: Graph, fetches: Sequence[Tensor]) -> Tuple[Rewrite, QdqParams]:
    """`graph` without its QDQ pairs (a consumer of DequantizeLinear(QuantizeLinear(x)) reads x, whose
    parameters are kept; Relu(x) where the pair's range starts at 0, see _kept_floor) and with
    DequantizeLinear(constant) folded into a float constant (the integer scales kept under the constant's
    name). Other Quantize/DequantizeLinear nodes stay as they are."""
    pairs, gone = _pairs(graph, set(fetches))
    b, p = Builder(Rewrite(graph, list(fetches), [], {})), QdqParams()
    for n in graph.nodes:
        if n in gone:
            continue
        if n in pairs and all(_const(t) is not None for t in pairs[n].inputs):  # a QAT export's Q(weights)
            b.map[n.outputs[0]] = _fold_dequantize(b, n, p, _quantized(pairs[n]))
        elif n in pairs:
            x = b.map[pairs[n].inputs[0]]
            params = _activation_params(pairs[n])
            x = _kept_floor(b, x, params, pairs[n])
            old = p.activations.setdefault(x.name, params)
            if old != params:
                raise ValueError(f"tensor '{x.name}': quantized twice with different parameters ({old} in "
                                 f"'{p.source[x.name]}', {params} in '{pairs[n].name}')")
            p.source.setdefault(x.name, pairs[n].name)
            b.map[n.outputs[0]] = x
        elif n.op == "DequantizeLinear" and all(_const(t) is not None for t in n.inputs):
            b.map[n.outputs[0]] = _fold_dequantize(b, n, p)
        else:
            b.copy(n)
    return Rewrite(b.g, [b.map[t] for t in fetches], [], {"qdq_folded": len(pairs)}), p


_SIGN_KEEPING = ("MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "ExpandAxes", "StridedSlice")


def _non_negative(t: Tensor) -> bool:
    """Whether t is a Relu's output, or one moved or max-pooled from such (then no floor is needed)."""
    while t.node.op in _SIGN_KEEPING:
        t = t.node.inputs[0]
    return t.node.op in ("Relu", "Relu6") or (t.node.op in ("FusedConv2D", "FusedMatMul")
                                                and t.node.attrs.get("activation") in ("relu", "relu6"))


def _kept_floor(b: Builder, x: Tensor, params: Tuple[float, int], q: Node) -> Tensor:
    """x, or Relu(x) where the pair's range starts at exactly 0 (zero point at the bottom of the grid): a
    quantizer that drops a Relu before such a pair (onnxruntime's does) leaves the clamp to the pair, and
    the float graph without the pair must keep it. The edge's int8 output clamps there anyway (same bits)."""
    if params[1] != -128 or _non_negative(x):
        return x
    return b.g.add_node("Relu", [x], {}, name=x.node.name + "/qdq_floor", device=q.device).outputs[0]


def _quantized(q: Node) -> np.ndarray:
    """The integers QuantizeLinear makes of its constant input (round half to even, clipped to the dtype)."""
    w, s, z = (_const(t) for t in q.inputs)
    if q.attrs.get("block_size"):
        raise ValueError(f"node '{q.name}' (QuantizeLinear): blocked quantization; the edge's int8 kernels "
                         "take one scale per tensor or per output channel")
    axis = q.attrs["axis"] % max(w.ndim, 1)
    shape = [-1 if i == axis else 1 for i in range(w.ndim)] if s.size > 1 else [1] * w.ndim
    info = np.iinfo(z.dtype)
    v = np.rint(w / s.reshape(shape)).astype(np.int64) + z.reshape(shape).astype(np.int64)
    return np.clip(v, info.min, info.max).astype(z.dtype)


def _fold_dequantize(b: Builder, n: Node, p: QdqParams, q: Optional[np.ndarray] = None) -> Tensor:
    """DequantizeLinear of constant integers (`q`: those of a folded QuantizeLinear) as a float constant."""
    q, s, z = _const(n.inputs[0]) if q is None else q, _const(n.inputs[1]), _const(n.inputs[2])
    axis = n.attrs["axis"] % max(q.ndim, 1)
    if n.attrs.get("block_size"):
        raise ValueError(f"node '{n.name}' (DequantizeLinear): blocked quantization; the edge's int8 kernels "
                         "take one scale per tensor or per output channel")
    shape = [-1 if i == axis else 1 for i in range(q.ndim)] if s.size > 1 else [1] * q.ndim
    value = ((q.astype(np.float32) - z.reshape(shape).astype(np.float32)) * s.reshape(shape)).astype(s.dtype)
    t = b.g.add_node("Const", [], {"value": value}, name=n.name, device=n.device).outputs[0]
    zp = z.astype(np.int64).reshape(-1) - (128 if z.dtype == np.uint8 else 0)  # on the edge's int8 grid
    p.constants[t.name] = ConstQuant(s.astype(np.float64).reshape(-1), zp, axis, n.name)
    return t


def weight_scales(node: Node, wv: np.ndarray, axis: int, cq: ConstQuant) -> Tuple[np.ndarray, List[str]]:
    """The per-output-channel scales of `node`'s weights as the QDQ file gives them, and notes on what had
    to be requantized to meet the edge kernels' symmetric per-channel form (each named by node)."""
    notes, channels = [], wv.shape[axis]
    if cq.scale.size == 1:
        s_w = np.full(channels, float(cq.scale[0]))
    elif cq.axis == axis and cq.scale.size == channels:
        s_w = cq.scale.copy()
    else:
        raise ValueError(f"node '{node.name}' ({node.op}): weights quantized along axis {cq.axis} by "
                         f"'{cq.node}'; the edge's int8 kernels take a scale per output channel (axis {axis})")
    if np.any(cq.zero_point != 0):
        s_w = np.maximum(np.abs(wv).max(axis=tuple(i for i in range(wv.ndim) if i != axis)), 1e-12) / 127.0
        notes.append(f"node '{node.name}': weights of '{cq.node}' have nonzero zero points; requantized to "
                     "symmetric int8 (zero point 0, scale max|w|/127 per output channel)")
    else:
        q = np.round(wv / s_w.reshape([-1 if i == axis else 1 for i in range(wv.ndim)]))
        if np.any(q < -127):
            notes.append(f"node '{node.name}': weights of '{cq.node}' at -128 are clipped to -127 (the edge's "
                         "int8 weights are symmetric)")
    return s_w, notes


def bias_note(node: Node, bias: Tensor, s_in: float, s_w: np.ndarray, p: QdqParams) -> Optional[str]:
    """A note when the QDQ file's bias scale is not input scale x weight scale (the edge's int32 bias is)."""
    cq = p.constants.get(bias.name)
    if cq is None:
        return None
    want = s_in * s_w
    have = np.broadcast_to(cq.scale, want.shape)
    if np.any(cq.zero_point != 0) or not np.allclose(have, want, rtol=1e-5, atol=0):
        return (f"node '{node.name}': bias of '{cq.node}' has scale {have.tolist()} (zero points "
                f"{cq.zero_point.tolist()}), not input x weight scale {want.tolist()}; requantized to the latter")
    return None


def warn_notes(notes: Sequence[str]) -> None:
    for note in notes:
        warnings.warn("QDQ quantization: " + note, RuntimeWarning, stacklevel=3)


def missing_error(t: Tensor, user: Node) -> ValueError:
    return ValueError(f"tensor '{t.name}' (read or written by int8 node '{user.name}', {user.op}) has no scale "
                      "and zero point in the QDQ model and no calibration data was given: add a "
                      "QuantizeLinear/DequantizeLinear pair on it, pass calibration data, or run such nodes in "
                      "float as the QDQ model does (unquantized='fp32'; isthmus quantize --unquantized fp32)")


def fp32_graph(session, outputs: Sequence[Tensor]) -> Tuple[Graph, List[Tensor], QdqParams]:
    """The float model a QDQ model quantizes (variables frozen, the QDQ pairs folded away), its outputs,
    and the parameters the pairs gave: what a planner prices and a cloud part runs."""
    outs = [session.graph.tensor(o) if isinstance(o, str) else o for o in outputs]
    frozen = freeze(session, outs)
    rw, params = strip_qdq(frozen, [frozen.tensor(t.name) for t in outs])
    return rw.graph, list(rw.fetches), params
