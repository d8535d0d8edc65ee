"""Convolution and max-pool kernels split across intra-op threads give the numpy reference's results."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core import idle
from isthmus.core import threads
from isthmus.core.ops import intra_op, par_gate

pytestmark = pytest.mark.cpu  # the CPU's own kernels and threads (conftest.py)


@pytest.fixture
def fan_outs(monkeypatch):
    """Every pass fans out (no size threshold) and each fan-out's chunk count is recorded."""
    counts = []
    real = threads.fan_out

    def counting(fn, total, nbytes, blas_inside=False, min_chunk=None, flops=False):
        k = real(fn, total, nbytes, blas_inside, min_chunk, flops)
        counts.append(k)
        return k
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 1)
    monkeypatch.setattr(threads, "MIN_CHUNK_FLOPS", 1)
    monkeypatch.setattr(threads, "_handoff", [threads.HANDOFF_REF_S])  # chunk_scale() 1, whatever the machine
    monkeypatch.setattr(intra_op, "_BLAS_SERIAL_FLOPS", 0)
    monkeypatch.setattr(intra_op, "_KSPLIT_PART_FLOPS", 1)
    monkeypatch.setattr(intra_op, "fan_out", counting)
    monkeypatch.setattr(threads, "fan_out", counting)  # the kernels that call it directly (conv_rows)
    # compiled kernels split by prange (intra_op.par_rows) count too: the threads par_threads gives
    real_par = threads.par_threads
    monkeypatch.setattr(threads, "par_threads", lambda *a, **k: counts.append(real_par(*a, **k)) or counts[-1])
    real_k = par_gate._prange_k  # par_gate.split_rows's own reading of the same gates
    monkeypatch.setattr(par_gate, "_prange_k", lambda *a: counts.append(real_k(*a)) or counts[-1])
    monkeypatch.setattr(threads, "_prange_at", [0.0])  # a pinned prange hand-off, never measured again
    monkeypatch.setattr(threads, "_prange", [threads.HANDOFF_REF_S if _prange_safe() else False])
    monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
    return counts


def _prange_safe() -> bool:
    """Two cores and a threading layer that takes concurrent parallel calls (jit.par.layer_ok)."""
    from isthmus import jit
    if threads.cores() < 2 or not jit.available():
        return False
    from isthmus.jit import par
    return par.layer_ok()


def _conv_ref(x, w, pad):
    """y, and the gradients of sum(y * r) w.r.t. x and w, one kernel tap at a time (stride 1)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))).astype(np.float64)
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    y = np.zeros((n, o, oh, ow))
    for p in range(kh):
        for q in range(kw):
            y += np.einsum("nchw,oc->nohw", xp[:, :, p:p + oh, q:q + ow], w[:, :, p, q])
    return y, oh, ow


def _conv_grads_ref(x, w, r, pad):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))).astype(np.float64)
    oh, ow = r.shape[2], r.shape[3]
    dw = np.zeros(w.shape)
    dxp = np.zeros(xp.shape)
    for p in range(kh):
        for q in range(kw):
            dw[:, :, p, q] = np.einsum("nchw,nohw->oc", xp[:, :, p:p + oh, q:q + ow], r)
            dxp[:, :, p:p + oh, q:q + ow] += np.einsum("nohw,oc->nchw", r, w[:, :, p, q])
    return dxp[:, :, pad:pad + h, pad:pad + wd], dw


@pytest.mark.parametrize("c,o", [(1, 8), (16, 12)])  # the im2col path and the row-taps path
def test_conv_and_its_gradients_split_across_threads(fan_outs, c, o):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, c, 10, 10)).astype(np.float32)
    w = rng.standard_normal((o, c, 5, 5)).astype(np.float32) * 0.2
    b = rng.standard_normal(o).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        xt, wt = ism.placeholder(np.float32, x.shape, name="x"), ism.placeholder(np.float32, w.shape, name="w")
        bt = ism.placeholder(np.float32, (o,), name="b")
        y = ism.relu(ism.conv2d(xt, wt, padding="SAME") + ism.reshape(bt, (1, o, 1, 1)))
        rt = ism.placeholder(np.float32, (6, o, 10, 10), name="r")
        loss = ism.reduce_sum(y * rt)
        dx, dw = ism.gradients(loss, [xt, wt])
    r = rng.standard_normal((6, o, 10, 10)).astype(np.float32)
    got = ism.Session(g, intra_op_threads=2).run([y, dx, dw], {xt: x, wt: w, bt: b, rt: r})
    assert max(fan_outs) == 2  # the passes really were split
    pre, _, _ = _conv_ref(x, w, 2)
    pre += b.reshape(1, o, 1, 1)
    np.testing.assert_allclose(got[0], np.maximum(pre, 0), rtol=1e-4, atol=1e-4)
    ref_dx, ref_dw = _conv_grads_ref(x, w, r * (pre > 0), 2)
    np.testing.assert_allclose(got[1], ref_dx, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got[2], ref_dw, rtol=1e-4, atol=1e-3)
    one = ism.Session(g, intra_op_threads=1).run([y, dx, dw], {xt: x, wt: w, bt: b, rt: r})
    for a, e in zip(got, one):  # the split changes no arithmetic; BLAS on 2 threads may round otherwise
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


def test_max_pool_and_its_gradient_split_across_threads(fan_outs):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 3, 8, 8)).astype(np.float32)
    x[0, 0, 0, :2] = x[0, 0, 1, :2] = 9.0  # a tie: the first in row-major order takes the gradient
    g = ism.Graph()
    with g.as_default():
        xt = ism.placeholder(np.float32, x.shape, name="x")
        y = ism.max_pool(xt, 2)
        rt = ism.placeholder(np.float32, (5, 3, 4, 4), name="r")
        (dx,) = ism.gradients(ism.reduce_sum(y * rt), [xt])
    r = rng.standard_normal((5, 3, 4, 4)).astype(np.float32)
    got_y, got_dx = ism.Session(g, intra_op_threads=2).run([y, dx], {xt: x, rt: r})
    assert max(fan_outs) == 2
    win = x.reshape(5, 3, 4, 2, 4, 2).transpose(0, 1, 2, 4, 3, 5).reshape(5, 3, 4, 4, 4)
    np.testing.assert_array_equal(got_y, win.max(-1))
    arg = win.argmax(-1)  # numpy's argmax takes the first maximum
    ref = np.zeros((5, 3, 4, 4, 4), np.float32)
    np.put_along_axis(ref, arg[..., None], r[..., None], -1)
    ref = ref.reshape(5, 3, 4, 4, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(x.shape)
    np.testing.assert_array_equal(got_dx, ref)


@pytest.mark.parametrize("handoff_us", [5, 10, 80])
def test_small_passes_do_not_fan_out(monkeypatch, handoff_us):
    """A chunk carries at least MIN_CHUNK_BYTES, times the measured hand-off over 10 us when slower."""
    monkeypatch.setattr(threads, "_handoff", [handoff_us * 1e-6])
    least = threads.MIN_CHUNK_BYTES * max(1, handoff_us // 10)
    assert threads.min_chunk_bytes() == least
    assert threads.min_chunk_flops() == threads.MIN_CHUNK_FLOPS * max(1, handoff_us // 10)
    calls = []
    with threads.IntraOpThreads(2):
        k = threads.fan_out(lambda lo, hi: calls.append((lo, hi)), 64, 2 * least - 1)
        k2 = threads.fan_out(lambda lo, hi: calls.append((lo, hi)), 64, 2 * least)
    assert k == 1 and calls[0] == (0, 64)
    assert k2 == 2 and sorted(calls[1:]) == [(0, 32), (32, 64)]


def test_a_chunk_error_reaches_the_caller():
    def fail(lo, hi):
        if lo > 0:
            raise RuntimeError(f"chunk {lo}")
    with threads.IntraOpThreads(2), pytest.raises(RuntimeError, match="chunk 32"):
        threads.fan_out(fail, 64, 1 << 30)


def test_blas_runs_one_thread_inside_chunks_that_call_it():
    from threadpoolctl import threadpool_limits
    if threads.blas_threads_now() is None:
        pytest.skip("threadpoolctl sees no BLAS library")
    seen = []
    with threadpool_limits(2, user_api="blas"), threads.IntraOpThreads(2):
        threads.fan_out(lambda lo, hi: seen.append(threads.blas_threads_now()), 4, 1 << 30, blas_inside=True)
        assert seen == [1, 1]
        assert threads.blas_threads_now() == 2


@pytest.mark.parametrize("m,n", [(3, 40), (40, 3)])  # split by columns, then by rows
def test_split_matmul_matches_numpy(fan_outs, m, n):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((m, 17)).astype(np.float32)
    b = rng.standard_normal((17, n)).astype(np.float32)
    with threads.IntraOpThreads(2):
        got = intra_op.matmul(np, a, b.T.copy().T)  # a column-strided b, as the conv gradients pass
    assert fan_outs and set(fan_outs) == {2}  # split in two, by the pool or by prange
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def _images_spy(monkeypatch):
    """(core.ops.conv, a list that gains an entry per call of its compiled batch convolution);
    skips without numba."""
    from isthmus.core.ops import conv as conv_mod
    if not ism.jit.available():
        pytest.skip("numba is not available")
    from isthmus.core.ops import conv_one_image
    # constant weights would take the inference path (conv_one_image); this path serves variables
    monkeypatch.setattr(conv_one_image.OneImage, "batch_pays", lambda self, *a: False)
    used = []
    real = conv_mod._images_compiled
    monkeypatch.setattr(conv_mod, "_images_compiled", lambda *a: used.append(1) or real(*a))
    return conv_mod, used


@pytest.mark.parametrize("act", ["relu", "none"])
def test_compiled_batch_conv_splits_by_images_with_the_same_bytes(fan_outs, monkeypatch, act):
    """A batch's im2col convolution (few input channels: no row taps) runs as compiled calls over
    chunks of images (jit.conv_images); two threads give one thread's bytes, and both the float64
    reference's values."""
    conv_mod, used = _images_spy(monkeypatch)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 3, 9, 11)).astype(np.float32)
    w = rng.standard_normal((8, 3, 5, 5)).astype(np.float32) * 0.2
    b = rng.standard_normal(8).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        xt = ism.placeholder(np.float32, x.shape, name="x")
        y = ism.conv2d(xt, ism.constant(w), padding="SAME") + ism.reshape(ism.constant(b), (1, 8, 1, 1))
        y = ism.relu(y) if act == "relu" else y
    two = ism.Session(g, intra_op_threads=2).run(y, {xt: x})
    assert used and max(fan_outs) == 2
    one = ism.Session(g, intra_op_threads=1).run(y, {xt: x})
    assert two.tobytes() == one.tobytes()
    pre, _, _ = _conv_ref(x, w, 2)
    pre += b.reshape(1, 8, 1, 1)
    np.testing.assert_allclose(two, np.maximum(pre, 0) if act == "relu" else pre, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c,o,size", [(1, 8, 10), (16, 12, 10),  # [C, H, W, N] columns; row taps
                                      (1, 8, 28)])  # (n, oh, ow) columns gathered per part of the batch
def test_filter_gradients_split_along_the_contraction_give_one_threads_bytes(fan_outs, monkeypatch, c, o, size):
    """Conv2DBackpropFilter's GEMMs (small output, every pixel of the batch contracted) run as fixed
    parts of K on the threads: two threads give one thread's bytes, and the reference's values."""
    from isthmus.core.ops import conv as conv_mod
    from isthmus.core.ops import conv_rows
    parts = []
    real = intra_op.ksplit_parts
    for mod in (intra_op, conv_mod, conv_rows):
        monkeypatch.setattr(mod, "ksplit_parts", lambda *a: parts.append(real(*a)) or parts[-1])
    rng = np.random.default_rng(13)
    x = rng.standard_normal((6, c, size, size)).astype(np.float32)
    w = rng.standard_normal((o, c, 5, 5)).astype(np.float32) * 0.2
    r = rng.standard_normal((6, o, size, size)).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        xt, wt = ism.placeholder(np.float32, x.shape, name="x"), ism.placeholder(np.float32, w.shape, name="w")
        rt = ism.placeholder(np.float32, r.shape, name="r")
        (dw,) = ism.gradients(ism.reduce_sum(ism.conv2d(xt, wt, padding="SAME") * rt), [wt])
    feed = {xt: x, wt: w, rt: r}
    two = ism.Session(g, intra_op_threads=2).run(dw, feed)
    assert parts and min(parts) > 1 and max(fan_outs) == 2
    one = ism.Session(g, intra_op_threads=1).run(dw, feed)
    assert two.tobytes() == one.tobytes()
    np.testing.assert_allclose(two, _conv_grads_ref(x, w, r, 2)[1], rtol=1e-4, atol=1e-3)


def test_matmul_ksplit_sums_fixed_parts_whatever_the_threads(fan_outs):
    rng = np.random.default_rng(17)
    a = rng.standard_normal((5, 3000)).astype(np.float32)
    b = rng.standard_normal((7, 3000)).astype(np.float32).T  # a transposed view, as the gradients pass
    assert intra_op.ksplit_parts(5, 3000, 7) == intra_op._KSPLIT_MAX_PARTS
    with threads.IntraOpThreads(2):
        two = intra_op.matmul_ksplit(np, a, b)
    assert fan_outs == [2]
    with threads.IntraOpThreads(1):
        one = intra_op.matmul_ksplit(np, a, b, out=np.empty((5, 7), np.float32))
    assert two.tobytes() == one.tobytes()
    np.testing.assert_allclose(two, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert intra_op.ksplit_parts(64, 100, 64) == 1  # a short contraction: matmul's row/column split


@pytest.mark.parametrize("strides,padding,dilations", [(2, "VALID", 1), (1, "SAME", 2), (2, "SAME", 1)])
def test_compiled_batch_conv_geometries_match_the_blas_path(fan_outs, monkeypatch, strides, padding, dilations):
    """Strided, dilated and unpadded windows through jit.conv_images give the per-image BLAS path's
    values (to rounding), and one thread's bytes on two."""
    conv_mod, used = _images_spy(monkeypatch)
    rng = np.random.default_rng(19)
    x = rng.standard_normal((4, 2, 13, 12)).astype(np.float32)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        xt = ism.placeholder(np.float32, x.shape, name="x")
        y = ism.relu(ism.conv2d(xt, ism.constant(w), strides, padding, dilations)
                     + ism.reshape(ism.constant(b), (1, 4, 1, 1)))
    two = ism.Session(g, intra_op_threads=2).run(y, {xt: x})
    one = ism.Session(g, intra_op_threads=1).run(y, {xt: x})
    assert used and two.tobytes() == one.tobytes()
    monkeypatch.setattr(conv_mod, "_images_compiled_pays", lambda *a: False)
    blas = ism.Session(g, intra_op_threads=1).run(y, {xt: x})
    np.testing.assert_allclose(two, blas, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opt", ["sgd", "momentum", "adam"])
def test_dense_updates_split_across_threads_give_numpys_bytes(fan_outs, opt):
    """A dense optimizer update runs in chunks of the variable on the threads; its rules are
    elementwise, so the variable's bytes equal the unsplit numpy update's (one thread, no split)."""
    rng = np.random.default_rng(23)
    w0 = rng.standard_normal((37, 11)).astype(np.float32)
    gv = rng.standard_normal((11, 37)).astype(np.float32).T  # a transposed gradient: chunks along rows
    make = {"sgd": lambda: ism.optimizers.SGD(0.1), "momentum": lambda: ism.optimizers.Momentum(0.1, 0.9),
            "adam": lambda: ism.optimizers.Adam(0.01)}[opt]

    def run(threads_):
        g = ism.Graph()
        with g.as_default():
            v = ism.Variable(w0.copy(), name="v")
            gp = ism.placeholder(np.float32, gv.shape, name="g")
            train = make().apply_gradients([(gp, v)])
            sess = ism.Session(g, intra_op_threads=threads_)
            sess.run(ism.global_variables_initializer())
            for _ in range(3):
                sess.run(train, {gp: gv})
            return sess.run(v)
    fan_outs.clear()
    two = run(2)
    assert max(fan_outs) == 2
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(threads, "MIN_CHUNK_BYTES", 1 << 40)  # nothing splits: the plain numpy update
        one = run(1)
    assert two.tobytes() == one.tobytes()
    if opt == "sgd":
        np.testing.assert_allclose(two, w0 - 0.3 * gv.astype(np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("acc_min_o", [0, 10 ** 9], ids=["gemm_per_kernel_row", "gemm_per_input_row"])
@pytest.mark.parametrize("block_cols", [1, 10 ** 9], ids=["a_block_per_row", "one_block"])
def test_row_tap_conv_and_gradients_give_one_threads_bytes(fan_outs, monkeypatch, block_cols, acc_min_o):
    """Row-tap convolutions (conv_rows) cut the output rows among the threads: each output element
    gets its kernel rows' products in the same order on any cut, so 2 threads give 1 thread's bytes
    for the forward pass, the input gradient and the filter gradient."""
    from isthmus.core.ops import conv_rows
    monkeypatch.setattr(conv_rows, "_BLOCK_MIN_COLS", block_cols)
    monkeypatch.setattr(threads, "cores", lambda: 64)  # blocks as on a 64-core machine: one per row
    monkeypatch.setattr(conv_rows, "_ACC_MIN_O", acc_min_o)
    used = []
    real = conv_rows.conv_rows
    monkeypatch.setattr(conv_rows, "conv_rows", lambda *a: used.append(1) or real(*a))
    from isthmus.core.ops import conv as conv_mod
    monkeypatch.setattr(conv_mod, "conv_rows", conv_rows.conv_rows)
    rng = np.random.default_rng(31)
    x = rng.standard_normal((3, 16, 9, 7)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 5)).astype(np.float32) * 0.2
    b = rng.standard_normal(16).astype(np.float32)
    r = rng.standard_normal((3, 16, 9, 7)).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        xt, wt = ism.placeholder(np.float32, x.shape, name="x"), ism.placeholder(np.float32, w.shape, name="w")
        y = ism.relu(ism.conv2d(xt, wt, padding="SAME") + ism.reshape(ism.constant(b), (1, 16, 1, 1)))
        rt = ism.placeholder(np.float32, r.shape, name="r")
        dx, dw = ism.gradients(ism.reduce_sum(y * rt), [xt, wt])
    feed = {xt: x, wt: w, rt: r}
    two = ism.Session(g, intra_op_threads=2).run([y, dx, dw], feed)
    assert len(used) == 2 and max(fan_outs) == 2  # forward and input gradient through conv_rows, split
    one = ism.Session(g, intra_op_threads=1).run([y, dx, dw], feed)
    for name, a, e in zip(["y", "dx", "dw"], two, one):
        assert a.tobytes() == e.tobytes(), (name, np.abs(a - e).max())
    xp_ = np.pad(x, ((0, 0), (0, 0), (1, 1), (2, 2))).astype(np.float64)
    pre = sum(np.einsum("nchw,oc->nohw", xp_[:, :, i:i + 9, j:j + 7], w[:, :, i, j])
              for i in range(3) for j in range(5))
    pre += b.reshape(1, 16, 1, 1)
    np.testing.assert_allclose(two[0], np.maximum(pre, 0), rtol=1e-4, atol=1e-4)
    dy = r * (pre > 0)
    want_dw = np.stack([np.stack([np.einsum("nchw,nohw->oc", xp_[:, :, i:i + 9, j:j + 7], dy) for j in range(5)], -1)
                        for i in range(3)], -2)
    np.testing.assert_allclose(two[2], want_dw, rtol=1e-4, atol=1e-3)
