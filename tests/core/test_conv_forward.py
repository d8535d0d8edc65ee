"""The forward convolution paths (depthwise compiled or chunked in numpy with stride phases,
per-image im2col, pointwise in image groups) and FusedConv2D's bias and activation, against a
float64 numpy reference that sums shifted input slices tap by tap. Depthwise tests taking the
`kernel_path` fixture run on both depthwise paths: the compiled kernel (isthmus.jit, numba) and
the numpy one (ISTHMUS_JIT=0)."""
import itertools
import zlib

import numpy as np
import pytest

import isthmus as ism
from isthmus.core.ops import conv as conv_ops
from isthmus.core.ops import conv_pointwise
from isthmus.core.ops import depthwise
from isthmus.core.ops.base import make

@pytest.fixture(params=["compiled", "numpy"])
def kernel_path(request, monkeypatch):
    """Runs the test on the compiled depthwise kernel, then on the numpy one."""
    from isthmus import jit
    monkeypatch.setenv("ISTHMUS_JIT", "1" if request.param == "compiled" else "0")
    assert jit.available() == (request.param == "compiled"), "numba is a dependency: it must import"
    return request.param


def numpy_path(monkeypatch):
    """For tests of the numpy kernel's own machinery (chunks, layouts, scratch arenas)."""
    monkeypatch.setenv("ISTHMUS_JIT", "0")


ACTS = {"none": lambda y: y, "relu": lambda y: np.maximum(y, 0), "relu6": lambda y: np.clip(y, 0, 6),
        "sigmoid": lambda y: 1 / (1 + np.exp(-y))}


def ref_conv(x, w, stride, pads, dil, groups):
    """float64 convolution: for every tap, the strided input slice times that tap's weights."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple(pads))
    oh = (xp.shape[2] - (kh - 1) * dil[0] - 1) // stride[0] + 1
    ow = (xp.shape[3] - (kw - 1) * dil[1] - 1) // stride[1] + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for gi in range(groups):
        xs = xp[:, gi * cg:(gi + 1) * cg]
        for a in range(kh):
            for e in range(kw):
                sl = xs[:, :, a * dil[0]:a * dil[0] + (oh - 1) * stride[0] + 1:stride[0],
                        e * dil[1]:e * dil[1] + (ow - 1) * stride[1] + 1:stride[1]]
                out[:, gi * og:(gi + 1) * og] += np.einsum("ncij,oc->noij", sl, w[gi * og:(gi + 1) * og, :, a, e])
    return out


def run_conv(x, w, bias, strides, padding, dilations, groups, act):
    """Run Conv2D (bias None) or FusedConv2D through a Session with passes off; -> (output, pads)."""
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder("float32", x.shape, name="x")
        y = ism.conv2d(xt, ism.constant(w), strides=strides, padding=padding, dilations=dilations, groups=groups)
        node = y.node
        if bias is not None:
            y = make("FusedConv2D", (xt, node.inputs[1], ism.constant(bias)),
                     {**{k: node.attrs[k] for k in ("strides", "dilations", "pads", "groups")},
                      "activation": act}).outputs[0]
        sess = ism.Session(g, optimize=False)
        x_before = x.copy()
        out = sess.run(y, {xt: x})
        np.testing.assert_array_equal(x, x_before)  # the kernel never writes into its input
    return out, node.attrs["pads"]


def check(x, w, bias, strides, padding, dilations, groups, act="none"):
    out, pads = run_conv(x, w, bias, strides, padding, dilations, groups, act)
    s = (strides, strides) if isinstance(strides, int) else strides
    d = (dilations, dilations) if isinstance(dilations, int) else dilations
    want = ref_conv(x, w, s, pads, d, groups)
    if bias is not None:
        want = ACTS[act](want + bias.reshape(1, -1, 1, 1))
    assert out.dtype == np.float32 and out.shape == want.shape and out.flags.c_contiguous
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


DW_CASES = list(itertools.product(
    [1, 3],                                   # batch
    [(3, 3), (5, 5), (1, 3)],                 # kernel
    [1, 2, (2, 1), 3],                        # strides
    ["SAME", "VALID", ((2, 0), (1, 2))],      # padding
    [1, 2]))                                  # dilations


@pytest.mark.parametrize("chunk", [64, None])
@pytest.mark.parametrize("batch,k,strides,padding,dil", DW_CASES[::3] + [DW_CASES[-1]])
def test_depthwise_against_reference(kernel_path, monkeypatch, chunk, batch, k, strides, padding, dil):
    if chunk is not None:  # tiny chunks: one (image, channel) row at a time, buffers reused
        monkeypatch.setattr(depthwise, "CHUNK_BYTES", chunk)
    rng = np.random.default_rng(zlib.crc32(repr((batch, k, strides, padding, dil)).encode()))  # hash() of a str is salted per process
    c = 5
    x = rng.standard_normal((batch, c, 11, 9)).astype(np.float32)
    w = rng.standard_normal((c, 1) + k).astype(np.float32)
    check(x, w, None, strides, padding, dil, c)


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("strides", [1, 2])
def test_fused_depthwise_bias_activation(kernel_path, monkeypatch, act, strides):
    monkeypatch.setattr(depthwise, "CHUNK_BYTES", 4096)
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 6, 10, 10)) * 3).astype(np.float32)
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    check(x, w, b, strides, "SAME", 1, 6, act)


def test_depthwise_large_batch_many_chunks(kernel_path):
    """MobileNet-like shape at batch > 1 with the default chunk size (several chunks)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 48, 24, 24)).astype(np.float32)
    w = rng.standard_normal((48, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    for s in (1, 2):
        check(x, w, b, s, "SAME", 1, 48, "relu6")


@pytest.mark.parametrize("chunk", [16, 200, None])
@pytest.mark.parametrize("act", ["none", "relu", "relu6", "sigmoid"])
@pytest.mark.parametrize("c,o", [(7, 6), (3, 8)])  # a projection; an expansion (bias in the product)
def test_pointwise_image_groups(kernel_path, monkeypatch, chunk, act, c, o):
    """Both paths: numpy's (bias in the product for an expansion, then the activation) and the
    compiled bias + clamp pass after each group's product (none, relu, relu6)."""
    if chunk is not None:  # one image per group; two images per group
        monkeypatch.setattr(conv_pointwise, "_POINTWISE_CHUNK_BYTES", chunk)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, c, 4, 3)).astype(np.float32)
    w = rng.standard_normal((o, c, 1, 1)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    check(x, w, None, 1, "VALID", 1, 1)
    check(x, w, b, 1, "VALID", 1, 1, act)


@pytest.mark.parametrize("groups,o,strides,padding,dil", [
    (1, 4, 2, "SAME", 1),           # a stem: 3 input channels, stride 2
    (1, 4, 1, "VALID", 2),
    (2, 6, (2, 1), ((1, 0), (2, 1)), 1),
    (4, 8, 1, "SAME", 1),          # channel multiplier 2: grouped, not depthwise
])
def test_general_conv_per_image(groups, o, strides, padding, dil):
    rng = np.random.default_rng(5)
    c = 3 if groups == 1 else 4
    x = rng.standard_normal((3, c, 9, 10)).astype(np.float32)
    w = rng.standard_normal((o, c // groups, 3, 3)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    check(x, w, None, strides, padding, dil, groups)
    check(x, w, b, strides, padding, dil, groups, "relu6")


@pytest.mark.parametrize("parts", [2, 3])
def test_depthwise_threads_split_rows_bit_identically(kernel_path, monkeypatch, parts):
    """Row ranges on threads (as many as BLAS has) give exactly the one-thread result."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 20, 12, 12)).astype(np.float32)
    w = rng.standard_normal((20, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(20).astype(np.float32)
    monkeypatch.setattr(depthwise, "CHUNK_BYTES", 4096)  # several chunks per part
    monkeypatch.setattr(depthwise, "THREAD_MIN_MACS", 0)
    monkeypatch.setattr(depthwise, "_MAX_THREADS", 4)
    outs = {}
    for t in (1, parts):
        monkeypatch.setattr(depthwise, "intra_threads", lambda t=t: t)
        assert depthwise.threads(10) == t
        outs[t] = run_conv(x, w, b, 2, "SAME", 1, 20, "relu6")[0]
    np.testing.assert_array_equal(outs[1], outs[parts])
    check(x, w, b, 2, "SAME", 1, 20, "relu6")


def test_depthwise_threads_follow_blas_limit():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(1):
        assert depthwise.threads(10 ** 9) == 1
    assert depthwise.threads(10) == 1  # small convolutions never pay a thread hand-off


def test_depthwise_weights_from_a_variable_are_never_cached_stale(kernel_path):
    """Tiled weights are kept only for read-only constants: a variable assigned between runs
    (its array may be updated in place) gives the new result."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal((2, 4, 7, 7)).astype(np.float32)
    w1, w2 = (rng.standard_normal((4, 1, 3, 3)).astype(np.float32) for _ in range(2))
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder("float32", x.shape, name="x")
        wv = ism.Variable(w1, name="w")
        y = ism.depthwise_conv2d(xt, wv, padding="SAME")
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
        a = sess.run(y, {xt: x})
        sess.set_variable_value(wv, w2)
        b = sess.run(y, {xt: x})
    pads = ((1, 1), (1, 1))
    np.testing.assert_allclose(a, ref_conv(x, w1, (1, 1), pads, (1, 1), 4), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(b, ref_conv(x, w2, (1, 1), pads, (1, 1), 4), rtol=2e-5, atol=2e-5)


def test_depthwise_concurrent_runs_share_one_kernel(kernel_path):
    """Runs of one plan on several threads each take their own scratch buffers."""
    import threading
    rng = np.random.default_rng(19)
    xs = [rng.standard_normal((2, 8, 10, 10)).astype(np.float32) for _ in range(4)]
    w = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder("float32", xs[0].shape, name="x")
        y = ism.conv2d(xt, ism.constant(w), strides=2, padding="SAME", groups=8)
        sess = ism.Session(g)
        want = [sess.run(y, {xt: x}) for x in xs]
        errors = []

        def worker(i):
            try:
                for _ in range(20):
                    np.testing.assert_array_equal(sess.run(y, {xt: xs[i]}), want[i])
            except Exception as e:  # reported below
                errors.append(e)
        ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in ts)
    np.testing.assert_allclose(want[0], ref_conv(xs[0], w, (2, 2), y.node.attrs["pads"], (1, 1), 8),
                               rtol=2e-5, atol=2e-5)


def test_depthwise_layouts_per_node_are_bounded(monkeypatch):
    """A node run at many batch sizes keeps the layouts (and scratch) of the newest few only."""
    numpy_path(monkeypatch)
    rng = np.random.default_rng(23)
    w = rng.standard_normal((3, 1, 3, 3)).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder("float32", (None, 3, 5, 5), name="x")
        y = ism.conv2d(xt, ism.constant(w), padding="SAME", groups=3)
        sess = ism.Session(g, optimize=False)
        for n in range(1, depthwise._MAX_LAYOUTS + 4):
            x = rng.standard_normal((n, 3, 5, 5)).astype(np.float32)
            np.testing.assert_allclose(sess.run(y, {xt: x}), ref_conv(x, w, (1, 1), ((1, 1), (1, 1)), (1, 1), 3),
                                       rtol=2e-5, atol=2e-5)
        kernel = sess.plan_for(y, {xt: x}).kernels[y.node]
    layouts = [c.cell_contents for c in kernel.__closure__ if isinstance(c.cell_contents, depthwise.DepthwiseConv)]
    assert len(layouts) == 1 and len(layouts[0]._layouts) == depthwise._MAX_LAYOUTS


@pytest.mark.parametrize("groups,o,k,s", [(4, 4, 3, 2), (4, 4, 3, 1), (1, 5, 3, 2), (1, 5, 1, 1)])
def test_float64_and_empty_batch(kernel_path, groups, o, k, s):
    """float64 runs in float64 (depthwise, general and pointwise paths); a batch of 0 gives an
    empty output of the right shape."""
    rng = np.random.default_rng(29)
    w = rng.standard_normal((o, 4 // groups, k, k))
    for n in (2, 0):
        x = rng.standard_normal((n, 4, 7, 6))
        g = ism.Graph(seed=0)
        with g.as_default():
            xt = ism.placeholder("float64", (None, 4, 7, 6), name="x")
            y = ism.conv2d(xt, ism.constant(w), strides=s, padding="SAME", groups=groups)
            out = ism.Session(g, optimize=False).run(y, {xt: x})
        want = ref_conv(x, w, (s, s), y.node.attrs["pads"], (1, 1), groups)
        assert out.dtype == np.float64 and out.shape == want.shape
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def test_scratch_arenas_are_shared_by_threads_not_kept_per_thread(monkeypatch):
    """Every thread's depthwise and 1x1 expansion runs take their scratch from one pool: 24 threads
    (as a gRPC server's workers) leave at most ARENAS.KEEP arenas behind, and all get the
    one-thread result."""
    import threading
    numpy_path(monkeypatch)
    rng = np.random.default_rng(19)
    x = rng.standard_normal((1, 8, 10, 10)).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder("float32", x.shape, name="x")
        e = ism.relu(ism.conv2d(xt, ism.constant(rng.standard_normal((32, 8, 1, 1)).astype(np.float32)), padding="VALID")
                     + ism.constant(rng.standard_normal((1, 32, 1, 1)).astype(np.float32)))
        y = ism.depthwise_conv2d(e, ism.constant(rng.standard_normal((32, 1, 3, 3)).astype(np.float32)), padding="SAME")
    sess = ism.Session(g)
    ref = sess.run(y, {xt: x})
    outs, errors = [], []

    def work():
        try:
            outs.append(sess.run(y, {xt: x}))
        except Exception as err:  # noqa: BLE001
            errors.append(err)
    for _ in range(3):
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert not errors and len(outs) == 24
    for o in outs:
        np.testing.assert_array_equal(o, ref)
    assert 1 <= len(depthwise.ARENAS._free[id(np)]) <= depthwise.ARENAS.KEEP


def test_compiled_depthwise_runs_when_available_and_not_when_switched_off(monkeypatch):
    """ISTHMUS_JIT picks the path at each run: the compiled kernel is called (and the numpy
    layouts stay unbuilt) when on; the numpy kernel when off; both give the reference."""
    from isthmus.jit import depthwise as jit_dw
    calls = []
    real = jit_dw.depthwise_rows
    monkeypatch.setattr(jit_dw, "depthwise_rows", lambda *a: calls.append(a[-2:]) or real(*a))
    rng = np.random.default_rng(31)
    x = rng.standard_normal((2, 6, 17, 17)).astype(np.float32)
    w = rng.standard_normal((6, 1, 5, 5)).astype(np.float32)  # 5x5: not the blocked kernel (3x3 only)
    for flag in ("1", "0"):
        monkeypatch.setenv("ISTHMUS_JIT", flag)
        calls.clear()
        check(x, w, None, 1, "SAME", 1, 6)
        assert (calls == [(0, 12)]) == (flag == "1"), calls


@pytest.mark.parametrize("act", ["none", "relu", "relu6"])
def test_compiled_depthwise_keeps_nan_and_inf_as_numpy_does(kernel_path, act):
    """The clamp inside the compiled loop lets NaN through and clamps inf, like numpy's passes."""
    x = np.ones((1, 2, 5, 5), np.float32)
    x[0, 0, 2, 2], x[0, 1, 0, 0] = np.nan, np.inf
    w = np.ones((2, 1, 3, 3), np.float32)
    b = np.zeros(2, np.float32)
    out, pads = run_conv(x, w, b, 1, "SAME", 1, 2, act)
    with np.errstate(invalid="ignore"):
        want = ACTS[act](ref_conv(x, w, (1, 1), pads, (1, 1), 2))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_allclose(np.nan_to_num(out, posinf=1e30), np.nan_to_num(want, posinf=1e30), rtol=1e-6)


def test_arena_pool_keeps_the_largest_arenas_of_mixed_sizes():
    """Giving back more than KEEP arenas of different sizes drops the smallest (it once compared
    arrays with == through list.remove and failed with a broadcast error)."""
    pool = depthwise._ArenaPool()
    sizes = [4096, 100, 7000, 50, 3000, 9000]
    for n in sizes:
        pool.give(np, np.empty(n, np.uint8))
    kept = sorted(a.nbytes for a in pool._free[id(np)])
    assert kept == sorted(sizes)[-pool.KEEP:]
    assert pool.take(np, 5000).nbytes >= 5000


@pytest.mark.parametrize("act", ["none", "relu", "relu6", "sigmoid"])
@pytest.mark.parametrize("batch", [1, 3])  # batch 1 takes per-image im2col, 3 the row taps (C*kw >= 64)
def test_fused_conv_row_taps_and_im2col_finish(kernel_path, act, batch):
    """FusedConv2D's bias and activation after the row-taps GEMMs and after per-image im2col: one
    compiled pass for none/relu/relu6 (isthmus.jit), numpy's add and activation otherwise."""
    rng = np.random.default_rng(zlib.crc32(f"rows{act}{batch}".encode()))
    x = rng.standard_normal((batch, 32, 7, 9)).astype(np.float32)
    w = (rng.standard_normal((24, 32, 3, 3)) * 0.1).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    assert conv_ops._row_taps(conv_ops._geometry(_FakeNode(), x.shape, w.shape), 32)
    check(x, w, b, 1, "SAME", 1, 1, act)


class _FakeNode:
    attrs = {"strides": (1, 1), "dilations": (1, 1), "pads": ((1, 1), (1, 1)), "groups": 1}


@pytest.mark.parametrize("batch", [1, 2])  # 1: the compiled im2col; 2: the row taps
def test_row_taps_weights_from_a_variable_are_never_cached_stale(batch):
    """Constant weights are relaid (row taps) or packed (batch 1) once; a variable's every run."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((batch, 32, 6, 6)).astype(np.float32)
    w1, w2 = (rng.standard_normal((2, 16, 32, 3, 3)) * 0.1).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        v = ism.Variable(w1, name="w")
        y = ism.conv2d(ism.constant(x), v, strides=1, padding="SAME")
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
        first = sess.run(y)
        sess.set_variable_value(v, w2)
        second = sess.run(y)
    pads = ((1, 1), (1, 1))
    np.testing.assert_allclose(first, ref_conv(x, w1, (1, 1), pads, (1, 1), 1), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(second, ref_conv(x, w2, (1, 1), pads, (1, 1), 1), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("act", ["none", "relu", "relu6", "sigmoid"])
@pytest.mark.parametrize("c,o,k,strides,dil,hw", [
    (1, 32, 5, 1, 1, 28),    # the CNN's first conv: packed GEMM (K 25)
    (3, 32, 3, 2, 1, 33),    # a stride-2 stem, odd size: packed GEMM (K 27)
    (32, 64, 5, 1, 1, 14),   # K 800: BLAS after the compiled gather
    (8, 30, 3, 1, 2, 11),    # O not a multiple of 4, dilation 2: BLAS
    (16, 24, 3, 1, 1, 3),    # 9 pixels (< 16): BLAS
])
def test_batch1_compiled_im2col_and_packed_gemm(kernel_path, act, c, o, k, strides, dil, hw):
    """Batch 1: the compiled im2col gather and, where it pays, jit.gemm_f32's packed GEMM with the
    bias and clamp in its epilogue (none/relu/relu6; sigmoid finishes in numpy), else BLAS."""
    rng = np.random.default_rng(zlib.crc32(f"b1{act}{c}{o}{k}{strides}{dil}{hw}".encode()))
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    check(x, w, b, strides, "SAME", dil, 1, act)
    check(x, w, None, strides, "VALID", dil, 1)


@pytest.mark.parametrize("act", ["relu6", "none"])
@pytest.mark.parametrize("c,o,hw", [(16, 96, 48), (96, 576, 6), (24, 144, 24), (32, 30, 12)])
def test_batch1_pointwise_packed_gemm(kernel_path, act, c, o, hw):
    """A batch-1 1x1 convolution through the packed GEMM (O a multiple of 4, K <= 256, >= 16 pixels:
    36 pixels leave a short last panel) or BLAS (O = 30), against float64."""
    rng = np.random.default_rng(zlib.crc32(f"pw1{act}{c}{o}{hw}".encode()))
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    check(x, w, b, 1, "VALID", 1, 1, act)
