"""The non-GEMM kernels split across numba's threads (intra_op.par_rows): the blocked and per-plane
depthwise convolutions, the 3x3, any-window and 2x2 max pools (and the 2x2 pool's gradient), batch
norm and Concat give the same bytes at intra_op_threads 1 and 2, and the numpy reference's values."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core import idle
from isthmus import jit
from isthmus.core import threads
from isthmus.core.ops import depthwise, nn, pool
from isthmus.core.ops.base import make

from .test_conv_forward import ACTS, ref_conv

pytestmark = [pytest.mark.skipif(not jit.available(), reason="needs numba"), pytest.mark.cpu]


@pytest.fixture(params=["prange", "pool"])
def splits(monkeypatch, request):
    """Every compiled kernel is worth splitting (1-byte least chunks, a pinned 10 us prange hand-off),
    by prange (the pool's hand-off pinned at 100 s: fan_out never pays) or on the intra-op pool (its
    hand-off pinned at 10 us: fan_out always pays); records the threads each split_rows call
    (par_gate) of the depthwise, pool and batch-norm ops used."""
    from isthmus.core.ops import par_gate
    monkeypatch.setattr(threads, "_handoff", [100.0 if request.param == "prange" else threads.HANDOFF_REF_S])
    monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
    from isthmus.jit import par
    if threads.cores() < 2 or not par.layer_ok():
        pytest.skip("needs two cores and a threading layer that takes concurrent parallel calls")
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 1)
    monkeypatch.setattr(threads, "MIN_CHUNK_FLOPS", 1)
    monkeypatch.setattr(threads, "_prange", [threads.HANDOFF_REF_S])
    monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
    monkeypatch.setattr(threads, "_prange_at", [0.0])  # pinned: never measured again
    used = []
    for mod in (depthwise, pool, nn):
        real = mod.split_rows
        monkeypatch.setattr(mod, "split_rows", lambda *a, _r=real, **k: used.append(_r(*a, **k)) or used[-1])
    return used


def _one_and_two(g, fetch, feed, used):
    """The fetch at intra_op_threads 2 (asserting it split) and 1 (asserting it did not), same bytes."""
    two = ism.Session(g, optimize=False, intra_op_threads=2).run(fetch, feed)
    assert used and max(used) == 2
    used.clear()
    one = ism.Session(g, optimize=False, intra_op_threads=1).run(fetch, feed)
    assert used and max(used) == 1
    for a, b in zip(two if isinstance(two, list) else [two], one if isinstance(one, list) else [one]):
        assert a.tobytes() == b.tobytes()
    return one


@pytest.mark.parametrize("n,c,hw,stride,act", [(1, 20, 16, 1, "relu6"), (3, 13, 11, 2, "relu"), (2, 8, 6, 1, "relu6")])
def test_blocked_depthwise_same_bytes_at_one_and_two_threads(splits, n, c, hw, stride, act):
    rng = np.random.default_rng(n * 100 + c)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder("float32", x.shape, name="x")
        y = ism.conv2d(xt, ism.constant(w), strides=stride, padding="SAME", groups=c)
        node = y.node
        y = make("FusedConv2D", (xt, node.inputs[1], ism.constant(b)),
                 {**{k: node.attrs[k] for k in ("strides", "dilations", "pads", "groups")},
                  "activation": act}).outputs[0]
    got = _one_and_two(g, y, {xt: x}, splits)
    want = ACTS[act](ref_conv(x, w, (stride, stride), node.attrs["pads"], (1, 1), c) + b.reshape(1, -1, 1, 1))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def _ref_max_pool(x, k, s, pads):
    (t, b), (l, r) = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, b), (l, r)), constant_values=-np.inf)
    oh, ow = (xp.shape[2] - k) // s + 1, (xp.shape[3] - k) // s + 1
    out = np.full(x.shape[:2] + (oh, ow), -np.inf)
    for i in range(k):
        for j in range(k):
            out = np.maximum(out, xp[:, :, i:i + s * oh:s, j:j + s * ow:s])
    return out


@pytest.mark.parametrize("shape,k,s,padding,pads", [
    ((1, 24, 15, 15), 3, 2, "VALID", ((0, 0), (0, 0))),   # the blocked 3x3 kernel, a short last block
    ((2, 13, 16, 16), 3, 1, "SAME", ((1, 1), (1, 1))),    # blocked, padded, batch 2
    ((1, 6, 17, 17), 3, 2, "VALID", ((0, 0), (0, 0))),    # under 16 planes: the window kernel
    ((3, 5, 12, 12), 5, 1, "SAME", ((2, 2), (2, 2))),     # 5x5: the window kernel
    ((2, 7, 12, 10), 2, 2, "VALID", ((0, 0), (0, 0))),    # 2x2 pairs
])
def test_max_pools_same_bytes_at_one_and_two_threads(splits, shape, k, s, padding, pads):
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder("float32", shape, name="x")
        y = ism.max_pool(xt, k, s, padding)
    got = _one_and_two(g, y, {xt: x}, splits)
    np.testing.assert_array_equal(got, _ref_max_pool(x, k, s, pads).astype(np.float32))


def test_max_pool_grad_same_bytes_at_one_and_two_threads(splits):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 5, 8, 12)).astype(np.float32)
    r = rng.standard_normal((3, 5, 4, 6)).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder("float32", x.shape, name="x")
        rt = ism.placeholder("float32", r.shape, name="r")
        y = ism.max_pool(xt, 2)
        dx = ism.gradients(ism.reduce_sum(y * rt), [xt])[0]
    got = _one_and_two(g, dx, {xt: x, rt: r}, splits)
    # reference: each window's gradient to its first maximum (row-major), as numpy's argmax takes it
    want = np.zeros_like(x)
    for n, c, i, j in np.ndindex(3, 5, 4, 6):
        win = x[n, c, 2 * i:2 * i + 2, 2 * j:2 * j + 2]
        p, q = np.unravel_index(np.argmax(win), (2, 2))
        want[n, c, 2 * i + p, 2 * j + q] = r[n, c, i, j]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("axis", [1, 2, -1])
def test_concat_split_by_images_same_bytes_at_one_and_two_threads(monkeypatch, axis):
    """A large Concat past the first axis copies in chunks of images on the intra-op threads: the
    bytes of np.concatenate at one and two threads."""
    from isthmus.core.ops import array, intra_op
    chunks = []
    real = threads.fan_out

    def counting(fn, total, nbytes, blas_inside=False, min_chunk=None, flops=False):
        chunks.append(real(fn, total, nbytes, blas_inside, min_chunk, flops))
        return chunks[-1]
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 1)
    monkeypatch.setattr(threads, "_handoff", [threads.HANDOFF_REF_S])  # chunk_scale() 1, whatever the machine
    monkeypatch.setattr(array, "_CONCAT_SPLIT_BYTES", 0)
    monkeypatch.setattr(intra_op, "fan_out", counting)
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((5, c, 3, 4)).astype(np.float32) for c in (2, 7, 3)]
    if axis != 1:
        xs = [np.ascontiguousarray(np.moveaxis(x, 1, axis)) for x in xs]
    g = ism.Graph(seed=0)
    with g.as_default():
        ts = [ism.placeholder("float32", x.shape, name=f"x{i}") for i, x in enumerate(xs)]
        y = ism.concat(ts, axis=axis)
    feed = dict(zip(ts, xs))
    two = ism.Session(g, optimize=False, intra_op_threads=2).run(y, feed)
    assert chunks and max(chunks) == 2
    chunks.clear()
    one = ism.Session(g, optimize=False, intra_op_threads=1).run(y, feed)
    assert chunks == [1]
    want = np.concatenate(xs, axis=axis)
    assert two.tobytes() == one.tobytes() == want.tobytes()


@pytest.mark.parametrize("n,c,hw,k,stride,dil", [(2, 5, 12, 3, 1, 1), (3, 4, 11, 3, 2, 1), (2, 3, 10, 5, 1, 1),
                                                 (1, 6, 9, 3, 1, 2)])
def test_per_plane_depthwise_and_input_grad_same_bytes_at_one_and_two_threads(splits, n, c, hw, k, stride, dil):
    """Weights fed at run time (not constant: the per-plane kernel, jit.depthwise) forward and input
    gradient split by (image, channel) planes: one thread's bytes, and the float64 reference's values."""
    rng = np.random.default_rng(n * 10 + c + k)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    r = None
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder("float32", x.shape, name="x")
        wt = ism.placeholder("float32", w.shape, name="w")
        y = ism.conv2d(xt, wt, strides=stride, padding="SAME", dilations=dil, groups=c)
        r = rng.standard_normal(y.shape).astype(np.float32)
        rt = ism.placeholder("float32", r.shape, name="r")
        dx = ism.gradients(ism.reduce_sum(y * rt), [xt])[0]
    got_y, got_dx = _one_and_two(g, [y, dx], {xt: x, wt: w, rt: r}, splits)
    pads = y.node.attrs["pads"]
    np.testing.assert_allclose(got_y, ref_conv(x, w, (stride, stride), pads, (dil, dil), c), rtol=2e-5, atol=2e-5)
    # dx = the adjoint of the float64 reference: each tap's products scattered back
    (t, _), (l, _) = pads
    xp = np.zeros((n, c, hw + 2 * k * dil, hw + 2 * k * dil))
    oh, ow = r.shape[2], r.shape[3]
    for i in range(k):
        for j in range(k):
            y0, x0 = i * dil, j * dil
            xp[:, :, y0:y0 + stride * oh:stride, x0:x0 + stride * ow:stride] += r * w[:, 0, i, j].reshape(1, c, 1, 1)
    want_dx = xp[:, :, t:t + hw, l:l + hw]
    np.testing.assert_allclose(got_dx, want_dx, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_and_its_gradient_same_bytes_at_one_and_two_threads(splits, training):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 6, 5, 7)).astype(np.float32)
    scale, offset = rng.uniform(0.5, 2, 6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    mean, var = rng.standard_normal(6).astype(np.float32), rng.uniform(0.5, 2, 6).astype(np.float32)
    r = rng.standard_normal(x.shape).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder("float32", x.shape, name="x")
        rt = ism.placeholder("float32", x.shape, name="r")
        out = ism.batch_norm(xt, scale, offset, mean, var, epsilon=1e-3, training=training)
        y = out[0] if training else out
        dx = ism.gradients(ism.reduce_sum(y * rt), [xt])[0]
    got_y, got_dx = _one_and_two(g, [y, dx], {xt: x, rt: r}, splits)
    x64, r64 = x.astype(np.float64), r.astype(np.float64)
    m = x64.mean(axis=(0, 2, 3)) if training else mean.astype(np.float64)
    v = x64.var(axis=(0, 2, 3)) if training else var.astype(np.float64)
    inv = (scale / np.sqrt(v + 1e-3)).reshape(1, 6, 1, 1)
    xhat = (x64 - m.reshape(1, 6, 1, 1)) / np.sqrt(v + 1e-3).reshape(1, 6, 1, 1)
    np.testing.assert_allclose(got_y, xhat * scale.reshape(1, 6, 1, 1) + offset.reshape(1, 6, 1, 1),
                               rtol=1e-5, atol=1e-5)
    if training:  # dx of sum(r * bn(x)) with the batch's own statistics
        want = inv * (r64 - r64.mean(axis=(0, 2, 3), keepdims=True)
                      - xhat * (r64 * xhat).mean(axis=(0, 2, 3), keepdims=True))
    else:
        want = inv * r64
    np.testing.assert_allclose(got_dx, want, rtol=1e-4, atol=1e-5)


def _pinned_gate(monkeypatch, prange_handoff_s: float, idle_now: bool):
    """The split gate's inputs pinned (prange hand-off, the pool's 100 us hand-off: fan_out splits from
    20 MB, the idle state; none measured or read again); returns a compiled kernel adding 1 to y[lo:hi].
    Skips without two cores and a threading layer that takes concurrent parallel calls."""
    import numba
    from isthmus.jit import par
    if threads.cores() < 2 or not par.layer_ok():
        pytest.skip("needs two cores and a threading layer that takes concurrent parallel calls")
    monkeypatch.setattr(threads, "_prange", [prange_handoff_s])
    monkeypatch.setattr(threads, "_prange_at", [0.0])
    monkeypatch.setattr(threads, "_handoff", [100e-6])
    monkeypatch.setattr(idle, "_load", [idle_now, float("inf")])

    @numba.njit(nogil=True)
    def mark(y, lo, hi):
        for i in range(lo, hi):
            y[i] += 1.0
    return mark


@pytest.mark.parametrize("handoff_us", [3.0, 10.0, 300.0])
def test_split_gate_decides_as_par_threads_below_the_pools_threshold(monkeypatch, handoff_us):
    """par_gate.split_rows on an idle machine: as many threads as par_threads gives (skipping it only
    where that could only be one), large work included (prange's blocks, not the pool's chunks,
    whose worker would share a core with libgomp's spinning one); where the prange hand-off is too
    dear for the work, fan_out's chunks once they pay; the kernel covers every item once either way."""
    from isthmus.core.ops import par_gate
    mark = _pinned_gate(monkeypatch, handoff_us * 1e-6, idle_now=True)
    least = threads.MIN_CHUNK_BYTES
    for n in (1, 2):
        with threads.IntraOpThreads(n):
            for work in (0, least // 10, least // 5, least, 2 * least, 10 * least, 19 * least, 20 * least,
                         100 * least):
                y = np.zeros(64)
                prange_splits = work >= 2 * least * threads.par_scale()
                pool_splits = work >= 2 * threads.min_chunk_bytes()
                want = threads.par_threads(64, work) if prange_splits else min(n, 2) if pool_splits else 1
                assert par_gate.split_rows(mark, (y,), 64, work) == want, (n, work)
                assert (y == 1).all()


def test_split_gate_keeps_prange_off_while_no_core_is_idle(monkeypatch):
    """With no core idle (other processes' CPU time), par_threads sends work to the pool (0) and work
    prange would split runs as one call; work large enough for the pool still fans out (its caller
    runs the chunks no worker started)."""
    from isthmus.core.ops import par_gate
    mark = _pinned_gate(monkeypatch, 3e-6, idle_now=False)
    least = threads.MIN_CHUNK_BYTES
    with threads.IntraOpThreads(2):
        y = np.zeros(64)
        assert threads.par_threads(64, 4 * least) == 0  # could split, but not by prange now: the pool's size decides
        assert par_gate.split_rows(mark, (y,), 64, 4 * least) == 1
        assert par_gate.split_rows(mark, (y,), 64, 40 * least) == 2
        assert (y == 2).all()
        monkeypatch.setattr(idle, "_load", [True, float("inf")])
        assert par_gate.split_rows(mark, (y,), 64, 4 * least) == 2
        assert (y == 3).all()


def test_cores_idle_counts_other_processes_busy_time_not_this_ones(monkeypatch):
    """idle.cores_idle: the machine's busy ticks over the interval less this process's own CPU
    time: a run whose two threads keep both cores busy still sees a core for its splits; other
    processes holding more than a quarter of a core (on 2 cores) shut prange off. The first read has
    no interval: the 1-minute load average less the caller's thread."""
    tick = idle._TICK_S
    clock = {"busy": 1000, "mine": 10.0, "now": 50.0}
    monkeypatch.setattr(idle, "_busy_ticks", lambda: clock["busy"])
    monkeypatch.setattr(idle, "process_time", lambda: clock["mine"])
    monkeypatch.setattr(idle, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(idle.os, "getloadavg", lambda: (2.0, 2.0, 2.0))
    monkeypatch.setattr(idle, "_stat", [None])
    monkeypatch.setattr(idle, "_load", [True, -1.0])
    assert idle.cores_idle(2) is False  # first read: load 2.0 less this thread leaves 1.0 busy
    # (machine busy seconds, this process's seconds) over 2 s: this process alone on both cores,
    # others at 0.2 cores, others at 0.4, this process idle and others on one core
    for busy_s, mine_s, want in ((4.0, 4.0, True), (4.0, 3.6, True), (2.0, 1.2, False), (2.0, 0.0, False),
                                 (0.2, 0.0, True)):
        clock["busy"] += round(busy_s / tick)
        clock["mine"] += mine_s
        clock["now"] += 2.0
        assert idle.cores_idle(2) is want, (busy_s, mine_s)
    clock["busy"] += round(2.0 / tick)  # others on a core, but read within LOAD_RECHECK_S: the last answer
    clock["now"] += idle.LOAD_RECHECK_S / 2
    assert idle.cores_idle(2) is True


def test_may_split_says_what_split_rows_does(monkeypatch):
    """par_gate.may_split (callers keep a kernel's one whole call where it is False) agrees with the
    threads split_rows uses: on an idle and a busy machine, one and two intra-op threads, work around
    prange's and the pool's thresholds."""
    import numba
    from isthmus.core.ops import par_gate
    from isthmus.jit import par
    if threads.cores() < 2 or not par.layer_ok():
        pytest.skip("needs two cores and a threading layer that takes concurrent parallel calls")
    monkeypatch.setattr(threads, "_prange", [3e-6])
    monkeypatch.setattr(threads, "_prange_at", [0.0])
    monkeypatch.setattr(threads, "_handoff", [100e-6])

    @numba.njit(nogil=True)
    def mark(y, lo, hi):
        for i in range(lo, hi):
            y[i] += 1.0
    least = threads.MIN_CHUNK_FLOPS
    for idle_now in (True, False):
        monkeypatch.setattr(idle, "_load", [idle_now, float("inf")])
        for n in (1, 2):
            with threads.IntraOpThreads(n):
                for work in (least // 10, least // 2, least, 4 * least, 19 * least, 21 * least, 100 * least):
                    y = np.zeros(64)
                    used = par_gate.split_rows(mark, (y,), 64, work, flops=True)
                    assert par_gate.may_split(64, work, flops=True) is (used > 1), (idle_now, n, work, used)
                    assert (y == 1).all()


def test_the_idle_gate_can_be_switched_off(monkeypatch):
    """ISTHMUS_IDLE_GATE=0: cores_idle says True however busy the other processes are."""
    monkeypatch.setattr(idle, "_busy_ticks", lambda: None)
    monkeypatch.setattr(idle.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(idle, "_stat", [None])
    monkeypatch.setattr(idle, "_load", [False, -1.0])
    monkeypatch.setenv("ISTHMUS_IDLE_GATE", "0")
    assert idle.cores_idle(2) is True
    monkeypatch.setenv("ISTHMUS_IDLE_GATE", "1")
    monkeypatch.setattr(idle, "_load", [True, -1.0])
    assert idle.cores_idle(2) is False


def test_niced_processes_count_as_busy_where_autogroups_make_nice_per_session(monkeypatch, tmp_path):
    """idle._busy_ticks leaves niced processes' user time out only where they yield to this process:
    it is not niced and the scheduler has no autogroups (with them, another session's niced process
    competes fully, as on the 2-core VM)."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 50 20 1000 5 1 2 3 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    auto = tmp_path / "autogroup"
    real_open = open

    def fake_open(path, *a, **kw):
        return real_open({"/proc/stat": stat, "/proc/sys/kernel/sched_autogroup_enabled": auto}.get(path, path), *a, **kw)
    monkeypatch.setattr("builtins.open", fake_open)
    monkeypatch.setattr(idle.os, "getpriority", lambda *a: 0)
    auto.write_text("1\n")
    assert idle._busy_ticks() == 100 + 50 + 20 + 1 + 2 + 3
    auto.write_text("0\n")
    assert idle._busy_ticks() == 100 + 20 + 1 + 2 + 3
    monkeypatch.setattr(idle.os, "getpriority", lambda *a: 10)  # niced itself: the niced compete with it
    assert idle._busy_ticks() == 100 + 50 + 20 + 1 + 2 + 3


def test_splits_take_no_more_threads_than_other_processes_leave_cores(monkeypatch):
    """idle.free_cores: on 16 cores with other processes on 9.5 of them, a split takes at most 6
    threads (6.5 cores free, whole ones with a quarter core of slack) however much work it has; the gate off: all 16."""
    monkeypatch.setattr(idle, "_busy_ticks", lambda: None)
    monkeypatch.setattr(idle.os, "getloadavg", lambda: (10.5, 10.5, 10.5))  # the first read: less the caller
    monkeypatch.setattr(idle, "_stat", [None])
    monkeypatch.setattr(idle, "_load", [True, -1.0])
    assert idle.cores_idle(16) is True and idle.free_cores(16) == 6 and idle.free_cores(4) == 4
    monkeypatch.setattr(threads, "cores", lambda: 16)
    monkeypatch.setattr(threads, "_prange", [1e-6])
    monkeypatch.setattr(threads, "_prange_at", [0.0])
    with threads.IntraOpThreads(16):
        assert threads.par_threads(64, 1e12, flops=True) == 6
        monkeypatch.setenv("ISTHMUS_IDLE_GATE", "0")
        monkeypatch.setattr(idle, "_load", [True, -1.0])
        assert threads.par_threads(64, 1e12, flops=True) == 16
