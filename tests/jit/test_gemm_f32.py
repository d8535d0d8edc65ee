"""jit.gemm_f32 (packed-weight fp32 GEMM, bias and clamp in the epilogue) against a float64 numpy
reference: whole 16-column panels, last panels of up to 8 and of more than 8 columns, odd and
one-long K, a dirty scratch, NaN through the clamp; and the edge's 1x1 convolutions on it."""
import numpy as np
import pytest

from isthmus.jit.gemm_int8 import supported

pytestmark = [pytest.mark.skipif(not supported(), reason="the tile is written for AVX2"), pytest.mark.cpu]


def run_gemm(w, b, x, lo, hi, fill=0.0):
    from isthmus.jit.gemm_f32 import gemm_bias_clamp, pack_weights
    o, k = w.shape
    y = np.full((o, x.shape[1]), np.nan, np.float32)
    panel, tile = np.full((k, 16), fill, np.float32), np.full((o, 16), fill, np.float32)
    gemm_bias_clamp(pack_weights(w), b, x, np.float32(lo), np.float32(hi), y, panel, tile)
    return y


def reference(w, b, x, lo, hi):
    y = w.astype(np.float64) @ x.astype(np.float64) + b[:, None]
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(y), y, np.clip(y, lo, hi))


@pytest.mark.parametrize("o,k,p", [(8, 16, 64), (96, 16, 2304), (4, 7, 37), (12, 33, 45), (16, 1, 20), (24, 96, 5),
                                   (12, 10, 21), (576, 96, 36),
                                   (20, 333, 40), (64, 800, 19),  # K in 3 and 5 equal chunks
                                   (96, 576, 36), (64, 384, 36)])  # MobileNetV2's deep 6x6 1x1s
@pytest.mark.parametrize("lo,hi", [(-np.inf, np.inf), (0.0, 6.0)])
def test_gemm_against_reference(o, k, p, lo, hi):
    rng = np.random.default_rng(o * 100 + k + p)
    w = (rng.standard_normal((o, k)) / np.sqrt(k)).astype(np.float32)  # outputs of unit size at any K
    x = rng.standard_normal((k, p)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    np.testing.assert_allclose(run_gemm(w, b, x, lo, hi), reference(w, b, x, lo, hi), rtol=1e-5, atol=1e-5)


def test_packed_pays_takes_deep_k_only_on_small_planes():
    from isthmus.jit.gemm_f32 import packed_pays, supported
    if not supported():
        pytest.skip("needs AVX2")
    assert packed_pays(96, 576, 36) and packed_pays(64, 384, 16) and packed_pays(64, 256, 2304)
    assert not packed_pays(96, 576, 37) and not packed_pays(96, 576, 15) and not packed_pays(98, 576, 36)


def test_dirty_scratch_nan_and_rows():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 10)).astype(np.float32)
    x = rng.standard_normal((10, 41)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    clean = run_gemm(w, b, x, 0.0, 6.0)
    np.testing.assert_array_equal(run_gemm(w, b, x, 0.0, 6.0, fill=np.nan), clean)
    x[2, 40] = np.nan  # the last panel's column
    got = run_gemm(w, b, x, 0.0, 6.0)
    assert np.isnan(got[:, 40]).all() and np.isnan(got).sum() == 8
    from isthmus.jit.gemm_f32 import pack_weights
    with pytest.raises(ValueError, match="multiple of 4"):
        pack_weights(np.zeros((6, 3), np.float32))


@pytest.mark.parametrize("act", ["none", "relu", "relu6"])
def test_edge_pointwise_conv_uses_it(monkeypatch, act):
    """A batch-1 1x1 FusedConv2D with constant weights over >= 16 pixels runs the packed GEMM and
    matches numpy; 3x3 planes keep BLAS."""
    import isthmus.jit.gemm_f32 as jg
    from tests.edge.singleop import Out, q, run
    calls = []
    real = jg.gemm_bias_clamp
    monkeypatch.setattr(jg, "gemm_bias_clamp", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(11)
    for hw, used in ((9, True), (6, True), (3, False)):
        calls.clear()
        x = rng.standard_normal((1, 20, hw, hw)).astype(np.float32)
        w = rng.standard_normal((12, 20, 1, 1)).astype(np.float32)
        b = rng.standard_normal(12).astype(np.float32)
        want = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x) + b.reshape(1, -1, 1, 1)
        want = {"none": want, "relu": np.maximum(want, 0), "relu6": np.clip(want, 0, 6)}[act]
        args = [q(x, 1, 0), q(w, 1, 0, const=True), q(b, 1, 0, const=True)]
        for a in args:
            a.scale = None
        attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "groups": 1, "activation": act}
        got = run("FusedConv2D", args, Out("float32"), want.shape, attrs)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert bool(calls) == used


@pytest.mark.parametrize("kh,kw,sh,sw,dh,dw", [(5, 5, 1, 1, 1, 1), (3, 3, 2, 2, 1, 1), (3, 2, 2, 1, 2, 3)])
def test_im2col_against_numpy(kh, kw, sh, sw, dh, dw):
    from isthmus.jit.gemm_f32 import im2col
    rng = np.random.default_rng(kh * 7 + sh)
    c, hp, wp = 3, 13, 12
    pad = rng.standard_normal((c, hp, wp)).astype(np.float32)
    oh, ow = (hp - (kh - 1) * dh - 1) // sh + 1, (wp - (kw - 1) * dw - 1) // sw + 1
    want = np.stack([pad[ch, ky * dh:ky * dh + (oh - 1) * sh + 1:sh, kx * dw:kx * dw + (ow - 1) * sw + 1:sw].reshape(-1)
                     for ch in range(c) for ky in range(kh) for kx in range(kw)])
    cols = np.full((c * kh * kw, oh * ow), np.nan, np.float32)
    im2col(pad.reshape(c, hp * wp), wp, kh, kw, sh, sw, dh, dw, cols, oh, ow)
    np.testing.assert_array_equal(cols, want)


@pytest.mark.parametrize("o", [12, 20, 64])
def test_six_row_tiles_give_the_four_row_tiles_bytes(o):
    """_panels runs pairs of 6 x 16 tiles over three packed blocks; each output is still bias + the
    same FMAs in K order, so the bytes are the 4 x 16 tile's (two K chunks: the chunk boundary too)."""
    import numba as nb
    from isthmus.jit import gemm_f32 as g

    @nb.njit
    def four_rows(wp, bias, xf, k, p, o, yf, lo, hi):
        inf = np.float32(np.inf)
        for p0 in range(0, p, 16):
            for k0 in range(0, k, g.KC):
                kn = min(g.KC, k - k0)
                last = k0 + kn >= k
                for ob in range(o // 4):
                    g._tile(wp, xf, p, p0, yf, p, p0, ob, bias, k, k0, kn, k0 == 0, lo if last else -inf,
                            hi if last else inf)
    rng = np.random.default_rng(o)
    k, p = 200, 48
    w, x = rng.standard_normal((o, k)).astype(np.float32), rng.standard_normal((k, p)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    want = np.empty((o, p), np.float32)
    four_rows(g.pack_weights(w), b, x.reshape(-1), k, p, o, want.reshape(-1), np.float32(0), np.float32(6))
    np.testing.assert_array_equal(run_gemm(w, b, x, 0.0, 6.0), want)
    np.testing.assert_allclose(want, reference(w, b, x, 0.0, 6.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("o,k,p", [(96, 16, 2304), (100, 40, 1030), (144, 24, 1100), (120, 33, 1200)])
def test_rows_first_order_gives_the_panel_order_bytes(o, k, p):
    """gemm_bias_clamp's row groups outer (small weights, 256+ columns) against the same tiles panel
    by panel (_panels over every whole panel, then the tail): equal bytes, and the reference."""
    import numba as nb
    from isthmus.jit.gemm_f32 import (NR, ROWS_FIRST_MAX_OK, ROWS_FIRST_MIN_O, ROWS_FIRST_MIN_P, _panels,
                                      gemm_bias_clamp, pack_weights, tail_in, tail_out)
    assert o * k <= ROWS_FIRST_MAX_OK and o >= ROWS_FIRST_MIN_O and p >= ROWS_FIRST_MIN_P

    @nb.njit
    def by_panels(wp, b, x, lo, hi, y, panel, tile):
        k, p = x.shape
        o = y.shape[0]
        xf, yf = x.reshape(k * p), y.reshape(o * p)
        whole = p // NR * NR
        for p0 in range(0, whole, NR):
            _panels(wp, b, xf, p, p0, yf, p, p0, o, k, lo, hi, False)
        if p > whole:
            tail_in(xf, p, k, whole, p - whole, panel)
            _panels(wp, b, panel.reshape(k * NR), NR, 0, tile.reshape(o * NR), NR, 0, o, k, lo, hi, p - whole <= NR // 2)
            tail_out(tile, y, whole, p - whole)

    rng = np.random.default_rng(o + k + p)
    w = (rng.standard_normal((o, k)) / np.sqrt(k)).astype(np.float32)
    x = rng.standard_normal((k, p)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    wp, lo, hi = pack_weights(w), np.float32(0), np.float32(6)
    got, want = np.empty((o, p), np.float32), np.empty((o, p), np.float32)
    gemm_bias_clamp(wp, b, x, lo, hi, got, np.empty((k, NR), np.float32), np.empty((o, NR), np.float32))
    by_panels(wp, b, x, lo, hi, want, np.empty((k, NR), np.float32), np.empty((o, NR), np.float32))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, reference(w, b, x, 0.0, 6.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("o,k,p", [(100, 96, 36), (48, 20, 7), (300, 64, 1024), (52, 200, 45)])
@pytest.mark.parametrize("addend", [False, True])
def test_rows_range_cuts_give_the_whole_products_bytes(o, k, p, addend):
    """A batch-1 product split by blocks of ROWS_BLOCK output rows (rows_range, rows_add_range), cut
    unevenly and in any order, writes exactly what the one whole call writes: each row keeps the tile
    the whole product gives it (six-row pairs, four-row tiles, the narrow tail's eight-row tiles)."""
    from isthmus.jit.gemm_f32 import ROWS_BLOCK, pack_weights, rows_range
    from isthmus.jit.gemm_residual import rows_add_range
    rng = np.random.default_rng(o + k + p)
    w = rng.standard_normal((o, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    x = rng.standard_normal((k, p)).astype(np.float32)
    r = rng.standard_normal((o, p)).astype(np.float32)
    wp, lo, hi = pack_weights(w), np.float32(-1.0), np.float32(2.0)
    blocks = -(-o // ROWS_BLOCK)

    def call(b0, b1, y):
        if addend:
            rows_add_range(wp, b, x.reshape(-1), p, k, p, lo, hi, y, r, b0, b1)
        else:
            rows_range(wp, b, x.reshape(-1), p, k, p, lo, hi, y, b0, b1)
    whole = np.full((o, p), np.nan, np.float32)
    call(0, blocks, whole)
    cut = np.full((o, p), np.nan, np.float32)
    bounds = sorted({0, blocks, blocks // 3, blocks // 2 + 1})
    for b0, b1 in reversed(list(zip(bounds, bounds[1:]))):
        call(b0, b1, cut)
    np.testing.assert_array_equal(cut, whole)
    want = reference(w, b, x, -np.inf, np.inf) + (r if addend else 0)
    np.testing.assert_allclose(whole, np.clip(want, -1.0, 2.0), rtol=1e-5, atol=1e-5)


def test_batch_one_pointwise_conv_splits_by_rows_with_the_same_bytes(monkeypatch):
    """A batch-1 1x1 convolution on the packed GEMM (conv_pointwise) splits by row blocks where
    par_gate.split_rows says so: two threads' prange blocks give the one-thread bytes."""
    from isthmus.core.ops import conv_pointwise
    from tests.core.split_gate import pin_split_gate
    from tests.core.test_conv_forward import run_conv
    rng = np.random.default_rng(21)
    x = rng.standard_normal((1, 40, 6, 6)).astype(np.float32)
    w = (rng.standard_normal((96, 40, 1, 1)) / 6).astype(np.float32)
    b = rng.standard_normal(96).astype(np.float32)
    one, _ = run_conv(x, w, b, 1, "SAME", 1, 1, "relu6")
    used = []
    real = conv_pointwise.split_rows
    monkeypatch.setattr(conv_pointwise, "split_rows", lambda *a, **kw: used.append((a[0].__name__, real(*a, **kw))))
    pin_split_gate(monkeypatch)  # this small product splits
    two, _ = run_conv(x, w, b, 1, "SAME", 1, 1, "relu6")
    assert ("rows_range", 2) in used
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("o,k,p", [(24, 96, 2304), (16, 33, 150), (8, 200, 64), (12, 16, 77)])
@pytest.mark.parametrize("addend", [False, True])
def test_cols_range_cuts_give_the_whole_products_bytes(o, k, p, addend):
    """A product of few output rows split by blocks of COLS_BLOCK columns (cols_range, cols_add_range),
    cut unevenly and in any order, writes exactly what the one whole call writes (the tail's columns
    included), and the reference's values."""
    from isthmus.jit.gemm_f32 import COLS_BLOCK, cols_range, pack_weights
    from isthmus.jit.gemm_residual import cols_add_range, gemm_bias_add_clamp
    rng = np.random.default_rng(o * k + p)
    w = rng.standard_normal((o, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    x = rng.standard_normal((k, p)).astype(np.float32)
    r = rng.standard_normal((o, p)).astype(np.float32)
    wp, lo, hi = pack_weights(w), np.float32(-1.0), np.float32(2.0)
    blocks = -(-p // COLS_BLOCK)
    whole = np.full((o, p), np.nan, np.float32)
    if addend:
        gemm_bias_add_clamp(wp, b, x, lo, hi, whole, r, np.empty((k, 16), np.float32), np.empty((o, 16), np.float32),
                            np.empty((o, 16), np.float32))
    else:
        whole = run_gemm(w, b, x, -1.0, 2.0)
    cut = np.full((o, p), np.nan, np.float32)
    bounds = sorted({0, blocks, blocks // 3, blocks // 2 + 1} & set(range(blocks + 1)))
    for b0, b1 in reversed(list(zip(bounds, bounds[1:]))):
        if addend:
            cols_add_range(wp, b, x.reshape(-1), p, k, p, lo, hi, cut, r, b0, b1)
        else:
            cols_range(wp, b, x.reshape(-1), p, k, p, lo, hi, cut, b0, b1)
    np.testing.assert_array_equal(cut, whole)
    want = reference(w, b, x, -np.inf, np.inf) + (r if addend else 0)
    np.testing.assert_allclose(whole, np.clip(want, -1.0, 2.0), rtol=1e-5, atol=1e-5)
