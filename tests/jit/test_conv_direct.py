"""jit.conv_direct (output channels in the lanes, pixels broadcast from the padded image through offset
tables) against a float64 numpy convolution: strides, dilations, asymmetric padding, several K
chunks, pixel counts that are not whole 6-pixel tiles, 16 to 48 outputs, a residual addend with the
clamp after it, a batch with one scratch; and conv.py's batch-1 and batch paths choosing it."""
import numpy as np
import pytest

from isthmus.jit.gemm_int8 import supported

pytestmark = [pytest.mark.skipif(not supported(), reason="the tile is written for AVX2"), pytest.mark.cpu]


def reference(x, w, b, s, d, pads):
    (t, bo), (l, r) = pads
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, bo), (l, r)))
    oh = (h + t + bo - (kh - 1) * d - 1) // s + 1
    ow = (wd + l + r - (kw - 1) * d - 1) // s + 1
    cols = np.stack([xp[:, :, ky * d:ky * d + (oh - 1) * s + 1:s, kx * d:kx * d + (ow - 1) * s + 1:s]
                     for ky in range(kh) for kx in range(kw)], 2)  # n, c, taps, oh, ow
    y = np.einsum("ok,nkp->nop", w.reshape(o, -1).astype(np.float64), cols.reshape(n, c * kh * kw, oh * ow))
    return y + b.reshape(1, -1, 1), oh, ow


def run(x, w, b, s, d, pads, lo, hi, r=None):
    from isthmus.jit.conv_direct import conv_direct_images, pack_channels, tables
    (t, bo), (l, rr) = pads
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = (h + t + bo - (kh - 1) * d - 1) // s + 1, (wd + l + rr - (kw - 1) * d - 1) // s + 1
    koff, pix, wp, size = tables(c, h, wd, kh, kw, s, s, d, d, t, l, bo, rr, oh, ow)
    out = np.full((n, o, oh * ow), np.nan, np.float32)
    addend = np.empty((0, 0, 0), np.float32) if r is None else r.reshape(n, o, oh * ow)
    conv_direct_images(x.reshape(n, c, h * wd), h, wd, t, l, wp, koff, pix, pack_channels(w.reshape(o, -1)), b,
                       np.float32(lo), np.float32(hi), out, addend, size, 0, n)
    return out


@pytest.mark.parametrize("n,c,o,k,h,w,s,d,pads", [
    (1, 32, 64, 5, 14, 14, 1, 1, ((2, 2), (2, 2))),   # the core CNN's second convolution (K 800: 7 chunks)
    (2, 24, 16, 3, 9, 11, 1, 1, ((1, 0), (0, 2))),    # asymmetric padding, 99 pixels
    (1, 20, 48, 3, 13, 13, 2, 1, ((1, 1), (1, 1))),   # stride 2
    (1, 16, 32, 3, 12, 10, 1, 2, ((2, 2), (1, 1))),   # dilation 2
    (3, 8, 32, 2, 7, 7, 3, 1, ((0, 0), (0, 0))),      # stride 3, no padding, 4 pixels (one short tile)
])
@pytest.mark.parametrize("lo,hi", [(-np.inf, np.inf), (0.0, 6.0)])
def test_against_the_reference(n, c, o, k, h, w, s, d, pads, lo, hi):
    rng = np.random.default_rng(n * 1000 + c * 10 + k)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    want, _, _ = reference(x, wt, b, s, d, pads)
    np.testing.assert_allclose(run(x, wt, b, s, d, pads, lo, hi), np.clip(want, lo, hi), rtol=1e-5, atol=1e-5)


def test_residual_addend_before_the_clamp_and_nan():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 16, 10, 10)).astype(np.float32)
    w = (rng.standard_normal((32, 16, 3, 3)) / 12).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    r = rng.standard_normal((2, 32, 10, 10)).astype(np.float32)
    r[1, 3, 4, 5] = np.nan
    want, _, _ = reference(x, w, b, 1, 1, ((1, 1), (1, 1)))
    want = want + r.reshape(2, 32, 100)
    with np.errstate(invalid="ignore"):
        want = np.where(np.isnan(want), want, np.clip(want, 0.0, 6.0))
    got = run(x, w, b, 1, 1, ((1, 1), (1, 1)), 0.0, 6.0, r)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.isnan(got).sum() == 1


def test_pack_channels_needs_whole_vectors():
    from isthmus.jit.conv_direct import pack_channels
    with pytest.raises(ValueError, match="multiple of 16"):
        pack_channels(np.zeros((24, 9), np.float32))


@pytest.mark.parametrize("n", [1, 3])
def test_conv_chooses_it_and_matches(monkeypatch, n):
    """A 5x5 32 -> 64 convolution (K 800) with constant weights runs jit.conv_direct, at batch 1 and
    image by image at a batch, and matches the reference."""
    from isthmus.core.ops import conv_one_image
    from tests.core.test_conv_forward import check
    calls = []
    real = conv_one_image.OneImage._direct
    monkeypatch.setattr(conv_one_image.OneImage, "_direct", lambda self, *a: calls.append(1) or real(self, *a))
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 32, 14, 14)).astype(np.float32)
    w = (rng.standard_normal((64, 32, 5, 5)) / 40).astype(np.float32)
    check(x, w, rng.standard_normal(64).astype(np.float32), 1, "SAME", 1, 1, "relu")
    assert calls


@pytest.mark.parametrize("route", ["prange", "pool"])
def test_batch_on_two_threads_gives_one_threads_bytes(monkeypatch, route):
    """A batch's images split by FLOPs (par_gate.split_rows: prange's blocks on an idle machine, the
    intra-op pool's chunks where prange is unavailable): each image's output is computed alone, so
    the bytes do not depend on the thread count."""
    from isthmus.core.ops import conv_one_image, par_gate
    from tests.core.split_gate import pin_split_gate
    from tests.core.test_conv_forward import run_conv
    calls = []
    real = conv_one_image.OneImage._direct
    monkeypatch.setattr(conv_one_image.OneImage, "_direct", lambda self, *a: calls.append(1) or real(self, *a))
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 32, 10, 10)).astype(np.float32)
    w = (rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    one, _ = run_conv(x, w, b, 1, "SAME", 1, 1, "relu")
    used = []
    split = par_gate.split_rows
    monkeypatch.setattr(conv_one_image, "split_rows", lambda *a, **kw: used.append(split(*a, **kw)) or used[-1])
    pin_split_gate(monkeypatch, route)  # this small batch splits
    two, _ = run_conv(x, w, b, 1, "SAME", 1, 1, "relu")
    np.testing.assert_array_equal(one, two)
    assert len(calls) == 2 and used == [2]


@pytest.mark.parametrize("act", ["relu", "relu6"])
def test_batch_one_split_by_pixel_blocks_gives_one_calls_bytes(monkeypatch, act):
    """Batch 1 split by blocks of PB output pixels (jit.conv_direct.blocks_range, cut in three as three
    threads would by par_gate.split_rows) gives the bytes of the one whole call, and the reference's values."""
    from isthmus.core import threads
    from isthmus.core.ops import conv_one_image
    from isthmus.jit.conv_direct import PB
    from tests.core.test_conv_forward import check, run_conv
    calls = []
    real = conv_one_image.OneImage._direct
    monkeypatch.setattr(conv_one_image.OneImage, "_direct", lambda self, *a: calls.append(1) or real(self, *a))
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 32, 16, 17)).astype(np.float32)  # 272 pixels: blocks of 96, 96, 80
    w = (rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    cuts = []

    def three_cuts(kernel, args, total, work, flops=False):
        for i in range(3):
            kernel(*args, total * i // 3, total * (i + 1) // 3)
        cuts.append(total)
        return 3
    monkeypatch.setattr(conv_one_image, "split_rows", three_cuts)
    monkeypatch.setattr(conv_one_image, "may_split", lambda *a, **kw: True)  # as on an idle machine with work enough
    three, _ = run_conv(x, w, b, 1, "SAME", 1, 1, act)
    assert cuts == [-(-272 // PB)] and calls
    check(x, w, b, 1, "SAME", 1, 1, act)
    monkeypatch.setattr(conv_one_image, "may_split", lambda *a, **kw: False)  # no split: the one whole call
    one, _ = run_conv(x, w, b, 1, "SAME", 1, 1, act)
    np.testing.assert_array_equal(one, three)
    assert len(cuts) == 2  # check's run split too; the last run did not


@pytest.mark.parametrize("act", ["relu", "relu6"])
def test_batch_one_small_plane_split_by_channel_blocks_gives_one_calls_bytes(monkeypatch, act):
    """Batch 1 on a plane of one pixel block (6x6: a deep layer's) splits by blocks of 16 output channels
    (jit.conv_direct.channels_range, cut in three as three threads would), with a residual addend too:
    the bytes of the one whole call, and the reference's values."""
    from isthmus.core.ops import conv_one_image
    from isthmus.jit.conv_direct import NC
    from tests.core.test_conv_forward import check, run_conv
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 48, 6, 6)).astype(np.float32)
    w = (rng.standard_normal((80, 48, 3, 3)) / 20).astype(np.float32)  # 5 channel blocks
    b = rng.standard_normal(80).astype(np.float32)
    cuts = []

    def three_cuts(kernel, args, total, work, flops=False):
        for i in range(3):
            kernel(*args, total * i // 3, total * (i + 1) // 3)
        cuts.append((kernel.__name__, total))
        return 3
    monkeypatch.setattr(conv_one_image, "split_rows", three_cuts)
    monkeypatch.setattr(conv_one_image, "may_split", lambda *a, **kw: True)
    three, _ = run_conv(x, w, b, 1, "SAME", 1, 1, act)
    assert cuts == [("channels_range", 80 // NC)]
    check(x, w, b, 1, "SAME", 1, 1, act)
    monkeypatch.setattr(conv_one_image, "may_split", lambda *a, **kw: False)
    one, _ = run_conv(x, w, b, 1, "SAME", 1, 1, act)
    np.testing.assert_array_equal(one, three)


def test_channels_range_with_an_addend_matches_the_whole_call():
    """channels_range over uneven cuts, with the residual addend and a clamp, writes exactly what the
    whole conv_direct writes (each channel block of each pixel tile computed alone)."""
    from isthmus.jit.conv_direct import channels_range, pack_channels, pad_image, tables
    rng = np.random.default_rng(14)
    c, h, o = 24, 5, 64
    x = rng.standard_normal((1, c, h, h)).astype(np.float32)
    w = (rng.standard_normal((o, c, 3, 3)) / 15).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    r = rng.standard_normal((1, o, h * h)).astype(np.float32)
    whole = run(x, w, b, 1, 1, ((1, 1), (1, 1)), 0.0, 6.0, r=r)
    koff, pix, wp, size = tables(c, h, h, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, h, h)
    pad = np.zeros(size, np.float32)
    pad_image(x.reshape(c, h * h), h, h, 1, 1, wp, pad)
    y = np.full((o, h * h), np.nan, np.float32)
    wt = pack_channels(w.reshape(o, -1))
    for c0, c1 in ((0, 1), (1, 3), (3, 4)):
        channels_range(pad, koff, pix, wt, b, np.float32(0), np.float32(6), y, r[0], c0, c1)
    np.testing.assert_array_equal(y, whole[0])
    ref, _, _ = reference(x, w, b, 1, 1, ((1, 1), (1, 1)))
    np.testing.assert_allclose(y, np.clip(ref[0] + r[0], 0, 6), rtol=1e-5, atol=1e-5)
