"""ONNX LSTM, GRU and RNN, lowered onto core while_loop (one loop per direction, no unrolling).

The input projection of every time step is one GEMM before the loop; the loop body does only
the recurrent product and the gates. A reverse direction runs over the flipped sequence: with
per-example lengths `sequence_lens`, example b waits (state frozen, output zero) for T - len[b]
steps and then reads x[len[b]-1], ..., x[0], which is ONNX's reversal within each sequence;
flipping the per-step outputs back puts every output at its original time. Past its length an
example's state stops changing and its outputs are zero, as in onnxruntime.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np

import isthmus.core as ism
from isthmus.core.graph import Tensor
from isthmus.core.ops.control import set_row
from isthmus.core.ops.recurrent import gru_sequence, gru_step, lstm_sequence, lstm_step
from isthmus.core.rnn import zeros_state

from .onnx_import import ImportError_, _attrs, _s, handler

_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}


def _activation(where: str, name: str, alphas: List[float], betas: List[float]) -> Callable:
    """One ONNX RNN activation; those with parameters take the next alpha/beta in order."""
    key = name.lower()

    def take(lst, default):
        return float(lst.pop(0)) if lst else default
    if key == "sigmoid":
        return ism.sigmoid
    if key == "tanh":
        return ism.tanh
    if key == "relu":
        return ism.relu
    if key == "softsign":
        return lambda x: ism.div(x, ism.add(ism.abs(x), 1.0))
    if key == "softplus":
        return lambda x: ism.log(ism.add(ism.exp(x), 1.0))
    if key == "leakyrelu":
        a = take(alphas, 0.01)
        return lambda x: ism.leaky_relu(x, a)
    if key == "hardsigmoid":
        a, b = take(alphas, 0.2), take(betas, 0.5)
        return lambda x: ism.minimum(ism.maximum(ism.add(ism.mul(x, a), b), 0.0), 1.0)
    if key == "affine":
        a, b = take(alphas, 1.0), take(betas, 0.0)
        return lambda x: ism.add(ism.mul(x, a), b)
    if key == "scaledtanh":
        a, b = take(alphas, 1.0), take(betas, 1.0)
        return lambda x: ism.mul(ism.tanh(ism.mul(x, b)), a)
    raise ImportError_(f"{where}: activation '{name}' is not supported (Sigmoid, Tanh, Relu, LeakyRelu, "
                       "HardSigmoid, Affine, ScaledTanh, Softsign, Softplus are)")


def _activations(where: str, op: str, at, dirs: int) -> List[List[Callable]]:
    names = [_s(a) for a in at.get("activations", [])] or _DEFAULT_ACTS[op] * dirs
    per = len(_DEFAULT_ACTS[op])
    if len(names) == per and dirs == 2:
        names = names * 2
    if len(names) != per * dirs:
        raise ImportError_(f"{where}: {len(names)} activations for {dirs} direction(s); {op} needs {per} each")
    alphas, betas = list(at.get("activation_alpha", [])), list(at.get("activation_beta", []))
    fns = [_activation(where, n, alphas, betas) for n in names]
    return [fns[d * per:(d + 1) * per] for d in range(dirs)]


def _per_direction(c, node, k: int, t: Optional[Tensor], d: int) -> Optional[Tensor]:
    """Input k's slice for direction d: a constant slice when the input is known at import."""
    if t is None:
        return None
    name = node.input[k]
    if name in c.consts and t.node.op == "Const":  # not a trainable variable: slice it now
        return ism.constant(np.ascontiguousarray(c.consts[name][d]))
    return ism.gather(t, ism.constant(np.int32(d)))


class _Spec:
    """What one direction's loop needs; built by the handler, consumed by _direction."""
    __slots__ = ("op", "hidden", "reverse", "acts", "clip", "lbr", "input_forget", "want_y", "fused")


def _transposed(r: Tensor) -> Tensor:
    """R^T for the fused step ops: a constant is transposed once, now."""
    if r.node.op == "Const":
        return ism.constant(np.ascontiguousarray(np.asarray(r.node.attrs["value"]).T))
    return ism.transpose(r, (1, 0))


def _direction(s: _Spec, x, w, r, b, lens, h0, c0, p):
    """One direction over x [T, B, I] -> (y [T, B, H] or None, h [B, H], c [B, H] or None)."""
    hid = s.hidden
    if s.fused and all(t is None or t.node.op == "Const" for t in (w, r, b)):
        return _sequence(s, x, w, r, b, h0, c0, lens)
    if s.reverse:
        x = x[::-1]
    # the input part of every step at once: one [T*B, I] x [I, G*H] GEMM (numpy leaves BLAS for a
    # 3-D product with a transposed operand, about 10x slower), back to [T, B, G*H]
    dims_x = ism.shape(x, "int64")
    flat = ism.reshape(x, (-1, x.shape[-1])) if x.shape[-1] is not None else \
        ism.reshape_to(x, ism.concat([ism.constant(np.array([-1], np.int64)), dims_x[2:]], 0))
    xw = ism.reshape_to(ism.matmul(flat, _transposed(w)),
                        ism.concat([dims_x[:2], ism.constant(np.array([_GATES[s.op] * hid], np.int64))], 0))
    rb_h = None
    if b is not None:
        wb, rb = ism.split(b, 2, 0)
        if s.op == "GRU" and s.lbr:  # the hidden gate's recurrent bias sits inside r * (...)
            rb_zr, rb_h = ism.split(rb, [2 * hid, hid], 0)
            rb = ism.concat([rb_zr, ism.constant(np.zeros(hid, np.float32))], 0)
        xw = ism.add(xw, ism.add(wb, rb))
    dims = ism.shape(x, "int32")
    steps, batch = ism.gather(dims, ism.constant(np.int32(0))), ism.gather(dims, ism.constant(np.int32(1)))
    h0 = h0 if h0 is not None else zeros_state(batch, hid, "float32")
    states = [h0] + ([c0 if c0 is not None else zeros_state(batch, hid, "float32")] if s.op == "LSTM" else [])
    if s.fused:  # one LSTMStep / GRUStep node per time step
        rt = _transposed(r)
        rbh = rb_h if rb_h is not None else ism.constant(np.zeros(hid, np.float32))
    elif s.op == "GRU":
        r_zr, r_h = ism.split(r, [2 * hid, hid], 0)
    if p is not None:
        p_i, p_o, p_f = ism.split(p, 3, 0)
    lens = None if lens is None else ism.cast(lens, "int32")
    acc0 = ism.zeros(ism.concat([ism.expand_dims(steps, 0), ism.expand_dims(batch, 0),
                                 ism.constant(np.array([hid], np.int32))], 0), "float32") if s.want_y \
        else ism.constant(np.zeros((0, 0, hid), np.float32))  # Y unused: carry an empty accumulator

    def clip(v):
        return v if s.clip is None else ism.minimum(ism.maximum(v, -s.clip), s.clip)

    def cell(gx, h, c_prev):
        if s.fused:
            return lstm_step(gx, h, c_prev, rt) if s.op == "LSTM" else (gru_step(gx, h, rt, rbh, s.lbr), None)
        f, g = s.acts[0], s.acts[1] if len(s.acts) > 1 else None
        if s.op == "RNN":
            return f(clip(ism.add(gx, ism.matmul(h, r, transpose_b=True)))), None
        if s.op == "GRU":
            gxz, gxr, gxh = ism.split(gx, 3, 1)
            hz, hr = ism.split(ism.matmul(h, r_zr, transpose_b=True), 2, 1)
            z, rg = f(clip(ism.add(gxz, hz))), f(clip(ism.add(gxr, hr)))
            if s.lbr:
                rec = ism.mul(rg, ism.add(ism.matmul(h, r_h, transpose_b=True), rb_h) if rb_h is not None
                              else ism.matmul(h, r_h, transpose_b=True))
            else:
                rec = ism.matmul(ism.mul(rg, h), r_h, transpose_b=True)
            hh = g(clip(ism.add(gxh, rec)))
            return ism.add(ism.mul(ism.sub(1.0, z), hh), ism.mul(z, h)), None
        gi, go, gf, gc = ism.split(ism.add(gx, ism.matmul(h, r, transpose_b=True)), 4, 1)
        if p is not None:
            gi, gf = ism.add(gi, ism.mul(p_i, c_prev)), ism.add(gf, ism.mul(p_f, c_prev))
        i = f(clip(gi))
        fg = ism.sub(1.0, i) if s.input_forget else f(clip(gf))
        c_new = ism.add(ism.mul(fg, c_prev), ism.mul(i, g(clip(gc))))
        if p is not None:
            go = ism.add(go, ism.mul(p_o, c_new))
        return ism.mul(f(clip(go)), s.acts[2](c_new)), c_new

    n_st = len(states)

    def body(t, *carry):
        st, acc = list(carry[:n_st]), carry[n_st]
        h_new, c_new = cell(ism.gather(xw, t), st[0], st[1] if n_st > 1 else None)
        new = [h_new] + ([c_new] if n_st > 1 else [])
        out = h_new
        if lens is not None:
            tt = ism.sub(ism.sub(steps, 1), t) if s.reverse else t
            live = ism.expand_dims(ism.less(tt, lens), 1)
            new = [ism.where(live, a, o) for a, o in zip(new, st)]
            out = ism.where(live, h_new, ism.mul(h_new, 0.0))
        if s.want_y:
            acc = set_row(acc, t, out)
        return [ism.add(t, 1)] + new + [acc]

    res = ism.while_loop(lambda t, *cv: ism.less(t, steps), body,
                         [ism.constant(np.int32(0))] + states + [acc0],
                         shape_invariants=[()] + [(None, hid)] * n_st + [(None, None, hid)])
    y = res[-1] if s.want_y else None
    if y is not None and s.reverse:
        y = y[::-1]
    return y, res[1], (res[2] if n_st > 1 else None)


def _sequence(s: _Spec, x, w, r, b, h0, c0, lens):
    """Constant weights (an inference import): the whole direction is one LSTMSequence or
    GRUSequence node."""
    hid = s.hidden
    gates = _GATES[s.op]
    bv = np.zeros(2 * gates * hid, np.float32) if b is None else np.asarray(b.node.attrs["value"], np.float32)
    if s.op == "LSTM":
        y, h, cc = lstm_sequence(x, w, r, ism.constant(bv[:4 * hid] + bv[4 * hid:]), h0, c0, reverse=s.reverse,
                                 lens=lens)
    else:
        (y, h), cc = gru_sequence(x, w, r, ism.constant(bv), h0, reverse=s.reverse, linear_before_reset=s.lbr,
                                  lens=lens), None
    return (y if s.want_y else None), h, cc


def _recurrent(c, node, ins):
    op = node.op_type
    where = f"node '{node.name or op}' ({op})"
    at = _attrs(node)
    ins = list(ins) + [None] * (8 - len(ins))
    x, w, r, b, lens, h0, c0, p = ins
    if op != "LSTM" and any(t is not None for t in ins[6:]):
        raise ImportError_(f"{where}: takes at most 6 inputs")
    direction = _s(at.get("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ImportError_(f"{where}: unknown direction '{direction}'")
    dirs = 2 if direction == "bidirectional" else 1
    if "hidden_size" not in at:
        raise ImportError_(f"{where}: the hidden_size attribute is required")
    hid = int(at["hidden_size"])
    gates = _GATES[op]
    if len(x.shape) != 3 or len(w.shape) != 3 or len(r.shape) != 3:
        raise ImportError_(f"{where}: X, W and R must be rank 3, got {x.shape}, {w.shape}, {r.shape}")
    for nm, t, want in (("W", w, (dirs, gates * hid, x.shape[-1])), ("R", r, (dirs, gates * hid, hid))):
        if any(a is not None and b_ is not None and a != b_ for a, b_ in zip(t.shape, want)):
            raise ImportError_(f"{where}: {nm} has shape {t.shape}, expected {want}")
    layout = int(at.get("layout", 0))
    if layout:  # batch-major tensors: [B, T, I] in, [B, T, D, H] and [B, D, H] out
        x = ism.transpose(x, (1, 0, 2))
        h0 = None if h0 is None else ism.transpose(h0, (1, 0, 2))
        c0 = None if c0 is None else ism.transpose(c0, (1, 0, 2))
    acts = _activations(where, op, at, dirs)
    names = [_s(a).lower() for a in at.get("activations", [])]
    default_acts = not names or names == [a.lower() for a in _DEFAULT_ACTS[op]] * (len(names) // len(_DEFAULT_ACTS[op]))
    ys, hs, cs = [], [], []
    for d in range(dirs):
        s = _Spec()
        s.op, s.hidden, s.acts = op, hid, acts[d]
        s.reverse = direction == "reverse" or d == 1
        s.clip = float(at["clip"]) if "clip" in at else None
        s.lbr = bool(at.get("linear_before_reset", 0))
        s.input_forget = bool(at.get("input_forget", 0))
        s.want_y = bool(node.output) and bool(node.output[0])
        s.fused = (op in ("LSTM", "GRU") and default_acts and s.clip is None and not s.input_forget
                   and (op != "LSTM" or p is None))
        with ism.name_scope(f"dir{d}"):
            y, h, cc = _direction(s, x, _per_direction(c, node, 1, w, d), _per_direction(c, node, 2, r, d),
                                  _per_direction(c, node, 3, b, d), lens,
                                  None if h0 is None else ism.gather(h0, ism.constant(np.int32(d))),
                                  None if c0 is None else ism.gather(c0, ism.constant(np.int32(d))),
                                  _per_direction(c, node, 7, p, d))
        ys.append(y)
        hs.append(ism.expand_dims(h, 0))
        cs.append(None if cc is None else ism.expand_dims(cc, 0))
    y_h = hs[0] if dirs == 1 else ism.concat(hs, 0)  # [D, B, H]
    y_c = None if cs[0] is None else (cs[0] if dirs == 1 else ism.concat(cs, 0))
    y = None
    if ys[0] is not None:
        y = ism.concat([ism.expand_dims(v, 1) for v in ys], 1) if dirs == 2 else ism.expand_dims(ys[0], 1)
    if layout:
        y = None if y is None else ism.transpose(y, (2, 0, 1, 3))
        y_h = ism.transpose(y_h, (1, 0, 2))
        y_c = None if y_c is None else ism.transpose(y_c, (1, 0, 2))
    placeholder = y_h  # an output the model does not name: any tensor fills its slot
    outs = [y if y is not None else placeholder, y_h]
    if op == "LSTM":
        outs.append(y_c)
    return outs


_RNN_ATTRS = ("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "layout")
for _op in _GATES:
    handler(_op, 7, attrs=_RNN_ATTRS + {"LSTM": ("input_forget",), "GRU": ("linear_before_reset",)}.get(_op, ()))(
        _recurrent)
