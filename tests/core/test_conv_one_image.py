"""Batch-1 convolutions (conv_one_image: im2col with the padding written in place, at a padded row
stride, then the packed GEMM or BLAS) against test_conv_forward's float64 reference, and the
gather itself against numpy's windows."""
import numpy as np
import pytest

import isthmus as ism
from isthmus import jit
from isthmus.core.ops import conv_one_image

from .split_gate import pin_split_gate
from .test_conv_forward import check, run_conv

pytestmark = pytest.mark.skipif(not jit.available(), reason="needs numba")


@pytest.mark.parametrize("k,s,d,top,left,h,w", [
    (3, 1, 1, 1, 1, 9, 11), (7, 2, 1, 3, 3, 20, 17), (3, 3, 2, 2, 0, 13, 13), (5, 1, 1, 4, 4, 4, 6),
    (2, 2, 1, 0, 1, 7, 8), (1, 2, 1, 0, 0, 8, 8)])
def test_im2col_writes_the_padding_in_place(k, s, d, top, left, h, w):
    from isthmus.jit.gemm_f32 import im2col_ld, leading_dim
    rng = np.random.default_rng(k * 100 + s * 10 + h)
    c = 3
    x = rng.standard_normal((c, h, w)).astype(np.float32)
    bottom, right = top + 1, left  # asymmetric along H
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right)))
    oh, ow = (h + top + bottom - (k - 1) * d - 1) // s + 1, (w + 2 * left - (k - 1) * d - 1) // s + 1
    want = np.empty((c, k, k, oh, ow), np.float32)
    for ky in range(k):
        for kx in range(k):
            want[:, ky, kx] = xp[:, ky * d:ky * d + (oh - 1) * s + 1:s, kx * d:kx * d + (ow - 1) * s + 1:s]
    ldx = leading_dim(oh * ow)
    cols = np.full(c * k * k * ldx, np.nan, np.float32)
    geo = np.array([k, k, s, s, d, d, top, bottom, left, right, oh, ow], np.int64)
    im2col_ld(x.reshape(c, h * w), h, w, geo, cols.reshape(c * k * k, ldx))
    np.testing.assert_array_equal(cols.reshape(c * k * k, ldx)[:, :oh * ow], want.reshape(c * k * k, oh * ow))


@pytest.fixture
def chosen(monkeypatch):
    """Records, per batch-1 convolution planned, whether the packed GEMM was chosen."""
    picks = []
    real = conv_one_image.OneImage._plan
    monkeypatch.setattr(conv_one_image.OneImage, "_plan",
                        lambda self, *a: picks.append(real(self, *a)[4]) or self._plans[a[0]])
    return picks


@pytest.mark.parametrize("act", ["relu", "none", "sigmoid"])
@pytest.mark.parametrize("c,o,k,strides,padding,dil,hw,packed", [
    (3, 32, 7, 2, ((3, 3), (3, 3)), 1, 64, True),   # ResNet's stem: 1024 pixels, K 147: packed
    (32, 16, 3, 2, "SAME", 1, 96, True),           # 2304 pixels, K 288 at stride 2: jit.conv_direct
    (32, 12, 3, 2, "SAME", 1, 96, False),          # the same with 12 outputs (not 16s): BLAS
    (3, 16, 3, 2, "SAME", 1, 64, True),           # a shallow stem (K 27, 16 outputs): jit.conv_direct
    (32, 64, 3, 1, "SAME", 1, 16, True),          # K 288 on 256 pixels: packed at a padded stride
    (16, 24, 5, 1, ((2, 0), (1, 2)), 2, 12, True),  # dilated, asymmetric padding
    (8, 20, 3, 3, "VALID", 1, 23, True),          # stride 3
])
def test_batch1_paths_match_the_reference(chosen, act, c, o, k, strides, padding, dil, hw, packed):
    rng = np.random.default_rng(c * 1000 + o * 10 + k)
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    check(x, w, b, strides, padding, dil, 1, act)
    assert chosen == [packed and act != "sigmoid"]


@pytest.mark.parametrize("n,o,direct", [(1, 32, True), (1, 64, False), (2, 32, False)])
def test_shallow_stems_take_conv_direct_at_batch_1_up_to_32_outputs(monkeypatch, n, o, direct):
    """MobileNetV2's 3 -> 32 3x3/s2 stem (K 27) on jit.conv_direct at batch 1; SqueezeNet's 64 outputs
    and batches keep im2col + the packed GEMM. Each matches the reference."""
    served = []
    real = conv_one_image.OneImage._direct
    monkeypatch.setattr(conv_one_image.OneImage, "_direct", lambda self, *a: served.append(1) or real(self, *a))
    rng = np.random.default_rng(o + n)
    x = rng.standard_normal((n, 3, 40, 40)).astype(np.float32)
    w = (rng.standard_normal((o, 3, 3, 3)) / 5).astype(np.float32)
    check(x, w, rng.standard_normal(o).astype(np.float32), 2, "SAME", 1, 1, "relu6")
    assert bool(served) == direct


@pytest.fixture
def batches(monkeypatch):
    """Counts the batches the compiled image-by-image path serves."""
    calls = []
    real = conv_one_image.OneImage.batch
    monkeypatch.setattr(conv_one_image.OneImage, "batch", lambda self, *a: calls.append(1) or real(self, *a))
    return calls


@pytest.mark.parametrize("act", ["relu", "none", "relu6"])
@pytest.mark.parametrize("n,c,o,k,strides,padding,hw,served", [
    (3, 3, 16, 7, 2, ((3, 3), (3, 3)), 32, True),  # a 7x7 stem (K 147) on 256 pixels
    (2, 32, 32, 3, 1, "SAME", 16, True),           # ResNet's 16x16 stage (K 288, 256 pixels)
    (4, 8, 20, 3, 2, ((0, 1), (1, 0)), 13, True),  # stride 2, asymmetric padding
    (2, 16, 30, 3, 1, "SAME", 8, False),           # O not a multiple of 4: the BLAS paths
])
def test_batches_image_by_image_match_the_reference(batches, act, n, c, o, k, strides, padding, hw, served):
    rng = np.random.default_rng(n * 1000 + c * 10 + o)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    check(x, w, rng.standard_normal(o).astype(np.float32), strides, padding, 1, 1, act)
    assert bool(batches) == served


@pytest.mark.parametrize("route", ["prange", "pool"])
@pytest.mark.parametrize("hw", [10, 30])  # im2col per image; 30 columns: jit.conv_wide
def test_batch_split_over_threads_gives_one_threads_bytes(batches, monkeypatch, hw, route):
    """A batch's images split by FLOPs (par_gate.split_rows: prange's blocks on an idle machine, the
    intra-op pool's chunks where prange is unavailable) give the bytes of one thread's run."""
    from isthmus.core.ops import par_gate
    rng = np.random.default_rng(9)
    x = rng.standard_normal((5, 8, hw, hw)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    one, _ = run_conv(x, w, b, 1, "SAME", 1, 1, "relu")
    used = []
    real = par_gate.split_rows
    monkeypatch.setattr(conv_one_image, "split_rows", lambda *a, **kw: used.append(real(*a, **kw)) or used[-1])
    pin_split_gate(monkeypatch, route)  # these small convolutions split
    two, _ = run_conv(x, w, b, 1, "SAME", 1, 1, "relu")
    np.testing.assert_array_equal(one, two)
    assert len(batches) == 2 and used == [2]


@pytest.fixture
def wide(monkeypatch):
    """Counts the convolutions jit.conv_wide serves (no im2col)."""
    calls = []
    real = conv_one_image.OneImage._wide
    monkeypatch.setattr(conv_one_image.OneImage, "_wide", lambda self, *a: calls.append(1) or real(self, *a))
    return calls


@pytest.mark.parametrize("act", ["relu", "none", "relu6"])
@pytest.mark.parametrize("n,c,o,k,padding,dil,hw,served", [
    (1, 8, 8, 3, "SAME", 1, 30, True),              # 30 columns
    (1, 1, 8, 5, "SAME", 1, 28, False),             # one channel (k = 25): im2col
    (1, 32, 12, 3, ((2, 0), (1, 2)), 2, 17, True),  # dilated, asymmetric padding, 32 channels on 16 columns
    (3, 5, 20, 5, "VALID", 1, 33, True),            # a batch, no padding, 5x5 (20 outputs: not conv_direct's)
    (1, 8, 16, 3, "SAME", 1, 16, False),            # 16 columns, 8 channels: im2col
])
def test_stride1_without_im2col_matches_the_reference(wide, act, n, c, o, k, padding, dil, hw, served):
    rng = np.random.default_rng(n * 100 + c + hw)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    check(x, w, rng.standard_normal(o).astype(np.float32), 1, padding, dil, 1, act)
    assert bool(wide) == served


@pytest.mark.parametrize("act", ["relu6", "none"])
@pytest.mark.parametrize("n,c,o,hw,served", [(3, 24, 36, 6, True), (4, 16, 96, 9, True), (2, 8, 30, 6, False),
                                              (2, 40, 24, 6, False)])  # a projection: BLAS
def test_batch_pointwise_on_the_packed_gemm(monkeypatch, act, n, c, o, hw, served):
    """A batch's 1x1 expansions image by image on the packed GEMM (O a multiple of 4), else BLAS."""
    from isthmus.core.ops import conv_pointwise
    calls = []
    real = conv_pointwise.PackedGemm.images
    monkeypatch.setattr(conv_pointwise.PackedGemm, "images", lambda self, *a: calls.append(1) or real(self, *a))
    rng = np.random.default_rng(n + c + o)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    check(x, w, rng.standard_normal(o).astype(np.float32), 1, "VALID", 1, 1, act)
    assert bool(calls) == served


@pytest.mark.parametrize("route", ["prange", "pool"])
def test_batch1_stem_splits_its_gemm_by_column_blocks_with_one_calls_bytes(monkeypatch, route):
    """A batch-1 stem on the packed im2col GEMM (three channels, 64 outputs: not conv_direct) splits its
    product by blocks of COLS_BLOCK pixels (gemm_f32.cols_range) after the gather: the bytes of the
    one whole call (jit.gemm_f32.conv_image_ld), and the reference's values."""
    from isthmus.core import threads
    from isthmus.core.ops import par_gate
    rng = np.random.default_rng(17)
    x = rng.standard_normal((1, 3, 40, 38)).astype(np.float32)
    w = (rng.standard_normal((64, 3, 3, 3)) / 5).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    with monkeypatch.context() as m:
        m.setattr(threads, "intra_threads", lambda: 1)  # the one whole call
        one, _ = run_conv(x, w, b, 2, "SAME", 1, 1, "relu")
    used = []
    real = par_gate.split_rows
    monkeypatch.setattr(conv_one_image, "split_rows",
                        lambda *a, **kw: used.append((a[0].__name__, real(*a, **kw))) or used[-1][1])
    pin_split_gate(monkeypatch, route)  # this small stem splits
    two, _ = run_conv(x, w, b, 2, "SAME", 1, 1, "relu")
    np.testing.assert_array_equal(one, two)
    assert used and used[0][0] == "cols_range" and used[0][1] == 2
    check(x, w, b, 2, "SAME", 1, 1, "relu")


@pytest.mark.parametrize("route", ["prange", "pool"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hw,o", [(24, 32), (6, 64)])  # 6 blocks of 96 pixels; one, so 4 of 16 channels
def test_settled_conv_direct_route_splits_with_one_threads_bytes(monkeypatch, route, residual, hw, o):
    """A batch-1 conv_direct convolution's settled route (OneImage._direct_runner, conv_bound) on later
    runs: split by prange (the driver called by the route itself) or on the pool (through _direct), the
    bytes of the one-thread runs and the reference's values."""
    from isthmus.core import threads
    from isthmus.core.ops import conv_bound
    from .test_conv_forward import ref_conv
    rng = np.random.default_rng(hw + o)
    c = 32
    w = (rng.standard_normal((o, c, 3, 3)) / np.sqrt(c * 9)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, c, hw, hw), name="x")
        r = ism.placeholder("float32", (1, o, hw, hw), name="r")
        z = ism.bias_add(ism.conv2d(x, ism.constant(w), padding="SAME"), ism.constant(b), axis=1)
        y = ism.relu(z + r if residual else z)
    feeds = [{x: rng.standard_normal((1, c, hw, hw)).astype(np.float32),
              r: rng.standard_normal((1, o, hw, hw)).astype(np.float32)} for _ in range(3)]
    if not residual:
        feeds = [{x: f[x]} for f in feeds]
    with monkeypatch.context() as m:
        m.setattr(threads, "intra_threads", lambda: 1)
        sess = ism.Session(g)
        one = [sess.run(y, f) for f in feeds]
    served, split = [], []
    real_get, real_k = conv_bound.BoundRoutes.get, conv_one_image.prange_threads
    monkeypatch.setattr(conv_bound.BoundRoutes, "get", lambda self, *a: served.append(real_get(self, *a)) or served[-1])
    monkeypatch.setattr(conv_one_image, "prange_threads", lambda *a, **kw: split.append(real_k(*a, **kw)) or split[-1])
    direct = []
    real_direct = conv_one_image.OneImage._direct
    monkeypatch.setattr(conv_one_image.OneImage, "_direct", lambda self, *a: direct.append(1) or real_direct(self, *a))
    pin_split_gate(monkeypatch, route)
    sess = ism.Session(g)
    two = [sess.run(y, f) for f in feeds]
    for a, b2 in zip(one, two):
        np.testing.assert_array_equal(a, b2)
    assert served[0] is None and all(s is not None for s in served[1:])  # later runs on the settled route
    if route == "prange":
        assert split and all(k == 2 for k in split) and len(direct) == 1  # _direct only on the first run
    else:
        assert split == [0, 0] and len(direct) == 3  # the pool's split: the route hands over to _direct
    for f, got in zip(feeds, two):
        want = ref_conv(f[x], w, (1, 1), ((1, 1), (1, 1)), (1, 1), 1) + b.reshape(1, -1, 1, 1)
        np.testing.assert_allclose(got, np.maximum(want + f[r] if residual else want, 0), rtol=2e-5, atol=2e-5)
