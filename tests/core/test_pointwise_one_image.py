"""Batch-1 1x1 convolutions on constant weights: after the first run the node goes straight to the
packed GEMM (conv_pointwise.PackedGemm.one_image), with and without a residual addend. Every run is
checked against a float64 numpy reference; a new shape or ISTHMUS_JIT=0 leaves the fast path."""
import numpy as np
import pytest

import isthmus as ism
from isthmus import jit
from isthmus.core.ops import conv_pointwise
from isthmus.core.ops.base import make

pytestmark = [pytest.mark.skipif(not jit.available(), reason="needs numba"), pytest.mark.cpu]


def _graph(c, o, act, residual):
    rng = np.random.default_rng(c * 10 + o)
    w = (rng.standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, c, None, None), name="x")
        r = ism.placeholder("float32", (1, o, None, None), name="r") if residual else None
        y = ism.conv2d(x, ism.constant(w), padding="VALID")
        attrs = {**{k: y.node.attrs[k] for k in ("strides", "dilations", "pads", "groups")}, "activation": act}
        ins = (x, y.node.inputs[1], ism.constant(b)) + ((r,) if residual else ())
        y = make("FusedConv2DAdd" if residual else "FusedConv2D", ins, attrs).outputs[0]
        sess = ism.Session(g, optimize=False)
    return sess, x, r, y, w, b


def _want(x, w, b, r, act):
    o = w.shape[0]
    y = np.einsum("ok,kp->op", w.reshape(o, -1).astype(np.float64), x.reshape(x.shape[1], -1).astype(np.float64))
    y = y.reshape(1, o, *x.shape[2:]) + b.reshape(1, -1, 1, 1)
    if r is not None:
        y = y + r
    return np.clip(y, 0, 6) if act == "relu6" else np.maximum(y, 0) if act == "relu" else y


@pytest.fixture
def one_image_calls(monkeypatch):
    """The shapes runners were made for (conv_bound keeps one per shape), then one "run" per call of a runner."""
    made = []
    real = conv_pointwise.PackedGemm.runner

    def runner(self, xp, x, *a):
        made.append(x.shape)
        run = real(self, xp, x, *a)
        return None if run is None else (lambda *b: made.append("run") or run(*b))
    monkeypatch.setattr(conv_pointwise.PackedGemm, "runner", runner)
    return made


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("act", ["none", "relu6"])
def test_repeated_runs_match_numpy_and_take_the_fast_path(one_image_calls, residual, act):
    c, o = 24, 40
    sess, x, r, y, w, b = _graph(c, o, act, residual)
    rng = np.random.default_rng(1)
    for hw in (6, 6, 6, 5, 5):  # a new plane size builds a second runner
        xv = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
        rv = rng.standard_normal((1, o, hw, hw)).astype(np.float32) if residual else None
        feed = {x: xv, r: rv} if residual else {x: xv}
        got = sess.run(y, feed)
        assert got.shape == (1, o, hw, hw) and got.dtype == np.float32 and got.flags.c_contiguous
        np.testing.assert_allclose(got, _want(xv, w, b, rv, act), rtol=1e-5, atol=1e-5)
    assert one_image_calls == [(1, c, 6, 6), "run", "run", (1, c, 5, 5), "run"]


def test_switching_jit_off_leaves_the_fast_path(one_image_calls, monkeypatch):
    sess, x, _, y, w, b = _graph(16, 32, "relu6", False)
    xv = np.random.default_rng(2).standard_normal((1, 16, 6, 6)).astype(np.float32)
    first = sess.run(y, {x: xv})
    calls = []
    for name in ("_plain_images", "_augmented_images"):  # numpy's products (the bias in the product or not)
        real = getattr(conv_pointwise.Pointwise, name)
        monkeypatch.setattr(conv_pointwise.Pointwise, name,
                            lambda self, *a, _real=real, _n=name: calls.append(_n) or _real(self, *a))
    monkeypatch.setenv("ISTHMUS_JIT", "0")
    off = sess.run(y, {x: xv})
    assert len(calls) == 1  # numpy's products, not the runner
    np.testing.assert_allclose(off, first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(first, _want(xv, w, b, None, "relu6"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("residual", [False, True])
def test_deep_1x1_on_a_6x6_plane_takes_the_packed_gemm(one_image_calls, residual):
    """MobileNetV2's 576 -> 96 projection (with its residual) on 6x6: the packed GEMM, not pixel rows
    or BLAS; 7x7 (49 pixels) at this depth keeps BLAS (no runner)."""
    c, o = 576, 96
    sess, x, r, y, w, b = _graph(c, o, "none", residual)
    rng = np.random.default_rng(5)
    for hw in (6, 6, 7):
        xv = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
        rv = rng.standard_normal((1, o, hw, hw)).astype(np.float32) if residual else None
        got = sess.run(y, {x: xv, r: rv} if residual else {x: xv})
        np.testing.assert_allclose(got, _want(xv, w, b, rv, "none"), rtol=1e-4, atol=1e-4)
    assert one_image_calls == [(1, c, 6, 6), "run", (1, c, 7, 7)]


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("act", ["none", "relu6"])
def test_batch_projection_on_blas_splits_by_images_with_the_same_bytes(monkeypatch, residual, act):
    """A batch's projection (fewer outputs than inputs: not the packed GEMM) runs as compiled calls of
    numpy's sgemm per image plus the finish (jit.par_blas.pointwise_blas_range); split by prange
    across two threads it gives the one-thread bytes, and a float64 reference's values."""
    from isthmus.core.ops import numpy_blas
    from .split_gate import pin_split_gate
    if numpy_blas.sgemm() is None:
        pytest.skip("numpy's sgemm could not be bound")
    c, o, n = 24, 8, 6
    rng = np.random.default_rng(9)
    w = (rng.standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (n, c, 7, 5), name="x")
        r = ism.placeholder("float32", (n, o, 7, 5), name="r") if residual else None
        y = ism.conv2d(x, ism.constant(w), padding="VALID")
        attrs = {**{k: y.node.attrs[k] for k in ("strides", "dilations", "pads", "groups")}, "activation": act}
        ins = (x, y.node.inputs[1], ism.constant(b)) + ((r,) if residual else ())
        y = make("FusedConv2DAdd" if residual else "FusedConv2D", ins, attrs).outputs[0]
    xv = rng.standard_normal((n, c, 7, 5)).astype(np.float32)
    rv = rng.standard_normal((n, o, 7, 5)).astype(np.float32) if residual else None
    feed = {x: xv, r: rv} if residual else {x: xv}
    one = ism.Session(g, optimize=False, intra_op_threads=1).run(y, feed)
    want = np.einsum("ok,nkp->nop", w.reshape(o, c).astype(np.float64), xv.reshape(n, c, -1).astype(np.float64))
    want = want.reshape(n, o, 7, 5) + b.reshape(1, -1, 1, 1) + (rv if residual else 0)
    np.testing.assert_allclose(one, np.clip(want, 0, 6) if act == "relu6" else want, rtol=1e-5, atol=1e-5)
    used = []
    real = conv_pointwise.par_rows
    monkeypatch.setattr(conv_pointwise, "par_rows", lambda *a, **kw: used.append(real(*a, **kw)) or used[-1])
    pin_split_gate(monkeypatch, intra=None)  # this small batch splits (the session's two threads)
    two = ism.Session(g, optimize=False, intra_op_threads=2).run(y, feed)
    assert used == [2]
    np.testing.assert_array_equal(one, two)
