"""Post-training int8 quantization into the edge format.

Calibration runs the (frozen, optimized) graph on representative feeds and records each
activation's range (min/max, or a percentile); activations become asymmetric per-tensor int8,
conv, transposed-conv and dense weights symmetric per-channel int8, biases int32 at scale s_in * s_w. Ops
without an int8 kernel stay fp32, with Quantize/Dequantize at their borders.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import isthmus.core as ism
import numpy as np

from isthmus.core.executor import prune
from isthmus.core.graph import Graph, Node, Tensor
from isthmus.core.passes import freeze, optimize
from isthmus.edge import capabilities
from isthmus.edge.format import scales_to_codes
from isthmus.edge.quant import quantize_multiplier
from isthmus.edge.writer import ModelWriter

from . import quantize_qdq as qdq_form
from .calibration import calibrate, calibration_feeds
from .edge_export import edge_refusal

SHORT_SCALE_BITS = 4  # significant bits of an activation scale under short_scales
INT8_OPS = capabilities.INT8  # the edge's table
SAME_QPARAMS = capabilities.SAME_QPARAMS


def _qparams(lo: float, hi: float, mantissa_bits: Optional[int] = None) -> Tuple[float, int]:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255.0 or 1e-8
    if mantissa_bits:  # rounded up to a few significant bits: at most 2^-(bits-1) coarser
        m, e = math.frexp(scale)
        scale = float(np.float32(math.ldexp(math.ceil(m * 2 ** mantissa_bits) / 2 ** mantissa_bits, e)))
    zp = int(np.clip(round(-128 - lo / scale), -128, 127))
    return scale, zp


def _pow2_scales(s_w: np.ndarray, s_in: float, s_out: float, anchored: bool = False) -> np.ndarray:
    """Per-channel scales S * 2^-e_c (S the largest), each the smallest such value at or above the
    channel's own max|w| / 127: at most 2x coarser than free scales, and the channels' requantization
    multipliers then share one mantissa, which the edge kernels turn into one multiplier for the
    whole tensor (edge.quant.UniformRequantizer). That arithmetic is exact while each channel's
    shift is at most 44, so e_c stops there (a channel of tiny weights then keeps a coarser scale);
    where even S's shift is beyond, the free scales stay. float32 throughout, as the file stores them."""
    s_w = s_w.astype(np.float32).astype(np.float64)
    top = float(np.float32(s_w.max()))
    if anchored:  # S = s_out 2^j: the multiplier s_in S / s_out is then s_in 2^j, s_in's few mantissa bits
        so = float(np.float32(s_out))
        j = math.ceil(math.log2(top / so))
        while math.ldexp(so, j - 1) >= top:
            j -= 1
        while math.ldexp(so, j) < top:
            j += 1
        top = math.ldexp(so, j)
    try:
        _, shift = quantize_multiplier(float(np.float32(s_in)) * top / float(np.float32(s_out)))
    except ValueError:  # EdgeModelError: a multiplier the kernels refuse whatever the scales
        return s_w
    if shift > 44:
        return s_w
    e = np.minimum(np.floor(np.log2(top / s_w)).astype(np.int64), 44 - shift)
    out = np.ldexp(top, -e)
    out = np.where(out < s_w, np.ldexp(top, -(e - 1)), out)  # guard the log's rounding: never below
    return out.astype(np.float32).astype(np.float64)


def _int8_ok(n: Node) -> bool:
    """Whether the edge's int8 kernels run `n` (its table, edge/capabilities.py)."""
    return capabilities.int8_refusal(n.op, n.attrs, [(t.dtype, t.shape) for t in n.inputs],
                                     [(t.dtype, t.shape) for t in n.outputs],
                                     [t.node.op == "Const" for t in n.inputs]) is None


def _const_qparams(t: Tensor, qdqp) -> Tuple[float, int]:
    """A float constant's per-tensor int8 parameters: the QDQ file's where it gives one pair, else its range."""
    cq = qdqp.constants.get(t.name)
    if cq is not None and cq.scale.size == 1 and -128 <= int(cq.zero_point[0]) <= 127:
        return float(cq.scale[0]), int(cq.zero_point[0])
    v = np.asarray(t.node.attrs["value"], np.float64)
    return _qparams(float(v.min(initial=0.0)), float(v.max(initial=0.0)))


def _same_qparams(nodes, int8: set, qp: dict, qdqp) -> None:
    """Ops whose int8 kernel keeps its input's quantization: every output takes the input's parameters
    (or the input an output's, where only that is known; a constant input, a Gather's table, its own).
    Where a QDQ file gives the two different parameters, the node leaves `int8` and runs fp32 between
    them: the file's numbers win."""
    for n in nodes:
        if n not in int8 or n.op not in SAME_QPARAMS:
            continue
        i = n.inputs[0]
        if i.node.op == "Const":
            qp[i] = _const_qparams(i, qdqp)
        for o in n.outputs:
            if o.name in qdqp.activations and i in qp and qp[i] != qp[o]:
                int8.discard(n)
            elif i in qp:
                qp[o] = qp[i]
            elif o in qp:
                qp[i] = qp[o]


def quantize_to_edge(session, outputs: Sequence[Union[Tensor, str]], calibration=None,
                     percentile: Optional[float] = None, batch: int = 1,
                     pow2_scales: bool = True, short_scales: bool = True, method: Optional[str] = None,
                     per_channel: bool = True, qdq: Optional[bool] = None,
                     qdq_params: Optional[qdq_form.QdqParams] = None,
                     unquantized: str = "error") -> Tuple[bytes, Dict[str, object]]:
    """(edge model bytes, report). `calibration`: the representative dataset, as feed dicts keyed by
    placeholder name or Tensor, arrays (one input), an array [N, ...] or an .npy/.npz file
    (calibration.calibration_feeds). method: "minmax" (default), "percentile" (at `percentile`,
    default 99.99; giving `percentile` alone means this) or "entropy" (KL). per_channel: a weight
    scale per output channel (default) or one per tensor.
    pow2_scales: conv weight scales per channel as S * 2^-e_c (see _pow2_scales): faster int8
    convolutions for at most one bit of weight resolution; False: each channel's own max|w| / 127.
    short_scales (with pow2_scales): activation scales rounded up to SHORT_SCALE_BITS significant
    bits and conv weight scales anchored on the output's scale, so a conv's requantization
    multiplier has a few-bit mantissa and the edge kernel requantizes in float32 alone; the other
    per-channel weight scales (dense layers) rounded up to 4 significant bits relative to the largest
    (at most 1/8 coarser), which the file stores in a byte per channel (edge.format.scales_to_codes).
    qdq: take scales and zero points from the model's own QuantizeLinear/DequantizeLinear pairs (a QDQ
    model, converters/quantize_qdq.py), folding the pairs away; None: when the graph has any. Calibration
    is then optional: it fills in only tensors the file leaves without parameters (an error names the
    first such tensor when none is given); pow2_scales and short_scales are off (the file's scales stay).
    qdq_params: parameters by tensor name from elsewhere (a split's part: those of the whole model,
    quantize_qdq.fp32_graph), for a graph whose QDQ pairs were already folded away.
    unquantized: what an int8-capable node reading or writing a tensor without parameters does: "error"
    (a ValueError naming the tensor) or "fp32" (it runs in float: a split's part cut where the file
    has no pair, e.g. between a conv and its bias)."""
    method = method or ("percentile" if percentile is not None else "minmax")
    outs0 = [session.graph.tensor(o) if isinstance(o, str) else o for o in outputs]
    frozen = freeze(session, outs0)
    outs0 = [frozen.tensor(t.name) for t in outs0]
    in_graph = qdq_form.has_qdq(prune([t.node for t in outs0], set()))
    qdq = (in_graph or qdq_params is not None) if qdq is None else qdq
    qdqp = qdq_form.QdqParams()
    if qdq:  # the file's scales are the model's: kept exactly, none of the speed-minded roundings
        if in_graph:
            srw, qdqp = qdq_form.strip_qdq(frozen, outs0)
            frozen, outs0 = srw.graph, list(srw.fetches)
        qdqp = qdqp.merged(qdq_params)
        pow2_scales = short_scales = False
    elif calibration is None:
        raise ValueError("quantize_to_edge: calibration data is needed (the model has no QDQ scales of its own)")
    pow2_scales = pow2_scales and per_channel
    short_scales = short_scales and pow2_scales
    rw = optimize(frozen, prune([t.node for t in outs0], set()), outs0, [])
    g: Graph = rw.graph
    outs = list(rw.fetches)
    nodes = prune([t.node for t in outs], set())
    floats = [t for n in nodes if n.op != "Const" for t in n.outputs if t.dtype == np.float32]
    int8 = {n for n in nodes if _int8_ok(n)}
    quantized = {t for n in int8 for t in list(n.inputs) + list(n.outputs) if t.node.op != "Const"}
    todo = [t for t in floats if t.name not in qdqp.activations]
    ranges: Dict[Tensor, Tuple[float, float]] = {}
    if calibration is not None and todo:
        names = [n.name for n in nodes if n.op == "Placeholder"]
        feeds = [{(g.tensor(k if ":" in k else k + ":0") if isinstance(k, str) else g.tensor(k.name)): v
                  for k, v in f.items()} for f in calibration_feeds(calibration, names)]
        ranges = calibrate(ism.Session(g, optimize=False), todo, feeds, method, percentile, keep=outs,
                           warn_for=quantized & set(todo))
    bits = SHORT_SCALE_BITS if short_scales else None
    qp: Dict[Tensor, Tuple[float, int]] = {t: _qparams(*ranges[t], bits) for t in ranges}
    qp.update({t: qdqp.activations[t.name] for t in floats if t.name in qdqp.activations})
    _same_qparams(nodes, int8, qp, qdqp)
    for n in nodes:
        ts = list(n.inputs) + list(n.outputs) if n in int8 else []
        lacking = [t for t in ts if t.node.op != "Const" and t.dtype == np.float32 and t not in qp]  # (not indices)
        if lacking and unquantized == "fp32":
            int8.discard(n)
        elif lacking:
            raise qdq_form.missing_error(lacking[0], n)
    notes: List[str] = []

    w = ModelWriter()
    fid: Dict[Tensor, int] = {}   # float edge tensor per graph tensor
    qid: Dict[Tensor, int] = {}   # int8 edge tensor per graph tensor

    def shape_of(t):
        return [batch if (d is None and k == 0) else (-1 if d is None else d) for k, d in enumerate(t.shape)]

    def as_float(t: Tensor) -> int:
        if t not in fid:
            i = w.add_tensor(t.node.name + "/dequant", np.float32, shape_of(t))
            w.add_operator("Dequantize", [qid[t]], [i])
            fid[t] = i
        return fid[t]

    def as_int8(t: Tensor) -> int:
        if t not in qid and t.node.op == "Const":  # a constant operand (an Add's bias): quantized once, here
            v = np.asarray(t.node.attrs["value"], np.float64)
            s, z = _const_qparams(t, qdqp)
            vq = np.clip(np.round(v / s) + z, -128, 127).astype(np.int8)
            qid[t] = w.add_constant(t.node.name + "/int8", vq, scale=[s], zero_point=[z])
        if t not in qid:
            s, z = qp[t]
            i = w.add_tensor(t.node.name + "/quant", np.int8, shape_of(t), scale=[s], zero_point=[z])
            w.add_operator("Quantize", [as_float(t)], [i])
            qid[t] = i
        return qid[t]

    def as_index(t: Tensor) -> int:  # an integer operand (a Gather's indices): as it is
        if t not in fid:
            fid[t] = w.add_constant(t.node.name, np.asarray(t.node.attrs["value"]))
        return fid[t]

    report = {"tensors": {}, "int8_ops": 0, "fp32_ops": 0}
    for n in nodes:
        if n.op == "Placeholder":
            fid[n.outputs[0]] = w.add_input(n.name, n.outputs[0].dtype, shape_of(n.outputs[0]))
            continue
        if n.op == "Const":
            continue
        if n in int8:
            report["int8_ops"] += 1
            ins = []
            if (n.op in ("Conv2D", "FusedConv2D", "MatMul", "FusedMatMul", "ConvTranspose2D")
                    and n.inputs[1].node.op == "Const"):
                x = n.inputs[0]
                wv = np.asarray(n.inputs[1].node.attrs["value"], np.float64)
                # the output channels: axis 0 of a conv's [O, C, kh, kw], axis 1 of a transposed conv's
                # [C, O/groups, kh, kw] (one scale per channel shared by the groups, as TFLite's int8
                # TRANSPOSE_CONV takes symmetric weights), the columns of a dense layer's [in, out]
                axis = 1 if n.op == "ConvTranspose2D" else 0 if n.op.endswith("Conv2D") or n.attrs.get("transpose_b") else 1
                red = tuple(i for i in range(wv.ndim) if i != axis)
                s_w = np.maximum(np.abs(wv).max(axis=red), 1e-12) / 127.0
                cq = qdqp.constants.get(n.inputs[1].name)
                if cq is not None:  # the file's own weight scales
                    s_w, more = qdq_form.weight_scales(n, wv, axis, cq)
                    notes += more
                elif qdq:  # e.g. a weight the file dequantizes before a Transpose that folding merged
                    notes.append(f"node '{n.name}': the QDQ model gives no scales for its weights "
                                 f"'{n.inputs[1].name}'; quantized per channel from their own range")
                elif not per_channel:  # one scale for the tensor, written per channel (the kernels' layout)
                    s_w = np.full_like(s_w, s_w.max())
                if pow2_scales and axis == 0:
                    s_w = _pow2_scales(s_w, qp[x][0], qp[n.outputs[0]][0], anchored=short_scales)
                elif short_scales:  # rounded up to 4 significant bits: one byte per channel in the file
                    s_w = scales_to_codes(s_w)[0].astype(np.float64)
                shp = [-1 if i == axis else 1 for i in range(wv.ndim)]
                wq = np.clip(np.round(wv / s_w.reshape(shp)), -127, 127).astype(np.int8)
                ins = [as_int8(x), w.add_constant(n.inputs[1].node.name + "/int8", wq, scale=s_w.tolist(),
                                                   zero_point=[], axis=axis)]  # zero points: empty, all zero
                if len(n.inputs) > 2:
                    s_in = qp[x][0]
                    bv = np.asarray(n.inputs[2].node.attrs["value"], np.float64) if n.inputs[2].node.op == "Const" else None
                    if bv is None:
                        raise ValueError(f"node '{n.name}': bias must be constant to quantize")
                    notes += [m for m in [qdq_form.bias_note(n, n.inputs[2], s_in, s_w, qdqp)] if m]
                    bq = np.round(bv / (s_in * s_w)).astype(np.int32)
                    # no quantization parameters: an int32 bias is s_in * s_w, zero point 0, by the kernels'
                    # convention (edge/int8_kernels.py); a scale per channel would cost 4 bytes each
                    ins.append(w.add_constant(n.inputs[2].node.name + "/int32", bq))
            else:  # (a MatMul of two activations: both per-tensor)
                index = capabilities.INDEX_INPUTS.get(n.op, ())
                ins = [as_index(t) if k in index else as_int8(t) for k, t in enumerate(n.inputs)
                       if k in index or t.dtype == np.float32]
            outs_q = []
            for t in n.outputs:
                s, z = qp[t]
                qid[t] = w.add_tensor(n.name if t.index == 0 else t.name, np.int8, shape_of(t), scale=[s],
                                      zero_point=[z])
                outs_q.append(qid[t])
            w.add_operator(n.op, ins, outs_q, capabilities.edge_attrs(n.op, n.attrs, interpreter=True))
        else:
            report["fp32_ops"] += 1
            why = edge_refusal(n)
            if why is not None:
                raise ValueError(f"node '{n.name}' ({n.op}) has no edge kernel: {why}")
            ins = []
            for t in n.inputs:
                if t.node.op == "Const":
                    if t not in fid:
                        fid[t] = w.add_constant(t.node.name, np.asarray(t.node.attrs["value"]))
                    ins.append(fid[t])
                else:
                    ins.append(as_float(t))
            produced = n.outputs[:1] if n.op == "BatchNorm" else n.outputs
            ids = [w.add_tensor(n.name if t.index == 0 else t.name, t.dtype, shape_of(t)) for t in produced]
            for t, i in zip(produced, ids):
                fid[t] = i
            w.add_operator(n.op, ins, ids, capabilities.edge_attrs(n.op, n.attrs, interpreter=True))
    for t in outs:
        w.mark_output(as_float(t) if t in qid and t not in fid else fid[t])
    for t in floats:
        if t in qp:
            lo, hi = ranges.get(t, (None, None))
            src = "qdq" if t.name in qdqp.activations else "calibration" if t in ranges else "derived"
            # derived: from the other side of an op that keeps its input's quantization (SAME_QPARAMS)
            report["tensors"][t.name] = {"min": lo, "max": hi, "scale": qp[t][0], "zero_point": qp[t][1],
                                         "source": src}
    qdq_form.warn_notes(notes)
    report["requantized"] = notes
    report["scales_from"] = ("qdq" if not ranges else "qdq+calibration") if qdq else "calibration"
    if qdq:
        w.metadata["quantization"] = "int8 from the model's QDQ scales" + (f" (with {method} calibration)"
                                                                          if ranges else "")
    else:
        w.metadata["quantization"] = f"int8 post-training ({method}" + (f" p{percentile}" if percentile else "") + \
            (", per-tensor weights)" if not per_channel else ")")
    return w.to_bytes(), report
