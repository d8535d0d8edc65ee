"""isthmus's GRUSequence, and an LSTMSequence TFLite's sequence LSTM cannot take (initial states given,
c_T read), as TFLite builtins unrolled over their (static) time steps, fp32.

TFLite has no GRU builtin (TensorFlow's converter unrolls a GRU or keeps it as a while loop of Flex
ops), so the writer writes the edge kernel's steps (edge/kernels_rnn.py; ONNX gate orders z, r, h and
i, o, f, c): one FULLY_CONNECTED projects every step's input at once (the input biases, and the
recurrent ones that sit outside r * (.), folded in), UNPACK cuts it per step, and a GRU step is
    z, r = SPLIT(LOGISTIC(p_zr + h R_zr^T))
    n    = TANH(p_n + (r * h) R_n^T)              or, linear_before_reset,  TANH(p_n + r * (h R_n^T + Rb_n))
    h'   = n + z * (h - n)
with the first step's recurrent products dropped when there is no initial state (h = 0, as the kernel
does). An LSTM step is i, o, f, g = SPLIT(p + h R^T); c' = sig(f) c + sig(i) tanh(g); h' = sig(o) tanh(c').
PACK gathers y in time order; h_T (c_T) is the last step's h (c). The file grows by about ten operators
a step, so sequences longer than MAX_STEPS are refused by node.
"""
from __future__ import annotations

import numpy as np

from .tflite_write_layout import Translator
from .tflite_write_ops import handles

MAX_STEPS = 512


class _Steps:
    """Small op writers over one GRU's scratch tensors (named after the node, numbered)."""

    def __init__(self, tr: Translator, name: str):
        self.tr, self.name, self.n = tr, name, 0

    def t(self, shape, out: int = -1) -> int:
        self.n += 1
        return self.tr.scratch(f"{self.name}/t{self.n}", np.float32, shape) if out < 0 else out

    def write(self, kind: str, ins, shape, opts: str = "", out: int = -1, **o) -> int:
        y = self.t(shape, out)
        if opts in ("AddOptions", "SubOptions", "MulOptions", "FullyConnectedOptions"):
            o.setdefault("FusedActivationFunction", 0)
        self.tr.b.op(kind, ins, [y], opts, **o)
        return y

    def fc(self, x: int, w: np.ndarray, bias, shape) -> int:
        self.n += 1
        wi = self.tr.b.const(f"{self.name}/w{self.n}", np.ascontiguousarray(w, np.float32))
        bi = -1 if bias is None else self.tr.b.const(f"{self.name}/b{self.n}", np.asarray(bias, np.float32))
        return self.write("FULLY_CONNECTED", [x, wi, bi], shape, "FullyConnectedOptions", KeepNumDims=False)


def _prologue(tr: Translator, op):
    """(x, steps, batch, hid, W, R, b, the step order, the _Steps writer) of a sequence op; refusals by node."""
    x, w_e, r_e, b_e = op.inputs[:4]
    what = op.op
    if tr.is_int8(x):
        raise tr.fail(f"an int8 {what} has no TFLite form here")
    w, r, b = (tr.const(e) for e in (w_e, r_e, b_e))
    if w is None or r is None or b is None:
        raise tr.fail(f"{what} weights computed at run time have no TFLite form (constant W, R, b only)")
    steps, batch, _ = tr.shape(x)
    if steps > MAX_STEPS:
        raise tr.fail(f"{steps} time steps: the writer unrolls a {what} over at most {MAX_STEPS}")
    w, r, b = (np.asarray(v, np.float32).reshape(tr.shape(e)) for v, e in ((w, w_e), (r, r_e), (b, b_e)))
    order = list(range(steps - 1, -1, -1)) if int(op.attrs.get("reverse", 0)) else list(range(steps))
    return x, steps, batch, tr.shape(r_e)[1], w, r, b, order, _Steps(tr, tr.m.tensors[op.outputs[0]].name)


def _per_step(s: _Steps, x: int, w: np.ndarray, bias: np.ndarray, steps: int, batch: int):
    """x W^T + bias for every step at once, cut into one [batch, units] tensor per step."""
    tr, feat, units = s.tr, w.shape[1], w.shape[0]
    flat_shape = tr.b.const(f"{s.name}/flat{units}", np.asarray([steps * batch, feat], np.int32))
    flat = s.write("RESHAPE", [tr.get(x), flat_shape], (steps * batch, feat))
    p = s.fc(flat, w, bias, (steps * batch, units))
    p3 = s.write("RESHAPE", [p, tr.b.const(f"{s.name}/steps{units}", np.asarray([steps, batch, units], np.int32))],
              (steps, batch, units))
    outs = [s.t((batch, units)) for _ in range(steps)]
    tr.b.op("UNPACK", [p3], outs, "UnpackOptions", Num=steps, Axis=0)
    return outs


def _state_outputs(tr: Translator, op, k: int, n: int):
    """The tensor the last step writes output n (h_T, c_T) into, or -1 when nothing reads it."""
    return tr.new(op.outputs[n]) if len(op.outputs) > n and tr.used(op.outputs[n]) and k == 0 else -1


@handles("GRUSequence")
def gru_sequence(tr: Translator, op) -> None:
    x, steps, batch, hid, w, r, b, order, s = _prologue(tr, op)
    lbr = bool(int(op.attrs.get("linear_before_reset", 0)))
    wb, rb, h2 = b[:3 * hid], b[3 * hid:], 2 * hid
    p_zr = _per_step(s, x, w[:h2], wb[:h2] + rb[:h2], steps, batch)
    p_n = _per_step(s, x, w[h2:], wb[h2:] if lbr else wb[h2:] + rb[h2:], steps, batch)
    h = tr.get(op.inputs[4]) if len(op.inputs) > 4 and op.inputs[4] >= 0 else None
    ys = {}
    for k, t in enumerate(order):
        h = ys[t] = _step(s, p_zr[t], p_n[t], h, r, rb, hid, batch, lbr, _state_outputs(tr, op, len(order) - 1 - k, 1))
    tr.b.op("PACK", [ys[t] for t in range(steps)], [tr.new(op.outputs[0])], "PackOptions", ValuesCount=steps, Axis=0)


def lstm_unrolled(tr: Translator, op) -> None:
    """An LSTMSequence with initial states or a read c_T, step by step (ONNX gate order i, o, f, c)."""
    x, steps, batch, hid, w, r, b, order, s = _prologue(tr, op)
    p = _per_step(s, x, w, b, steps, batch)
    states = [e for e in op.inputs[4:6] if e >= 0]
    h, c = (tr.get(states[0]), tr.get(states[1])) if len(states) == 2 else (None, None)
    bh, ys = (batch, hid), {}
    for k, t in enumerate(order):
        left = len(order) - 1 - k
        pre = p[t] if h is None else s.write("ADD", [p[t], s.fc(h, r, None, (batch, 4 * hid))], (batch, 4 * hid),
                                          "AddOptions")
        parts = [s.t(bh) for _ in range(4)]
        tr.b.op("SPLIT", [tr.b.const(f"{s.name}/gate_axis{s.n}", np.asarray(1, np.int32)), pre], parts,
                "SplitOptions", NumSplits=4)
        i, o, f = (s.write("LOGISTIC", [g], bh) for g in parts[:3])
        ig = s.write("MUL", [i, s.write("TANH", [parts[3]], bh)], bh, "MulOptions")
        c_out = _state_outputs(tr, op, left, 2)
        if c is not None:
            c = s.write("ADD", [s.write("MUL", [f, c], bh, "MulOptions"), ig], bh, "AddOptions", out=c_out)
        else:
            c = s.write("RESHAPE", [ig, tr.b.const(f"{s.name}/bh{s.n}", np.asarray(bh, np.int32))], bh, out=c_out)
        h = ys[t] = s.write("MUL", [o, s.write("TANH", [c], bh)], bh, "MulOptions", out=_state_outputs(tr, op, left, 1))
    tr.b.op("PACK", [ys[t] for t in range(steps)], [tr.new(op.outputs[0])], "PackOptions", ValuesCount=steps, Axis=0)


def _step(s: _Steps, p_zr: int, p_n: int, h, r: np.ndarray, rb: np.ndarray, hid: int, batch: int, lbr: bool,
          out: int) -> int:
    """One GRU step from h (None: zeros) to h' (into `out` when given)."""
    h2, bh = 2 * hid, (batch, hid)
    pre = p_zr if h is None else s.write("ADD", [p_zr, s.fc(h, r[:h2], None, (batch, h2))], (batch, h2), "AddOptions")
    zr = s.write("LOGISTIC", [pre], (batch, h2))
    z, rg = s.t(bh), s.t(bh)
    s.tr.b.op("SPLIT", [s.tr.b.const(f"{s.name}/gate_axis{s.n}", np.asarray(1, np.int32)), zr], [z, rg],
              "SplitOptions", NumSplits=2)
    if lbr:
        rec = s.tr.b.const(f"{s.name}/rb_n{s.n}", rb[h2:]) if h is None else s.fc(h, r[h2:], rb[h2:], bh)
        inner = s.write("ADD", [p_n, s.write("MUL", [rg, rec], bh, "MulOptions")], bh, "AddOptions")
    elif h is None:
        inner = p_n
    else:
        gated = s.write("MUL", [rg, h], bh, "MulOptions")
        inner = s.write("ADD", [p_n, s.fc(gated, r[h2:], None, bh)], bh, "AddOptions")
    n = s.write("TANH", [inner], bh)
    if h is None:                                   # h' = n - z n
        return s.write("SUB", [n, s.write("MUL", [z, n], bh, "MulOptions")], bh, "SubOptions", out=out)
    diff = s.write("SUB", [h, n], bh, "SubOptions")
    return s.write("ADD", [n, s.write("MUL", [z, diff], bh, "MulOptions")], bh, "AddOptions", out=out)
