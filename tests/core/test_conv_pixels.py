"""Convolutions with few output pixels on the pixel-rows GEMM (jit.gemm_pixels: the constant
weights streamed once, the pixels as rows) against test_conv_forward's float64 tap-by-tap
reference: strides, dilations, padding, 1x1, output channels past a 16-wide panel, small batches."""
import numpy as np
import pytest

import isthmus as ism
from isthmus import jit
from isthmus.core.ops import conv_pixels

from .test_conv_forward import check, run_conv

pytestmark = pytest.mark.skipif(not jit.available(), reason="needs numba")


@pytest.fixture
def served(monkeypatch):
    """Counts the convolutions the pixel-rows path serves."""
    calls = []
    real = conv_pixels.PixelRows.__call__
    monkeypatch.setattr(conv_pixels.PixelRows, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    return calls


CASES = [  # batch, channels, out channels, kernel, strides, padding, dilations, plane
    (1, 40, 64, 3, 1, "SAME", 1, 2),      # ResNet's 2x2 stage
    (1, 24, 100, 3, 2, "SAME", 1, 4),     # stride 2, O past a 16-wide panel
    (1, 64, 20, 1, 1, "VALID", 1, 4),     # a 1x1 on 16 pixels
    (1, 32, 48, 1, 2, "VALID", 1, 8),     # a strided 1x1 (ResNet's downsampling shortcut)
    (1, 16, 32, 3, 1, ((2, 0), (1, 2)), 2, 5),  # dilated, asymmetric padding
    (3, 8, 16, 3, 1, "SAME", 1, 3),       # three images of 9 pixels: 27 rows
    (1, 12, 36, 5, 1, "VALID", 1, 7),     # 3x3 output, 5x5 kernel
]


@pytest.mark.parametrize("act", ["none", "relu", "relu6"])
@pytest.mark.parametrize("n,c,o,k,strides,padding,dil,hw", CASES)
def test_pixel_rows_match_the_reference(served, act, n, c, o, k, strides, padding, dil, hw):
    rng = np.random.default_rng(n * 1000 + c * 10 + o)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    check(x, w, b, strides, padding, dil, 1, act)
    check(x, w, None, strides, padding, dil, 1)  # Conv2D: no bias
    assert len(served) == 2  # FusedConv2D and Conv2D alike


def test_many_pixels_stay_off_the_pixel_rows(served):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 8, 12, 12)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    check(x, w, rng.standard_normal(16).astype(np.float32), 1, "SAME", 1, 1, "relu")
    assert not served


def test_a_nan_passes_the_clamp_as_numpy_relu_keeps_it(served):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 8, 2, 2)).astype(np.float32)
    x[0, 3, 1, 1] = np.nan
    w = rng.standard_normal((16, 8, 1, 1)).astype(np.float32)
    out, _ = run_conv(x, w, np.zeros(16, np.float32), 1, "VALID", 1, 1, "relu")
    assert served and np.isnan(out[0, :, 1, 1]).all() and not np.isnan(out[0, :, 0, 0]).any()


def test_weights_from_a_variable_are_not_served():
    """Variables can change between runs: the relaid weights are kept only for constants."""
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder("float32", (1, 4, 2, 2), name="x")
        v = ism.Variable(np.ones((8, 4, 3, 3), np.float32), name="w")
        y = ism.conv2d(xt, v, padding="SAME")
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
        x = np.ones((1, 4, 2, 2), np.float32)
        first = sess.run(y, {xt: x})
        sess.run(v.assign(np.full((8, 4, 3, 3), 2, np.float32)))
        second = sess.run(y, {xt: x})
    np.testing.assert_array_equal(second, 2 * first)


@pytest.mark.parametrize("n,c,o,k,strides,padding,hw", [
    (32, 16, 32, 3, 2, "SAME", 4),   # 32 images of 2x2 outputs: 128 rows
    (5, 24, 20, 1, 2, "VALID", 7),   # 5 images of 4x4 (a strided 1x1): 80 rows
    (9, 8, 16, 3, 1, "SAME", 3),     # 81 rows: not a multiple of 4
])
def test_batches_of_small_planes_as_pixel_rows(served, n, c, o, k, strides, padding, hw):
    rng = np.random.default_rng(n + c + o)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    check(x, w, rng.standard_normal(o).astype(np.float32), strides, padding, 1, 1, "relu")
    assert served


def test_deep_1x1_on_36_pixels_takes_the_pixel_rows_only_off_the_packed_gemm(served):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 256, 6, 6)).astype(np.float32)
    w = (rng.standard_normal((42, 256, 1, 1)) / 16).astype(np.float32)
    check(x, w, rng.standard_normal(42).astype(np.float32), 1, "VALID", 1, 1, "none")
    assert served  # 42 outputs: not the packed GEMM's multiple of 4
    check(x, w[:40], rng.standard_normal(40).astype(np.float32), 1, "VALID", 1, 1, "none")
    assert len(served) == 1  # 40 outputs: the packed GEMM (jit.gemm_f32.packed_pays, any k on 36 pixels)
    check(x[:, :64], w[:, :64], rng.standard_normal(42).astype(np.float32), 1, "VALID", 1, 1, "none")
    assert len(served) == 1  # 64 channels: the pointwise path


def test_batch_1_leaves_planes_past_16_pixels_to_conv_direct(served, monkeypatch):
    """SqueezeNet's 3x3 on a 6x6 plane (16s of outputs, K >= 32): jit.conv_direct, matching the
    reference; on 4x4 (16 pixels) and at 42 outputs the pixel rows keep it."""
    from isthmus.core.ops import conv_one_image
    direct = []
    real = conv_one_image.OneImage._direct
    monkeypatch.setattr(conv_one_image.OneImage, "_direct", lambda self, *a: direct.append(1) or real(self, *a))
    rng = np.random.default_rng(12)
    for hw, o, pixel_rows in ((6, 64, False), (4, 64, True), (6, 42, True)):
        served.clear()
        direct.clear()
        x = rng.standard_normal((1, 16, hw, hw)).astype(np.float32)
        w = (rng.standard_normal((o, 16, 3, 3)) / 12).astype(np.float32)
        check(x, w, rng.standard_normal(o).astype(np.float32), 1, "SAME", 1, 1, "relu")
        assert bool(served) == pixel_rows and bool(direct) != pixel_rows


def _same_3x3_case(rng, n, c, o, hw, with_addend):
    """x [n, c, hw, hw], read-only 3x3 weights and bias, an addend or None, and the SAME geometry."""
    from isthmus.core.ops.conv import _geometry
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((o, c, 3, 3)) / np.sqrt(c * 9)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    r = rng.standard_normal((n, o, hw, hw)).astype(np.float32) if with_addend else None
    for a in (w, b):
        a.flags.writeable = False

    class Node:
        attrs = {"strides": (1, 1), "dilations": (1, 1), "pads": ((1, 1), (1, 1)), "groups": 1}
    return x, w, b, r, _geometry(Node, x.shape, w.shape)


def _same_3x3_relu_ref(x, w, b, r):
    """relu(conv(x, w) + b (+ r)) in float64, tap by tap."""
    n, _, hw, _ = x.shape
    o = w.shape[0]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((n, o, hw, hw))
    for i in range(3):
        for j in range(3):
            want += np.einsum("nchw,oc->nohw", xp[:, :, i:i + hw, j:j + hw], w[:, :, i, j].astype(np.float64))
    want += b.reshape(1, o, 1, 1)
    return np.maximum(want if r is None else want + r, 0)


@pytest.mark.parametrize("with_addend", [False, True])
@pytest.mark.parametrize("n,hw,blocks", [(32, 4, 32), (10, 3, 7), (1, 12, 7)])
def test_pixel_rows_split_over_threads_give_one_calls_bytes(monkeypatch, with_addend, n, hw, blocks):
    """Work large enough to split runs by blocks of images where each image fills whole row quads (16
    pixels: jit.gemm_pixels.images_range), else by 16-channel weight panels (9 pixels, or batch 1:
    panels_range): cut in three by par_gate.split_rows, or whole in one compiled call, the same
    bytes, and those of the reference."""
    c, o = 48, 100  # 7 panels; 2 * rows * 432 * 112 FLOPs
    x, w, b, r, g = _same_3x3_case(np.random.default_rng(11), n, c, o, hw, with_addend)
    rows = conv_pixels.PixelRows("relu")
    monkeypatch.setattr(conv_pixels, "_MAX_ROWS", 144)  # batch 1's 144 pixels on the pixel rows too
    assert rows.pays(np, x, w, b, g)
    cuts = []

    def three_cuts(kernel, args, total, work, flops=False):  # as three threads would cut it
        for i in range(3):
            kernel(*args, total * i // 3, total * (i + 1) // 3)
        cuts.append(total)
        return 3
    monkeypatch.setattr(conv_pixels, "split_rows", three_cuts)
    monkeypatch.setattr(conv_pixels, "may_split", lambda *a, **kw: True)  # as on an idle machine with work enough
    three = rows(x, w, g, b, r)
    assert cuts == [blocks]
    monkeypatch.setattr(conv_pixels, "may_split", lambda *a, **kw: False)  # no split: the one whole call
    whole = rows(x, w, g, b, r)
    assert cuts == [blocks]
    np.testing.assert_array_equal(three, whole)
    np.testing.assert_allclose(three, _same_3x3_relu_ref(x, w, b, r), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("with_addend", [False, True])
def test_batch_1_runner_splits_by_prange_with_one_calls_bytes(monkeypatch, with_addend):
    """PixelRows.runner (the settled batch-1 route): the gather, the product by prange over weight
    panels (jit.par's driver, here cut in three) and the finish give the whole call's bytes; where
    the split would go to the pool it hands the call to __call__."""
    c, o, hw = 48, 100, 3
    x, w, b, r, g = _same_3x3_case(np.random.default_rng(5), 1, c, o, hw, with_addend)
    rows = conv_pixels.PixelRows("relu")
    run = rows.runner(x, w, g, b)
    asked = []
    monkeypatch.setattr(conv_pixels, "prange_threads", lambda total, work, flops=False: asked.append(total) or 3)
    three = run(x, r)
    assert asked == [7]  # 100 channels: 7 panels of 16
    monkeypatch.setattr(conv_pixels, "prange_threads", lambda *a, **kw: 0)
    monkeypatch.setattr(conv_pixels, "may_split", lambda *a, **kw: False)
    whole = run(x, r)
    np.testing.assert_array_equal(three, whole)
    want = rows(x, w, g, b, r)  # __call__, unsplit
    np.testing.assert_array_equal(whole, want)
    calls = []
    real = conv_pixels.PixelRows.__call__
    monkeypatch.setattr(conv_pixels.PixelRows, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    monkeypatch.setattr(conv_pixels, "may_split", lambda *a, **kw: True)  # the pool's split: __call__'s path
    monkeypatch.setattr(conv_pixels, "split_rows", lambda kernel, args, total, work, flops=False:
                        kernel(*args, 0, total) or 1)
    np.testing.assert_array_equal(run(x, r), want)
    assert calls == [1]
    np.testing.assert_allclose(three, _same_3x3_relu_ref(x, w, b, r), rtol=1e-4, atol=1e-4)
