"""Fused recurrent edge kernels: LSTMSequence and GRUSequence run a whole direction in one kernel
(ONNX gate orders i, o, f, c and z, r, h, as core's ops of the same names), fp32.

The input projection of every step is one GEMM up front ([T B, I] x [I, G H], bias included);
a step is then one [B, H] x [H, G H] product and a few in-place passes over [B, G H]. The sigmoid
gates' rows are negated once, so sigmoid(z) is 1 / (1 + exp(-z)) as exp, +1, reciprocal in place.
Constant weights (the usual case) are rearranged once in prepare; weights computed at run time are
rearranged per call into scratch. Hidden states go straight into y; nothing is allocated per call.
With numba (edge/compiled.use_compiled) the steps after the projection are one compiled loop
(jit/rnn.py: the recurrent product and the gates, whose exps run vectorized), which pays no per-pass
call overhead. Measured on this machine (one BLAS thread, T = 50, I = 32, thread CPU time, compiled
against numpy passes): LSTM H 64 0.08 / 0.77 ms at batch 1, 2.4 / 3.6 ms at batch 32; H 128 batch 32
6.9 / 10.0 ms, batch 64 13.4 / 15.0; H 256 batch 4 3.6 / 5.5 ms but batch 8 10.0 / 8.1; H 512 batch 1
4.8 / 4.6. GRU alike (H 128 batch 32 6.5 / 6.5 ms, H 256 batch 16 15.0 / 9.5). The loop's recurrent
product loses where [G H, H] leaves the cache and batch rows reread it: hence compiled_pays.
"""
from __future__ import annotations

import numpy as np

from .compiled import use_compiled
from .format import EdgeModelError
from .kernel_tables import kernel
from .opcontext import OpContext

SMALL_UNITS = 1024  # batch x hidden up to which the compiled loop wins whatever the hidden size
NARROW_HIDDEN, NARROW_UNITS = 128, 4096  # and up to which it wins while the hidden size is at most 128


def compiled_pays(batch: int, hid: int) -> bool:
    """Whether the compiled step loop beats the numpy passes for [batch, hid] states (measured above)."""
    units = batch * hid
    return units <= SMALL_UNITS or (hid <= NARROW_HIDDEN and units <= NARROW_UNITS)


def _check(ctx: OpContext, gates: int, bias_rows: int, n_states: int):
    """(T, B, I, H, reverse) of a sequence op: x [T, B, I], w [G H, I], r [G H, H], b [bias_rows H],
    then n_states states [B, H] or none; outputs y [T, B, H] and the final states."""
    ins = ctx.inputs
    if len(ins) not in (4, 4 + n_states) or any(t is None for t in ins):
        raise EdgeModelError(f"{ctx.op}: takes x, w, r, b and {n_states} initial states or none, got {len(ins)} inputs")
    if len(ctx.outputs) != 1 + n_states:
        raise EdgeModelError(f"{ctx.op}: makes {1 + n_states} outputs, the file lists {len(ctx.outputs)}")
    if ctx.one_int("with_lens", 0, 0, 1):
        raise EdgeModelError(f"{ctx.op}: per-example sequence lengths are not supported on the edge")
    for t in ins + ctx.outputs:
        ctx.dtype(t, "float32")
    x, w, r, b = ins[:4]
    ctx.rank(x, 3), ctx.rank(w, 2), ctx.rank(r, 2), ctx.rank(b, 1)
    steps, batch, feat = x.shape
    hid = r.shape[1]
    want = {"w": (gates * hid, feat), "r": (gates * hid, hid), "b": (bias_rows * hid,)}
    for t, name in ((w, "w"), (r, "r"), (b, "b")):
        if tuple(t.shape) != want[name]:
            raise EdgeModelError(f"{ctx.op}: '{t.name}' has shape {t.shape}, expected {want[name]}")
    for t in ins[4:]:
        if tuple(t.shape) != (batch, hid):
            raise EdgeModelError(f"{ctx.op}: state '{t.name}' has shape {t.shape}, expected {(batch, hid)}")
    if steps < 1 or hid < 1:
        raise EdgeModelError(f"{ctx.op}: needs at least one step and one hidden unit, got x {x.shape}, r {r.shape}")
    return steps, batch, feat, hid, bool(ctx.one_int("reverse", 0, 0, 1))


def _rearrange(ctx: OpContext, make, shapes):
    """make(w, r, b) -> arrays; computed once when the weights are constants, else per call into scratch."""
    consts = [t.data for t in ctx.inputs[1:4]]
    if all(c is not None for c in consts):
        fixed = make(*(np.asarray(c, np.float32) for c in consts))
        return lambda ins, sc: (fixed, None)
    ids = [ctx.scratch(s, np.float32) for s in shapes]

    def per_call(ins, sc):
        outs = [sc[i] for i in ids]

        def refresh():
            for o, v in zip(outs, make(*ins[1:4])):
                o[...] = v
        return outs, refresh
    return per_call


def _project(x2, wt, bn, proj2, refresh):
    """The step taking every input projection at once: proj = x W^T + b (after refreshing weights)."""
    matmul, add = np.matmul, np.add

    def run():
        if refresh is not None:
            refresh()
        matmul(x2, wt, out=proj2)
        add(proj2, bn, out=proj2)
    return run


def _sigmoid_negated(v):
    """v holds -z: v = sigmoid(z) = 1 / (1 + exp(-z)), in place. exp(-z) overflows to inf for z < -88,
    and 1 / inf = 0 is exact: the step loops run under np.errstate(over="ignore"), entered once a call."""
    np.exp(v, out=v)
    v += 1
    np.reciprocal(v, out=v)


@kernel("LSTMSequence")
def lstm_sequence(ctx: OpContext):
    steps, batch, feat, hid, reverse = _check(ctx, 4, 4, 2)
    g3 = 3 * hid
    neg = np.ones((4 * hid,), np.float32)
    neg[:g3] = -1  # i, o, f negated: their sigmoid is a reciprocal of 1 + exp

    def make(w, r, b):
        return (np.ascontiguousarray((w * neg[:, None]).T), np.ascontiguousarray((r * neg[:, None]).T), b * neg)
    weights = _rearrange(ctx, make, [(feat, 4 * hid), (hid, 4 * hid), (4 * hid,)])
    i_proj, i_z = ctx.scratch((steps, batch, 4 * hid), np.float32), ctx.scratch((batch, 4 * hid), np.float32)
    i_c, i_tmp = ctx.scratch((batch, hid), np.float32), ctx.scratch((batch, hid), np.float32)
    order = list(range(steps - 1, -1, -1)) if reverse else list(range(steps))
    has_state = len(ctx.inputs) == 6
    compiled = use_compiled() and compiled_pays(batch, hid)

    def bind(ins, outs, sc):
        (wt, rt, bn), refresh = weights(ins, sc)
        proj, z, c, tmp = sc[i_proj], sc[i_z], sc[i_c], sc[i_tmp]
        y, h_out, c_out = outs
        project = _project(ins[0].reshape(steps * batch, feat), wt, bn, proj.reshape(steps * batch, 4 * hid), refresh)
        h0, c0 = (ins[4], ins[5]) if has_state else (None, None)
        if compiled:
            return _compiled_lstm(project, proj, rt, order, h0, c0, y, h_out, c_out, c, z[0])
        plan = [(proj[t], hp, y[t]) for t, hp in zip(order, [h0] + [y[t] for t in order[:-1]])]
        sig, g = z[:, :g3], z[:, g3:]
        i, o, f = z[:, :hid], z[:, hid:2 * hid], z[:, 2 * hid:g3]
        matmul, add, tanh, multiply, copyto, errstate = np.matmul, np.add, np.tanh, np.multiply, np.copyto, np.errstate

        def run():
            project()
            if c0 is None:
                c.fill(0)
            else:
                copyto(c, c0)
            with errstate(over="ignore"):  # see _sigmoid_negated
                for p, hp, h in plan:
                    if hp is None:
                        copyto(z, p)
                    else:
                        matmul(hp, rt, out=z)
                        add(z, p, out=z)
                    _sigmoid_negated(sig)
                    tanh(g, out=g)
                    multiply(c, f, out=c)
                    multiply(i, g, out=tmp)
                    add(c, tmp, out=c)
                    tanh(c, out=h)
                    multiply(h, o, out=h)
            copyto(h_out, plan[-1][2])
            copyto(c_out, c)
        return run
    return [(steps, batch, hid), (batch, hid), (batch, hid)], bind


@kernel("GRUSequence")
def gru_sequence(ctx: OpContext):
    steps, batch, feat, hid, reverse = _check(ctx, 3, 6, 1)
    lbr = bool(ctx.one_int("linear_before_reset", 0, 0, 1))
    h2 = 2 * hid
    neg = np.ones((3 * hid,), np.float32)
    neg[:h2] = -1  # z and r negated: their sigmoid is a reciprocal of 1 + exp

    def make(w, r, b):
        wb, rb = b[:3 * hid], b[3 * hid:]
        # z, r: both biases in the projection; n: Wb_n, and Rb_n too unless it sits inside r * (.)
        bias = np.concatenate([wb[:h2] + rb[:h2], wb[h2:] if lbr else wb[h2:] + rb[h2:]]) * neg
        return (np.ascontiguousarray((w * neg[:, None]).T), np.ascontiguousarray((r * neg[:, None]).T), bias,
                np.ascontiguousarray(rb[h2:]))
    weights = _rearrange(ctx, make, [(feat, 3 * hid), (hid, 3 * hid), (3 * hid,), (hid,)])
    i_proj, i_z = ctx.scratch((steps, batch, 3 * hid), np.float32), ctx.scratch((batch, 3 * hid), np.float32)
    i_tmp = ctx.scratch((batch, hid), np.float32)
    order = list(range(steps - 1, -1, -1)) if reverse else list(range(steps))
    has_state = len(ctx.inputs) == 5
    compiled = use_compiled() and compiled_pays(batch, hid)
    i_h0 = ctx.scratch((batch, hid), np.float32)

    def bind(ins, outs, sc):
        (wt, rt, bias, rbn), refresh = weights(ins, sc)
        proj, z, tmp = sc[i_proj], sc[i_z], sc[i_tmp]
        y, h_out = outs
        project = _project(ins[0].reshape(steps * batch, feat), wt, bias, proj.reshape(steps * batch, 3 * hid), refresh)
        h0 = ins[4] if has_state else None
        if compiled:
            return _compiled_gru(project, proj, rt, rbn, lbr, order, h0, sc[i_h0], y, h_out, z[0], tmp[0])
        plan = [(proj[t], hp, y[t]) for t, hp in zip(order, [h0] + [y[t] for t in order[:-1]])]
        zr, zg, rg, n = z[:, :h2], z[:, :hid], z[:, hid:h2], z[:, h2:]
        rt_zr, rt_n = rt[:, :h2], rt[:, h2:]
        matmul, add, tanh, multiply, subtract, copyto, errstate = (np.matmul, np.add, np.tanh, np.multiply,
                                                                   np.subtract, np.copyto, np.errstate)

        def run():
            project()
            with errstate(over="ignore"):  # see _sigmoid_negated
                for p, hp, h in plan:
                    if hp is None:  # h = 0: no recurrent products; n's recurrent term is Rb_n alone
                        copyto(z, p)
                        _sigmoid_negated(zr)
                        if lbr:
                            multiply(rg, rbn, out=tmp)
                            add(n, tmp, out=n)
                        tanh(n, out=n)
                        subtract(0, n, out=h)  # h' = n + z (0 - n)
                        multiply(h, zg, out=h)
                        add(h, n, out=h)
                        continue
                    matmul(hp, rt_zr, out=zr)
                    add(zr, p[:, :h2], out=zr)
                    _sigmoid_negated(zr)
                    if lbr:  # n = tanh(x Wn + Wbn + r * (h Rn + Rbn))
                        matmul(hp, rt_n, out=n)
                        add(n, rbn, out=n)
                        multiply(n, rg, out=n)
                    else:  # n = tanh(x Wn + Wbn + Rbn + (r * h) Rn)
                        multiply(rg, hp, out=tmp)
                        matmul(tmp, rt_n, out=n)
                    add(n, p[:, h2:], out=n)
                    tanh(n, out=n)
                    subtract(hp, n, out=h)  # h' = n + z (h - n)
                    multiply(h, zg, out=h)
                    add(h, n, out=h)
            copyto(h_out, plan[-1][2])
        return run
    return [(steps, batch, hid), (batch, hid)], bind


def _compiled_lstm(project, proj, rt, order, h0, c0, y, h_out, c_out, h0s, z):
    """The LSTM step loop as jit.rnn.lstm_steps; h0s is [B, H] scratch (h0 copied in, or zeros)."""
    from ..jit.rnn import lstm_steps  # deferred: jit.rnn loads numba
    times, copyto = np.array(order, np.int64), np.copyto
    rt = rt if rt.flags.writeable else rt.copy()

    def run():
        project()
        if h0 is None:
            h0s.fill(0)
        else:
            copyto(h0s, h0)
        if c0 is None:
            c_out.fill(0)
        else:
            copyto(c_out, c0)
        lstm_steps(proj, rt, times, h0s, c_out, y, z)
        copyto(h_out, y[order[-1]])
    return run


def _compiled_gru(project, proj, rt, rbn, lbr, order, h0, h0s, y, h_out, z, rec):
    """The GRU step loop as jit.rnn.gru_steps."""
    from ..jit.rnn import gru_steps  # deferred: jit.rnn loads numba
    times, copyto = np.array(order, np.int64), np.copyto
    rt, rbn = (a if a.flags.writeable else a.copy() for a in (rt, rbn))

    def run():
        project()
        if h0 is None:
            h0s.fill(0)
        else:
            copyto(h0s, h0)
        gru_steps(proj, rt, rbn, lbr, times, h0s, y, z, rec)
        copyto(h_out, y[order[-1]])
    return run
