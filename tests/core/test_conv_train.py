"""The training kernels' fast paths (2x2 max pooling, conv gradients) against plain loop references
and finite differences, including ties, odd sizes that leave the fast path, and float32."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core.ops.base import make

from .opcheck import check_gradients

rng = np.random.default_rng(7)


def ref_max_pool_grad(x, dy, k, s):
    """Each window sends its gradient to the first maximum in row-major order (VALID padding)."""
    n, c, h, w = x.shape
    oh, ow = (h - k[0]) // s[0] + 1, (w - k[1]) // s[1] + 1
    dx = np.zeros_like(x)
    for b in range(n):
        for ch in range(c):
            for i in range(oh):
                for j in range(ow):
                    win = x[b, ch, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]]
                    a, e = np.unravel_index(int(np.argmax(win)), win.shape)  # argmax: first maximum
                    dx[b, ch, i * s[0] + a, j * s[1] + e] += dy[b, ch, i, j]
    return dx


def _pool_and_grad(x, dy, ksize=2, strides=None, device=None):
    g = ism.Graph()
    with g.as_default():
        xp = ism.placeholder(x.dtype, x.shape)
        y = ism.max_pool(xp, ksize, strides)
        dx, = ism.gradients(y, [xp], grad_ys=ism.constant(dy))
        return ism.Session(g, device=device).run([y, dx], {xp: x})


def _tied(shape, dtype):
    """Small integers: most windows hold their maximum two to four times, in every position."""
    return rng.integers(-1, 2, shape).astype(dtype)


@pytest.fixture
def fast_paths(monkeypatch):
    """Counts the calls of the fast-path functions, so a test knows it exercised them."""
    from isthmus.core.ops import pool as pool_mod
    calls = {}

    def counted(name):
        fn = getattr(pool_mod, name)

        def wrapper(*a, **k):
            calls[name] = calls.get(name, 0) + 1
            return fn(*a, **k)
        monkeypatch.setattr(pool_mod, name, wrapper)
    for name in ("_max_pool_pairs", "_max_pool_grad_pairs", "_max_pool_pairs_compiled", "_max_pool_grad_compiled"):
        counted(name)
    return calls


@pytest.mark.parametrize("jit_on", ["1", "0"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("data", ["distinct", "ties", "relu"])
def test_max_pool_2x2_forward_and_grad_match_loops(dtype, data, fast_paths, jit_on, monkeypatch):
    monkeypatch.setenv("ISTHMUS_JIT", jit_on)
    shape = (3, 4, 8, 10)
    x = {"distinct": lambda: rng.standard_normal(shape),
         "ties": lambda: _tied(shape, np.float64),
         "relu": lambda: np.maximum(rng.standard_normal(shape), 0)}[data]().astype(dtype)
    if data == "ties":  # every tie pattern of one window, in the first windows of the first row
        for p in range(16):
            x[0, 0, 0:2, 0:2] = np.array([(p >> 3) & 1, (p >> 2) & 1, (p >> 1) & 1, p & 1]).reshape(2, 2)
            x = np.roll(x, 2, axis=3)
    dy = rng.standard_normal((3, 4, 4, 5)).astype(dtype)
    # the CPU kernels' fast paths, also when the suite runs with ISTHMUS_DEVICE=gpu (gpu_check.sh)
    y, dx = _pool_and_grad(x, dy, device="cpu")
    want_y = x.reshape(3, 4, 4, 2, 5, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(dx, ref_max_pool_grad(x, dy, (2, 2), (2, 2)))
    assert dx.dtype == dtype
    if jit_on == "1" and ism.jit.available():  # compiled passes (jit.pool), both dtypes
        assert fast_paths == {"_max_pool_pairs_compiled": 1, "_max_pool_grad_compiled": 1}
    else:
        assert fast_paths == ({"_max_pool_pairs": 1, "_max_pool_grad_pairs": 1} if dtype == np.float32
                              else {"_max_pool_pairs": 1})  # numpy: float64 gradients take the general kernel


def _pool_grad_through_relu(z, dy, jit_on, monkeypatch):
    """dz of max_pool(relu(z)) (the relu folds into MaxPoolGrad's through_relu)."""
    monkeypatch.setenv("ISTHMUS_JIT", jit_on)
    g = ism.Graph()
    with g.as_default():
        zp = ism.placeholder(z.dtype, z.shape)
        dz, = ism.gradients(ism.max_pool(ism.relu(zp), 2), [zp], grad_ys=ism.constant(dy))
        assert any(n.op == "MaxPoolGrad" and n.attrs["through_relu"] for n in g.nodes)
        return ism.Session(g, device="cpu").run(dz, {zp: z})


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_compiled_max_pool_grad_gives_numpys_bytes_through_relu_with_nan_and_inf(monkeypatch):
    """jit.pool's gradient and numpy's mask passes agree bit for bit: ties after the relu, a NaN
    window (sends nothing), an inf and a NaN dy (NaN beside its maximum: dy times a zero mask)."""
    if not ism.jit.available():
        pytest.skip("numba is not available")
    z = _tied((2, 3, 6, 8), np.float32)
    z[0, 0, 0, 0] = np.nan
    z[1, 2, 0:2, 2:4] = [[2, 1], [0, 2]]  # a tie for the maximum 2: the first takes the inf below
    dy = rng.standard_normal((2, 3, 3, 4)).astype(np.float32)
    dy[1, 2, 0, 1], dy[0, 1, 2, 3] = np.inf, np.nan
    got = _pool_grad_through_relu(z, dy, "1", monkeypatch)
    want = _pool_grad_through_relu(z, dy, "0", monkeypatch)
    assert got.tobytes() == want.tobytes()
    x, d = np.maximum(z[1:, :2], 0), dy[1:, :2]  # a corner without NaN or inf, against the loops
    d = d * (x.reshape(1, 2, 3, 2, 4, 2).max(axis=(3, 5)) > 0)
    np.testing.assert_array_equal(got[1:, :2], ref_max_pool_grad(x, d, (2, 2), (2, 2)))
    assert np.isinf(got[1, 2, 0, 2]) and np.isnan(got[1, 2, 0:2, 2:4]).sum() == 3


@pytest.mark.parametrize("shape,ksize,strides", [((2, 3, 7, 6), 2, None),   # odd height: the general path
                                                  ((2, 3, 6, 6), 3, 3),      # 3x3 tiles
                                                  ((2, 3, 6, 6), 2, 1)])     # overlapping windows
def test_max_pool_grad_other_geometries_with_ties(shape, ksize, strides):
    x = _tied(shape, np.float64)
    k = (ksize, ksize)
    s = (strides or ksize,) * 2
    oh, ow = (shape[2] - k[0]) // s[0] + 1, (shape[3] - k[1]) // s[1] + 1
    dy = rng.standard_normal(shape[:2] + (oh, ow))
    _, dx = _pool_and_grad(x, dy, ksize, strides)
    np.testing.assert_allclose(dx, ref_max_pool_grad(x, dy, k, s), rtol=1e-14, atol=1e-14)  # overlaps: sums


def test_max_pool_2x2_gradient_by_finite_differences():
    x = rng.standard_normal((2, 3, 6, 8))
    check_gradients(lambda x_: ism.max_pool(x_, 2), [x])


def test_max_pool_2x2_on_integers_and_views():
    x = rng.integers(-50, 50, (2, 3, 4, 6)).astype(np.int32)
    g = ism.Graph()
    with g.as_default():
        xp = ism.placeholder("int32", x.shape)
        y = ism.max_pool(ism.transpose(ism.transpose(xp, (0, 1, 3, 2)), (0, 1, 3, 2)), 2)
        got = ism.Session(g).run(y, {xp: x})
    np.testing.assert_array_equal(got, x.reshape(2, 3, 2, 2, 3, 2).max(axis=(3, 5)))


# ---- convolution gradients -----------------------------------------------------------------------
def ref_conv_grads(x, w, dy, stride, pads, dil):
    """dx and dw of a groups-1 convolution, one kernel tap at a time (einsum over the tap's view)."""
    o, c, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple(pads))
    oh, ow = dy.shape[2], dy.shape[3]
    dxp = np.zeros_like(xp)
    dw = np.zeros_like(w)
    for i in range(kh):
        for j in range(kw):
            sl = (slice(None), slice(None), slice(i * dil[0], i * dil[0] + stride[0] * (oh - 1) + 1, stride[0]),
                  slice(j * dil[1], j * dil[1] + stride[1] * (ow - 1) + 1, stride[1]))
            dw[:, :, i, j] = np.einsum("nopq,ncpq->oc", dy, xp[sl])
            dxp[sl] += np.einsum("nopq,oc->ncpq", dy, w[:, :, i, j])
    (t, _), (l, _) = pads
    return dxp[:, :, t:t + x.shape[2], l:l + x.shape[3]], dw


def _conv_grads(x, w, dy, **kw):
    g = ism.Graph()
    with g.as_default():
        xp, wp = ism.placeholder(x.dtype, x.shape), ism.placeholder(w.dtype, w.shape)
        y = ism.conv2d(xp, wp, **kw)
        grads = ism.gradients(y, [xp, wp], grad_ys=ism.constant(dy))
        return ism.Session(g).run(grads, {xp: x, wp: w})


FILTER_CASES = [  # (x shape, w shape, conv2d kwargs, (stride, pads, dilation) for the reference)
    ((3, 1, 12, 12), (6, 1, 5, 5), dict(padding="SAME"), ((1, 1), ((2, 2), (2, 2)), (1, 1))),
    ((2, 3, 11, 9), (4, 3, 3, 3), dict(padding="SAME", strides=2), ((2, 2), ((1, 1), (1, 1)), (1, 1))),
    ((2, 2, 9, 10), (3, 2, 2, 3), dict(padding=((1, 0), (2, 1)), dilations=(2, 1)), ((1, 1), ((1, 0), (2, 1)), (2, 1))),
]


@pytest.mark.parametrize("layout", ["cnhw", "chwn"])
@pytest.mark.parametrize("xs,ws,kw,ref", FILTER_CASES, ids=["c1_same", "c3_stride2", "dilated_explicit"])
def test_filter_gradient_both_layouts(monkeypatch, layout, xs, ws, kw, ref):
    from isthmus.core.ops import conv as conv_mod
    monkeypatch.setattr(conv_mod, "_ROW_TAPS_MIN_K", 10 ** 9)  # the im2col path, where the layouts differ
    monkeypatch.setattr(conv_mod, "_cnhw_pays", lambda *a: layout == "cnhw")
    x = rng.standard_normal(xs)
    w = rng.standard_normal(ws)
    y_shape = ism.Graph()
    with y_shape.as_default():
        oshape = ism.conv2d(ism.placeholder("float64", xs), ism.constant(w), **kw).shape
    dy = rng.standard_normal(oshape)
    dx, dw = _conv_grads(x, w, dy, **kw)
    want_dx, want_dw = ref_conv_grads(x, w, dy, *ref)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-10, atol=1e-10)
    check_gradients(lambda x_, w_: ism.conv2d(x_, w_, **kw), [x, w])
    dx32, dw32 = _conv_grads(x.astype(np.float32), w.astype(np.float32), dy.astype(np.float32), **kw)
    assert dw32.dtype == np.float32
    np.testing.assert_allclose(dw32, want_dw, rtol=1e-4, atol=1e-4)


def test_layout_choice_for_the_benchmark_cnn():
    """The first convolution of the benchmark CNN (1 input channel) takes the (n, oh, ow) layout,
    the second keeps row taps."""
    from isthmus.core.ops import conv as conv_mod
    g = conv_mod.WindowGeometry()
    g.kh = g.kw = 5
    g.sh = g.sw = g.dh = g.dw = g.groups = 1
    g.pads, g.oh, g.ow = ((2, 2), (2, 2)), 28, 28
    assert conv_mod._cnhw_pays(g, 64, 1, 32, 28)
    assert not conv_mod._row_taps(g, 1)
    g.oh = g.ow = 14
    assert conv_mod._row_taps(g, 32)


ROW_CASES = [  # stride 1 along H: row taps, whose GEMMs skip the rows that read only H padding
    ((2, 4, 7, 6), (3, 4, 5, 5), dict(padding="SAME"), ((1, 1), ((2, 2), (2, 2)), (1, 1))),
    ((1, 4, 3, 4), (3, 4, 3, 2), dict(padding=((2, 0), (0, 1)), dilations=(2, 1)),  # kernel row 0 reaches no
     ((1, 1), ((2, 0), (0, 1)), (2, 1))),                                              # output row at all
    ((2, 3, 5, 6), (2, 3, 2, 3), dict(padding=((4, 1), (1, 1))), ((1, 1), ((4, 1), (1, 1)), (1, 1))),  # no row full
    ((2, 3, 6, 7), (4, 3, 3, 3), dict(padding="SAME", strides=(1, 2)), ((1, 2), ((1, 1), (1, 1)), (1, 1))),
]


# a GEMM per kernel row added into the output by BLAS (beta=1 into strided views) over blocks of one
# output row or all of them, the same through matmul and an add, or a GEMM per input row over the
# kernel rows stacked (few output channels)
@pytest.mark.parametrize("gemm", ["cblas", "cblas_row_blocks", "matmul", "stacked"])
@pytest.mark.parametrize("xs,ws,kw,ref", ROW_CASES, ids=["same5x5", "empty_row", "pad_beyond", "stride_w"])
def test_row_tap_gradients_skip_padding_rows(monkeypatch, xs, ws, kw, ref, gemm):
    from isthmus.core.ops import conv as conv_mod
    from isthmus.core.ops import conv_rows, numpy_blas
    monkeypatch.setattr(conv_mod, "_ROW_TAPS_MIN_K", 1)
    monkeypatch.setattr(conv_rows, "_BLOCK_MIN_COLS", 1 if gemm == "cblas_row_blocks" else 10 ** 9)
    monkeypatch.setattr(conv_rows.threads, "cores", lambda: 64)
    monkeypatch.setattr(conv_rows, "_ACC_MIN_O", 10 ** 9 if gemm == "stacked" else 0)
    if gemm == "matmul":
        monkeypatch.setattr(numpy_blas, "_bound", [None])
    elif not numpy_blas.available():
        pytest.skip("numpy's BLAS is not reachable through ctypes here")
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    g = ism.Graph()
    with g.as_default():
        oshape = ism.conv2d(ism.placeholder("float64", xs), ism.constant(w), **kw).shape
    dy = rng.standard_normal(oshape)
    dx, dw = _conv_grads(x, w, dy, **kw)
    want_dx, want_dw = ref_conv_grads(x, w, dy, *ref)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-10, atol=1e-10)
    check_gradients(lambda x_, w_: ism.conv2d(x_, w_, **kw), [x, w])


def test_row_spans_of_the_benchmark_cnn():
    from isthmus.core.ops import conv as conv_mod
    from isthmus.core.ops.conv_rows import row_spans
    g = conv_mod.WindowGeometry()
    g.kh, g.dh, g.pads, g.oh = 5, 1, ((2, 2), (2, 2)), 14
    assert row_spans(g, 14) == [(2, 14, 0), (1, 14, 0), (0, 14, 0), (0, 13, 1), (0, 12, 2)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ksize,strides", [(2, None), (3, 2)], ids=["tiles", "overlap"])
def test_relu_then_max_pool_gradient_is_one_max_pool_grad(dtype, ksize, strides):
    """Autodiff folds the relu's gradient into the MaxPoolGrad (no ReluGrad runs); the result is
    the same as the two-step chain, ties and all-zero windows included."""
    z = _tied((2, 3, 8, 8), np.float64).astype(dtype)
    z[0, 0] = -1.0  # a channel whose windows are all zeros after the relu
    g = ism.Graph()
    with g.as_default():
        zp = ism.placeholder(dtype, z.shape)
        y = ism.max_pool(ism.relu(zp), ksize, strides)
        dy = rng.standard_normal(tuple(y.shape)).astype(dtype)
        dz, = ism.gradients(y, [zp], grad_ys=ism.constant(dy))
        sess = ism.Session(g)
        got = sess.run(dz, {zp: z})
        ops = [n.op for n in sess.plan_for(dz, {zp: z}).nodes]
    g.verify()
    assert "ReluGrad" not in ops and ops.count("MaxPoolGrad") == 1
    r = np.maximum(z, 0)
    k, s = (ksize, ksize), ((strides or ksize),) * 2
    want = ref_max_pool_grad(r, dy, k, s) * (r > 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert got.dtype == dtype


def test_relu_max_pool_fold_by_finite_differences_and_where_it_does_not_apply():
    x = rng.standard_normal((2, 2, 6, 6))
    check_gradients(lambda x_: ism.max_pool(ism.relu(x_), 2), [x])
    check_gradients(lambda x_: ism.max_pool(ism.relu(x_), 2) * 2.0 + ism.reduce_sum(ism.relu(x_)), [x])
    g = ism.Graph()
    with g.as_default():  # the relu output has a second consumer: its gradient is a sum, no fold
        xp = ism.placeholder("float64", x.shape)
        r = ism.relu(xp)
        out = ism.reduce_sum(ism.max_pool(r, 2)) + ism.reduce_sum(r)
        dx, = ism.gradients(out, [xp])
        ops = [n.op for n in ism.Session(g).plan_for(dx, {xp: x}).nodes]
    assert "ReluGrad" in ops


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axis", [((6, 5, 4, 3), 1), ((7, 9), -1), ((9, 4, 5), 0), ((3, 4, 2, 6), -1)])
def test_bias_add_grad_sums_every_other_axis(dtype, shape, axis):
    """BiasAddGrad (one einsum over the other axes) against a float64 sum, NCHW and the rest."""
    dy = rng.standard_normal(shape).astype(dtype)
    g = ism.Graph()
    with g.as_default():
        dyt = ism.placeholder(dtype, shape, name="dy")
        db = make("BiasAddGrad", (dyt,), {"axis": axis}).outputs[0]
    got = ism.Session(g).run(db, {dyt: dy})
    axes = tuple(i for i in range(len(shape)) if i != axis % len(shape))
    assert got.dtype == dtype and got.shape == (shape[axis],)
    np.testing.assert_allclose(got, dy.astype(np.float64).sum(axis=axes), rtol=1e-5, atol=1e-5)
