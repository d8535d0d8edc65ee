"""One step of an LSTM or GRU cell as one kernel (ONNX gate orders), for recurrent loops.

A loop body built from primitives runs about twenty graph nodes per time step; at small batch
the per-node cost dominates. These ops do the step's recurrent product and all its gates in a
dozen array calls on one [B, G*H] slab. The input projection `gx` (x_t W^T plus biases) is
computed for all steps before the loop and fed in; `rt` is the recurrent weight transposed
([H, G*H]). Gradients are fused kernels too (recomputing the gates from the inputs).

LSTMSequence runs a whole LSTM direction in one kernel (inference only): no executor step per
time step, one GEMM per step for the input projection, the recurrent product and the bias
together ([W | R | b] times [x_t; h; 1]), and the state kept transposed ([H, B]) so that each
gate is one contiguous block for numpy's elementwise passes. GRUSequence does the same for a GRU
(a second, [H, H] GEMM per step for the hidden gate's recurrent product).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import fmt, num_elements_est
from .base import convert, make
from .math import zeros_like
from .intra_op import serial_blas
from .recurrent_compiled import CompiledLSTM, compiled_pays

__all__ = ["lstm_step", "gru_step", "lstm_sequence", "gru_sequence"]


def _sigmoid_(xp, y):
    """sigmoid in place as 1 / (1 + exp(-y)): float32 exp is vectorised in numpy, tanh is not
    (about 1.5x faster here). exp overflows to inf for y < -88, and 1 / inf = 0 is exact."""
    with np.errstate(over="ignore"):
        xp.negative(y, out=y)
        xp.exp(y, out=y)
    y += 1
    xp.reciprocal(y, out=y)
    return y


def _check(node, gates: int):
    gx, h, rt = node.inputs[0], node.inputs[1], node.inputs[-1] if gates == 4 else node.inputs[2]
    if any(t.dtype.kind != "f" or t.dtype != gx.dtype for t in node.inputs):
        raise ShapeError(f"{node.op} needs float inputs of one dtype")
    if len(gx.shape) != 2 or len(h.shape) != 2 or len(rt.shape) != 2:
        raise ShapeError(f"{node.op}: gx, h and rt must be matrices, got {fmt(gx.shape)}, {fmt(h.shape)}, "
                         f"{fmt(rt.shape)}")
    hid = h.shape[1] if h.shape[1] is not None else rt.shape[0]
    if hid is not None:
        for t, want in ((gx, gates * hid), (rt, gates * hid)):
            if t.shape[1] is not None and t.shape[1] != want:
                raise ShapeError(f"{node.op}: {fmt(t.shape)} should have {want} columns ({gates} gates of {hid})")
        if rt.shape[0] is not None and rt.shape[0] != hid:
            raise ShapeError(f"{node.op}: rt {fmt(rt.shape)} should have {hid} rows")
    return gx, h


def _step_cost(gates):
    def cost(node):
        h = node.inputs[1]
        n = num_elements_est(h.shape)
        k = h.shape[1] or 1
        return Cost(2 * n * k * gates + 12 * n * gates, 4 * n * (gates + 2) + 4 * k * k * gates, 4 * n * 2)
    return cost


# ---- LSTM: gates i, o, f, c (ONNX order); c' = f c + i g, h' = o tanh(c') -----------------------------
def _infer_lstm(node):
    gx, h = _check(node, 4)
    return [(h.dtype, h.shape), (h.dtype, h.shape)]


def _lstm_gates(xp, gx, h, rt):
    z = h @ rt
    z += gx
    hid = h.shape[1]
    _sigmoid_(xp, z[:, :3 * hid])
    xp.tanh(z[:, 3 * hid:], out=z[:, 3 * hid:])
    return z, hid


def _kernel_lstm(node, ctx):
    xp = ctx.xp

    def run(gx, h, c, rt):
        z, hid = _lstm_gates(xp, gx, h, rt)
        i, o, f, g = z[:, :hid], z[:, hid:2 * hid], z[:, 2 * hid:3 * hid], z[:, 3 * hid:]
        c2 = f * c
        c2 += i * g
        h2 = xp.tanh(c2)
        h2 *= o
        return h2, c2
    return run


def _kernel_lstm_grad(node, ctx):
    xp = ctx.xp

    def run(gx, h, c, rt, dh2, dc2):
        z, hid = _lstm_gates(xp, gx, h, rt)
        i, o, f, g = z[:, :hid], z[:, hid:2 * hid], z[:, 2 * hid:3 * hid], z[:, 3 * hid:]
        c2 = f * c + i * g
        tc = xp.tanh(c2)
        dc_all = dc2 + dh2 * o * (1 - tc * tc)
        dz = xp.empty_like(z)
        dz[:, :hid] = dc_all * g * i * (1 - i)
        dz[:, hid:2 * hid] = dh2 * tc * o * (1 - o)
        dz[:, 2 * hid:3 * hid] = dc_all * c * f * (1 - f)
        dz[:, 3 * hid:] = dc_all * i * (1 - g * g)
        return dz, dz @ rt.T, dc_all * f, h.T @ dz
    return run


def _zeros_if_none(dy, like):
    return dy if dy is not None else zeros_like(like)


def _g_lstm(node, dys):
    dh2, dc2 = (_zeros_if_none(d, t) for d, t in zip(dys, node.outputs))
    return list(make("LSTMStepGrad", tuple(node.inputs) + (dh2, dc2)).outputs)


register(OpDef("LSTMStep", inputs=("gx", "h", "c", "rt"), infer=_infer_lstm, kernel=_kernel_lstm, grad=_g_lstm,
               cost=_step_cost(4), doc="One LSTM step (ONNX gates i, o, f, c): (h', c') from gx, h, c, R^T."))
register(OpDef("LSTMStepGrad", inputs=("gx", "h", "c", "rt", "dh2", "dc2"),
               infer=lambda node: [(t.dtype, t.shape) for t in node.inputs[:4]], kernel=_kernel_lstm_grad,
               cost=_step_cost(8)))


def lstm_step(gx, h, c, rt, name: Optional[str] = None):
    """(h', c') of one LSTM step: gx [B, 4H] = x_t W^T + biases, rt = R^T [H, 4H]."""
    out = make("LSTMStep", (convert(gx), convert(h), convert(c), convert(rt)), name=name).outputs
    return out[0], out[1]


# ---- GRU: gates z, r, h (ONNX order); h' = (1 - z) n + z h -----------------------------------------
def _infer_gru(node):
    gx, h = _check(node, 3)
    return [(h.dtype, h.shape)]


def _gru_forward(xp, gx, h, rt, rbh, lbr):
    hid = h.shape[1]
    zr = h @ rt[:, :2 * hid]
    zr += gx[:, :2 * hid]
    _sigmoid_(xp, zr)
    z, r = zr[:, :hid], zr[:, hid:]
    if lbr:
        hr = h @ rt[:, 2 * hid:]
        hr += rbh
        n = r * hr
    else:
        hr = None
        n = (r * h) @ rt[:, 2 * hid:]
    n += gx[:, 2 * hid:]
    xp.tanh(n, out=n)
    return z, r, n, hr, hid


def _kernel_gru(node, ctx):
    xp, lbr = ctx.xp, node.attrs["linear_before_reset"]

    def run(gx, h, rt, rbh):
        z, r, n, _, _ = _gru_forward(xp, gx, h, rt, rbh, lbr)
        out = h - n
        out *= z
        out += n
        return out
    return run


def _kernel_gru_grad(node, ctx):
    xp, lbr = ctx.xp, node.attrs["linear_before_reset"]

    def run(gx, h, rt, rbh, dh2):
        z, r, n, hr, hid = _gru_forward(xp, gx, h, rt, rbh, lbr)
        rt_h = rt[:, 2 * hid:]
        dan = dh2 * (1 - z) * (1 - n * n)  # through the candidate's tanh
        dh = dh2 * z
        dgx = xp.empty_like(gx)
        drt = xp.empty_like(rt)
        dgx[:, 2 * hid:] = dan
        if lbr:
            dr = dan * hr
            dhr = dan * r
            dh += dhr @ rt_h.T
            drt[:, 2 * hid:] = h.T @ dhr
            drbh = dhr.sum(axis=0)
        else:
            drh = dan @ rt_h.T
            dr = drh * h
            dh += drh * r
            drt[:, 2 * hid:] = (r * h).T @ dan
            drbh = xp.zeros_like(rbh)
        dzr = dgx[:, :2 * hid]
        dzr[:, :hid] = dh2 * (h - n) * z * (1 - z)
        dzr[:, hid:] = dr * r * (1 - r)
        dh += dzr @ rt[:, :2 * hid].T
        drt[:, :2 * hid] = h.T @ dzr
        return dgx, dh, drt, drbh
    return run


register(OpDef("GRUStep", inputs=("gx", "h", "rt", "rbh"), attrs={"linear_before_reset": False},
               infer=_infer_gru, kernel=_kernel_gru,
               grad=lambda node, dys: list(make("GRUStepGrad", tuple(node.inputs) + (dys[0],),
                                                dict(node.attrs)).outputs),
               cost=_step_cost(3), doc="One GRU step (ONNX gates z, r, h): h' from gx, h, R^T and the hidden "
                                       "gate's recurrent bias."))
register(OpDef("GRUStepGrad", inputs=("gx", "h", "rt", "rbh", "dh2"), attrs={"linear_before_reset": False},
               infer=lambda node: [(t.dtype, t.shape) for t in node.inputs[:4]], kernel=_kernel_gru_grad,
               cost=_step_cost(6)))


def gru_step(gx, h, rt, rbh, linear_before_reset: bool = False, name: Optional[str] = None) -> Tensor:
    """h' of one GRU step: gx [B, 3H] = x_t W^T + Wb (+ Rb of z, r, and of h unless
    linear_before_reset), rt = R^T [H, 3H], rbh the hidden gate's recurrent bias [H]."""
    return make("GRUStep", (convert(gx), convert(h), convert(rt), convert(rbh)),
                {"linear_before_reset": bool(linear_before_reset)}, name=name).outputs[0]


# ---- LSTMSequence: a whole direction in one kernel (inference) ------------------------------------------
def _split_rest(node):
    """(lens or None, [states]) from the inputs after x, w, r, b."""
    rest = list(node.inputs[4:])
    lens = rest.pop(0) if node.attrs["with_lens"] and rest else None
    if node.attrs["with_lens"] and lens is None:
        raise ShapeError(f"{node.op}: with_lens is set but no lengths input is given")
    if lens is not None and (lens.dtype.kind not in "iu" or len(lens.shape) != 1):
        raise ShapeError(f"{node.op}: sequence lengths must be an integer vector [B], got {lens.dtype} {fmt(lens.shape)}")
    return lens, rest


def _infer_sequence(node, rows: tuple, states_ok: tuple, states_doc: str, layout: str):
    """Shape inference shared by the sequence ops: x [T, B, I], w [rows[0]*H, I], r [rows[1]*H, H],
    b [rows[2]*H], then states [B, H] (as many as `states_ok` allows). -> (T, B, H), any unknown."""
    x, w, r, b = node.inputs[:4]
    lens, states = _split_rest(node)
    if len(states) not in states_ok:
        raise ShapeError(f"{node.op} takes {states_doc}, got {len(states)} state inputs")
    if any(t.dtype.kind != "f" or t.dtype != x.dtype for t in [x, w, r, b] + states):
        raise ShapeError(f"{node.op} needs float inputs of one dtype")
    if len(x.shape) != 3 or len(w.shape) != 2 or len(r.shape) != 2 or len(b.shape) != 1 \
            or any(len(t.shape) != 2 for t in states):
        raise ShapeError(f"{node.op}: {layout}; got {', '.join(fmt(t.shape) for t in node.inputs)}")
    hid = r.shape[1] if r.shape[1] is not None else next((t.shape[1] for t in states if t.shape[1] is not None), None)
    if hid is not None:
        for nm, t, k in zip("wrb", (w, r, b), rows):
            if t.shape[0] is not None and t.shape[0] != k * hid:
                raise ShapeError(f"{node.op}: {nm} {fmt(t.shape)} should have {k * hid} rows (hidden size {hid})")
        for t in states:
            if t.shape[1] is not None and t.shape[1] != hid:
                raise ShapeError(f"{node.op}: state {fmt(t.shape)} should have {hid} columns")
    if x.shape[2] is not None and w.shape[1] is not None and x.shape[2] != w.shape[1]:
        raise ShapeError(f"{node.op}: x {fmt(x.shape)} has {x.shape[2]} features, w {fmt(w.shape)} {w.shape[1]}")
    batch = x.shape[1] if x.shape[1] is not None else next((t.shape[0] for t in states if t.shape[0] is not None), None)
    return x.shape[0], batch, hid


def _infer_lstm_seq(node):
    t, batch, hid = _infer_sequence(node, (4, 4, 4), (0, 2), "h0 and c0 together or neither",
                                    "x [T, B, I], w [4H, I], r [4H, H], b [4H], h0 and c0 [B, H]")
    dt = node.inputs[0].dtype
    return [(dt, (t, batch, hid)), (dt, (batch, hid)), (dt, (batch, hid))]


def _unpack(rest, with_lens: bool, n_states: int):
    """(lens or None, [n_states states, None where absent]) from a sequence kernel's extra inputs."""
    lens = rest[0] if with_lens else None
    states = list(rest[1:] if with_lens else rest)
    return lens, states + [None] * (n_states - len(states))


def _lengths(xp, lens, batch: int, steps: int, reverse: bool):
    """Per step k, the examples it updates (ONNX sequence_lens): example b takes steps while the
    time it reads is below its length; a reverse direction reads times T-1, ..., 0, so it waits
    T - len[b] steps and then reads x[len[b] - 1], ..., x[0]. None when every step updates all."""
    if lens is None:
        return None
    lens = xp.asarray(lens).astype(np.int64)
    if lens.shape != (batch,):
        raise ValueError(f"sequence lengths of shape {lens.shape} for a batch of {batch}")
    times = xp.arange(steps)[::-1] if reverse else xp.arange(steps)
    return times[:, None] < lens[None, :]  # [T, B] in the order the steps run


def _freeze(xp, live, new, old, y_k):
    """Past its length an example keeps its state and outputs zeros: y_k = new * live, then the
    examples that are not live get their old state back in `new`."""
    xp.multiply(new, live, out=y_k)
    xp.copyto(new, old, where=~live)


def _kernel_lstm_seq(node, ctx):
    xp, reverse = ctx.xp, node.attrs["reverse"]
    compiled = CompiledLSTM(reverse)

    def dispatch(x, w, r, b, *rest):
        lens, (h0, c0) = _unpack(rest, node.attrs["with_lens"], 2)
        if x.shape[0] and compiled_pays(xp, x.dtype, x.shape[1], r.shape[1], lens):
            return compiled(x, w, r, b, h0, c0)
        return serial_blas(xp, lambda: run(x, w, r, b, *rest))  # a small product per step: one BLAS thread

    def run(x, w, r, b, *rest):
        lens, (h0, c0) = _unpack(rest, node.attrs["with_lens"], 2)
        steps, batch, feat = x.shape
        if batch == 1 and lens is None and steps:
            return _lstm_one_example(xp, x, w, r, b, h0, c0, reverse)
        hid = r.shape[1]
        dt = x.dtype
        live = _lengths(xp, lens, batch, steps, reverse)
        ys = None if live is None else xp.empty((steps, hid, batch), dt)  # zeros past each length
        # s[k] = [x_t^T; h_k; 1] for the k-th step run: one GEMM per step, [W | R | b] x s[k], does the
        # input projection, the recurrent product and the bias at once; step k writes h_{k+1} into s[k+1]
        s = xp.empty((steps + 1, feat + hid + 1, batch), dt)
        xs = x[::-1] if reverse else x
        s[:steps, :feat] = xs.transpose(0, 2, 1)
        s[:, feat + hid] = 1
        s[0, feat:feat + hid] = 0 if h0 is None else h0.T
        c = xp.zeros((hid, batch), dt) if c0 is None else xp.array(c0.T, dtype=dt, order="C")
        if steps:
            # sigmoid gates' rows negated, so the GEMM yields -z and sigmoid is exp, +1, reciprocal
            wrb = xp.empty((4 * hid, feat + hid + 1), dt)
            xp.negative(w[:3 * hid], out=wrb[:3 * hid, :feat])
            xp.negative(r[:3 * hid], out=wrb[:3 * hid, feat:feat + hid])
            xp.negative(b[:3 * hid], out=wrb[:3 * hid, feat + hid])
            wrb[3 * hid:, :feat], wrb[3 * hid:, feat:feat + hid], wrb[3 * hid:, feat + hid] = \
                w[3 * hid:], r[3 * hid:], b[3 * hid:]
            z = xp.empty((4 * hid, batch), dt)
            tmp = xp.empty((hid, batch), dt)
            sig, g = z[:3 * hid], z[3 * hid:]
            i, o, f = z[:hid], z[hid:2 * hid], z[2 * hid:3 * hid]
            c_old = None if live is None else xp.empty_like(c)
            for k in range(steps):
                xp.matmul(wrb, s[k], out=z)
                with np.errstate(over="ignore"):  # exp(-z) -> inf for z < -88: 1 / inf = 0, exact
                    xp.exp(sig, out=sig)
                sig += 1
                xp.reciprocal(sig, out=sig)
                xp.tanh(g, out=g)
                if live is not None:
                    c_old[...] = c
                c *= f
                xp.multiply(i, g, out=tmp)
                c += tmp
                h = s[k + 1, feat:feat + hid]
                xp.tanh(c, out=h)
                h *= o
                if live is not None:
                    _freeze(xp, live[k], h, s[k, feat:feat + hid], ys[k])
                    xp.copyto(c, c_old, where=~live[k])
        y = (s[1:, feat:feat + hid] if ys is None else ys).transpose(0, 2, 1)  # [T, B, H] in step order: a view
        return (y[::-1] if reverse else y), s[steps, feat:feat + hid].T, c.T
    return dispatch


def _lstm_one_example(xp, x, w, r, b, h0, c0, reverse: bool):
    """Batch 1: every step is a matrix-vector product, bound by reading the weights, so the input
    projection of all steps is one GEMM up front and a step reads only R (2/3 of the bytes)."""
    steps, _, feat = x.shape
    hid = r.shape[1]
    dt = x.dtype
    neg = xp.ones((4 * hid, 1), dt)
    neg[:3 * hid] = -1  # sigmoid rows negated, as in the batched kernel
    rn = r * neg
    proj = (x[::-1] if reverse else x).reshape(steps, feat) @ (w * neg).T
    proj += b * neg[:, 0]  # [T, 4H]
    hs = xp.empty((steps + 1, hid), dt)
    hs[0] = 0 if h0 is None else h0[0]
    c = xp.zeros(hid, dt) if c0 is None else xp.array(c0[0], dtype=dt)
    z = xp.empty(4 * hid, dt)
    tmp = xp.empty(hid, dt)
    sig, g = z[:3 * hid], z[3 * hid:]
    i, o, f = z[:hid], z[hid:2 * hid], z[2 * hid:3 * hid]
    for k in range(steps):
        xp.dot(rn, hs[k], out=z)
        z += proj[k]
        with np.errstate(over="ignore"):
            xp.exp(sig, out=sig)
        sig += 1
        xp.reciprocal(sig, out=sig)
        xp.tanh(g, out=g)
        c *= f
        xp.multiply(i, g, out=tmp)
        c += tmp
        h = hs[k + 1]
        xp.tanh(c, out=h)
        h *= o
    y = hs[1:, None, :]  # [T, 1, H] in step order
    return (y[::-1] if reverse else y), hs[steps][None], c[None]


def _lstm_seq_cost(node):
    x, w = node.inputs[0], node.inputs[1]
    t, b, i = (d if d is not None else 1 for d in x.shape)
    g = w.shape[0] or 4
    h = g // 4
    return Cost(2 * t * b * g * (i + 1 + h) + 12 * t * b * g, 4 * (t * b * (i + g + h) + g * (i + h)), 4 * t * b * h)


register(OpDef("LSTMSequence", inputs=("x", "w", "r", "b", "*lens_state"), attrs={"reverse": False, "with_lens": False},
               infer=_infer_lstm_seq, kernel=_kernel_lstm_seq, cost=_lstm_seq_cost,
               doc="A whole LSTM direction (ONNX gates i, o, f, c; sigmoid/tanh/tanh), inference only: (y [T, B, H], "
                   "h_T, c_T) from x [T, B, I], W [4H, I], R [4H, H], the summed bias [4H], then (with_lens) the "
                   "lengths [B] and optional h0, c0. With reverse, steps run from the last time to the first and y "
                   "stays in time order; past its length an example keeps its state and outputs zeros."))


def lstm_sequence(x, w, r, b, h0=None, c0=None, reverse: bool = False, lens=None, name: Optional[str] = None):
    """(y, h_T, c_T) of a whole LSTM direction in one node (no gradient: for inference).

    x [T, B, I]; w = W [4H, I], r = R [4H, H] in ONNX gate order (i, o, f, c); b = Wb + Rb [4H];
    h0, c0 [B, H] (default zeros); lens [B] per-example lengths (ONNX sequence_lens)."""
    ins = [convert(x), convert(w), convert(r), convert(b)] + ([convert(lens)] if lens is not None else [])
    if (h0 is None) != (c0 is None):
        h0 = h0 if h0 is not None else zeros_like(c0)
        c0 = c0 if c0 is not None else zeros_like(h0)
    if h0 is not None:
        ins += [convert(h0), convert(c0)]
    out = make("LSTMSequence", tuple(ins), {"reverse": bool(reverse), "with_lens": lens is not None}, name=name).outputs
    return out[0], out[1], out[2]


# ---- GRUSequence: a whole direction in one kernel (inference) -------------------------------------------
def _infer_gru_seq(node):
    t, batch, hid = _infer_sequence(node, (3, 3, 6), (0, 1), "at most one state input (h0)",
                                    "x [T, B, I], w [3H, I], r [3H, H], b [6H], h0 [B, H]")
    dt = node.inputs[0].dtype
    return [(dt, (t, batch, hid)), (dt, (batch, hid))]


def _kernel_gru_seq(node, ctx):
    xp, reverse, lbr = ctx.xp, node.attrs["reverse"], node.attrs["linear_before_reset"]

    def run(x, w, r, b, *rest):
        lens, (h0,) = _unpack(rest, node.attrs["with_lens"], 1)
        steps, batch, feat = x.shape
        if batch == 1 and lens is None and steps:
            return _gru_one_example(xp, x, w, r, b, h0, reverse, lbr)
        hid = r.shape[1]
        dt = x.dtype
        live = _lengths(xp, lens, batch, steps, reverse)
        ys = None if live is None else xp.empty((steps, hid, batch), dt)
        s = xp.empty((steps + 1, feat + hid + 1, batch), dt)  # [x_t^T; h_k; 1], as in LSTMSequence
        s[:steps, :feat] = (x[::-1] if reverse else x).transpose(0, 2, 1)
        s[:, feat + hid] = 1
        s[0, feat:feat + hid] = 0 if h0 is None else h0.T
        if steps:
            h2 = 2 * hid
            wb, rb = b[:3 * hid], b[3 * hid:]
            # rows z, r (negated: sigmoid = 1 / (1 + exp)) from x, h and both biases; rows n from x and
            # Wb_n (+ Rb_n unless linear_before_reset); the hidden gate's recurrent product apart
            a = xp.zeros((3 * hid, feat + hid + 1), dt)
            xp.negative(w[:h2], out=a[:h2, :feat])
            xp.negative(r[:h2], out=a[:h2, feat:feat + hid])
            xp.negative(wb[:h2] + rb[:h2], out=a[:h2, feat + hid])
            a[h2:, :feat] = w[h2:]
            a[h2:, feat + hid] = wb[h2:] if lbr else wb[h2:] + rb[h2:]
            rh = xp.empty((hid, hid + 1), dt)  # [R_n | Rb_n] against [h; 1]
            rh[:, :hid] = r[h2:]
            rh[:, hid] = rb[h2:]
            z = xp.empty((3 * hid, batch), dt)
            tmp = xp.empty((hid, batch), dt)
            rec = xp.empty((hid, batch), dt)
            zr, n = z[:h2], z[h2:]
            zg, rg = z[:hid], z[hid:h2]
            for k in range(steps):
                xp.matmul(a, s[k], out=z)
                with np.errstate(over="ignore"):
                    xp.exp(zr, out=zr)
                zr += 1
                xp.reciprocal(zr, out=zr)
                h = s[k, feat:feat + hid]
                if lbr:  # n = tanh(x Wn + Wbn + r * (h Rn + Rbn))
                    xp.matmul(rh, s[k, feat:], out=rec)
                    rec *= rg
                else:  # n = tanh(x Wn + Wbn + Rbn + (r * h) Rn)
                    xp.multiply(rg, h, out=tmp)
                    xp.matmul(rh[:, :hid], tmp, out=rec)
                n += rec
                xp.tanh(n, out=n)
                nxt = s[k + 1, feat:feat + hid]  # h' = n + z (h - n)
                xp.subtract(h, n, out=nxt)
                nxt *= zg
                nxt += n
                if live is not None:
                    _freeze(xp, live[k], nxt, h, ys[k])
        y = (s[1:, feat:feat + hid] if ys is None else ys).transpose(0, 2, 1)
        return (y[::-1] if reverse else y), s[steps, feat:feat + hid].T
    return lambda *args: serial_blas(xp, lambda: run(*args))  # a small product per step: one BLAS thread


def _gru_one_example(xp, x, w, r, b, h0, reverse: bool, lbr: bool):
    """Batch 1, as _lstm_one_example: the input projection up front, matrix-vector products per step."""
    steps, _, feat = x.shape
    hid = r.shape[1]
    h2 = 2 * hid
    dt = x.dtype
    wb, rb = b[:3 * hid], b[3 * hid:]
    neg = xp.ones((3 * hid, 1), dt)
    neg[:h2] = -1  # z and r rows negated: sigmoid = 1 / (1 + exp)
    proj = (x[::-1] if reverse else x).reshape(steps, feat) @ (w * neg).T  # [T, 3H]
    bias = wb + rb if not lbr else xp.concatenate([wb[:h2] + rb[:h2], wb[h2:]])
    proj += bias * neg[:, 0]
    r_zr, r_n, rb_n = r[:h2] * neg[:h2], r[h2:], rb[h2:]
    hs = xp.empty((steps + 1, hid), dt)
    hs[0] = 0 if h0 is None else h0[0]
    zr = xp.empty(h2, dt)
    rec = xp.empty(hid, dt)
    for k in range(steps):
        h, p = hs[k], proj[k]
        xp.dot(r_zr, h, out=zr)
        zr += p[:h2]
        with np.errstate(over="ignore"):
            xp.exp(zr, out=zr)
        zr += 1
        xp.reciprocal(zr, out=zr)
        zg, rg = zr[:hid], zr[hid:]
        if lbr:
            xp.dot(r_n, h, out=rec)
            rec += rb_n
            rec *= rg
        else:
            xp.dot(r_n, rg * h, out=rec)
        rec += p[h2:]
        xp.tanh(rec, out=rec)  # n
        nxt = hs[k + 1]  # h' = n + z (h - n)
        xp.subtract(h, rec, out=nxt)
        nxt *= zg
        nxt += rec
    y = hs[1:, None, :]
    return (y[::-1] if reverse else y), hs[steps][None]


def _gru_seq_cost(node):
    x, w = node.inputs[0], node.inputs[1]
    t, b, i = (d if d is not None else 1 for d in x.shape)
    g = w.shape[0] or 3
    h = g // 3
    return Cost(2 * t * b * g * (i + 1 + h) + 10 * t * b * g, 4 * (t * b * (i + g + h) + g * (i + h)), 4 * t * b * h)


register(OpDef("GRUSequence", inputs=("x", "w", "r", "b", "*lens_state"),
               attrs={"reverse": False, "linear_before_reset": False, "with_lens": False},
               infer=_infer_gru_seq, kernel=_kernel_gru_seq, cost=_gru_seq_cost,
               doc="A whole GRU direction (ONNX gates z, r, h; sigmoid/tanh), inference only: (y [T, B, H], h_T) from "
                   "x [T, B, I], W [3H, I], R [3H, H], B = [Wb; Rb] [6H], then (with_lens) the lengths [B] and an "
                   "optional h0; lengths as in LSTMSequence."))


def gru_sequence(x, w, r, b, h0=None, reverse: bool = False, linear_before_reset: bool = False, lens=None,
                 name: Optional[str] = None):
    """(y, h_T) of a whole GRU direction in one node (no gradient: for inference).

    x [T, B, I]; w = W [3H, I], r = R [3H, H] in ONNX gate order (z, r, h); b = [Wb; Rb] [6H]; h0 [B, H];
    lens [B] per-example lengths (ONNX sequence_lens)."""
    ins = [convert(x), convert(w), convert(r), convert(b)] + ([convert(lens)] if lens is not None else []) \
        + ([convert(h0)] if h0 is not None else [])
    out = make("GRUSequence", tuple(ins), {"reverse": bool(reverse), "linear_before_reset": bool(linear_before_reset),
                                           "with_lens": lens is not None}, name=name).outputs
    return out[0], out[1]
