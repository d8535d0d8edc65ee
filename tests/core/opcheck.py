"""Shared checks for the op tables: forward against a numpy reference, static shape against the
value the kernel really returns, and gradients against central finite differences."""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import numpy as np

import isthmus as ism
from isthmus.core.shapes import compatible


def run_op(build: Callable, inputs: Sequence[np.ndarray], static_shapes: bool = True):
    """Build `build(*placeholders)` in a fresh graph and run it on `inputs`.

    Returns (outputs as list, output tensors). Placeholders have the inputs' full shapes when
    `static_shapes`, else all-unknown dims of the same rank.
    """
    g = ism.Graph(seed=0)
    with g.as_default():
        phs = [ism.placeholder(a.dtype, a.shape if static_shapes else (None,) * a.ndim, name=f"in{i}")
               for i, a in enumerate(inputs)]
        out = build(*phs)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        sess = ism.Session(g)
        vals = sess.run(outs, dict(zip(phs, inputs)))
    for t, v in zip(outs, vals):
        v = np.asarray(v)
        assert v.dtype == t.dtype, f"{t.name}: kernel returned {v.dtype}, inference says {t.dtype}"
        assert compatible(v.shape, t.shape), f"{t.name}: kernel returned {v.shape}, inference says {t.shape}"
    g.verify()
    return [np.asarray(v) for v in vals], outs


def check_forward(build: Callable, inputs: Sequence[np.ndarray], reference: Callable,
                  rtol: float = 1e-5, atol: float = 1e-6) -> None:
    for static in (True, False):
        got, _ = run_op(build, inputs, static_shapes=static)
        want = reference(*inputs)
        want = list(want) if isinstance(want, (list, tuple)) else [want]
        assert len(got) == len(want)
        for gv, wv in zip(got, want):
            np.testing.assert_allclose(gv, wv, rtol=rtol, atol=atol)


def check_gradients(build: Callable, inputs: Sequence[np.ndarray], wrt: Optional[Sequence[int]] = None,
                    eps: float = 1e-6, rtol: float = 1e-4, atol: float = 1e-6, seed: int = 0) -> None:
    """Compare gradients(y, xs, grad_ys=R) with central differences of sum(y * R), in float64.

    `build` must return one float tensor. Integer inputs are fed but not differentiated.
    """
    inputs = [np.asarray(a) for a in inputs]
    if wrt is None:
        wrt = [i for i, a in enumerate(inputs) if a.dtype.kind == "f"]
    g = ism.Graph(seed=0)
    with g.as_default():
        phs = [ism.placeholder(a.dtype, a.shape, name=f"in{i}") for i, a in enumerate(inputs)]
        y = build(*phs)
        sess = ism.Session(g)
        feed = dict(zip(phs, inputs))
        y0 = np.asarray(sess.run(y, feed))
        r = np.random.default_rng(seed).standard_normal(y0.shape).astype(y0.dtype)
        gy = ism.placeholder(y.dtype, y0.shape, name="grad_y")
        grads = ism.gradients(y, [phs[i] for i in wrt], grad_ys=gy)
        for i, gr in zip(wrt, grads):
            assert gr is not None, f"no gradient for input {i}"
        dense = [ism.core.ops.sparse.to_dense(gr) for gr in grads]
        got = sess.run(dense, {**feed, gy: r})
    g.verify()

    def f(vals):
        return float(np.sum(np.asarray(sess.run(y, dict(zip(phs, vals)))) * r))

    for i, gv in zip(wrt, got):
        num = np.zeros_like(inputs[i])
        flat = num.reshape(-1)
        for k in range(flat.size):
            plus = [a.copy() for a in inputs]
            minus = [a.copy() for a in inputs]
            plus[i].reshape(-1)[k] += eps
            minus[i].reshape(-1)[k] -= eps
            flat[k] = (f(plus) - f(minus)) / (2 * eps)
        np.testing.assert_allclose(np.asarray(gv), num, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i} differs from finite differences")
