"""LSTMSequence's three CPU paths (numpy passes, the compiled loop, a GEMM per step with compiled gates)
against float64 numpy written from the ONNX equations, and the compiled logistic against exp."""
import numpy as np
import pytest

import isthmus as ism
from isthmus import jit
from isthmus.core.ops import recurrent_compiled
from isthmus.core.ops.recurrent import lstm_sequence

pytestmark = [pytest.mark.skipif(not jit.available(), reason="numba is not installed"), pytest.mark.cpu]


def _ref(x, w, r, b, h0, c0, reverse):
    def sig(v):
        return 1 / (1 + np.exp(-v))
    hid = r.shape[1]
    h, c = h0.astype(np.float64), c0.astype(np.float64)
    y = np.zeros((x.shape[0], x.shape[1], hid))
    for t in (range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])):
        z = x[t] @ w.T.astype(np.float64) + h @ r.T.astype(np.float64) + b
        i, o, f, g = sig(z[:, :hid]), sig(z[:, hid:2 * hid]), sig(z[:, 2 * hid:3 * hid]), np.tanh(z[:, 3 * hid:])
        c = f * c + i * g
        h = o * np.tanh(c)
        y[t] = h
    return y, h, c


def _set_path(monkeypatch, path):
    monkeypatch.setenv("ISTHMUS_JIT", "0" if path == "numpy" else "1")
    monkeypatch.setattr(recurrent_compiled, "COMPILED_UNITS", 10 ** 9 if path == "loop" else 0)
    monkeypatch.setattr(recurrent_compiled, "_PACKED_MIN_BATCH", 0 if path == "packed" else 10 ** 9)


@pytest.mark.parametrize("reverse,states,batch,scale", [(False, True, 1, 0.5), (True, False, 5, 0.5),
                                                        (False, True, 6, 8.0), (True, True, 9, 8.0)])
def test_packed_steps_match_float64(monkeypatch, reverse, states, batch, scale):
    """lstm_steps_packed (the recurrent product on jit.gemm_f32's tile): batches off a multiple of 4,
    saturated gates, both directions, given and zero states."""
    from isthmus.jit import gemm_f32, rnn
    if not gemm_f32.supported():
        pytest.skip("needs AVX2")
    _set_path(monkeypatch, "packed")
    calls = []
    real = rnn.lstm_quads_range
    monkeypatch.setattr(rnn, "lstm_quads_range", lambda *a: calls.append(1) or real(*a))
    ops, g, run = _lstm_case(np.random.default_rng(11 + batch), (7, batch, 6, 8), scale, states, reverse)
    with g.as_default():
        got = run(ism.Session(g))
    assert calls
    tol = 2e-6 if scale < 1 else 2e-5  # saturated: |z| ~ 100, the float32 sums' order shows at 1e-5
    for gv, wv in zip(got, _ref(*ops, reverse)):
        np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=tol)
    # the examples' recurrences cut by row quads, as threads would cut them: the same bytes
    cuts = []

    def quad_cuts(kernel, args, total, work, flops=False):
        for i in range(total):
            kernel(*args, i, i + 1)
        cuts.append(total)
        return total
    monkeypatch.setattr(recurrent_compiled, "split_rows", quad_cuts)
    with g.as_default():
        cut = run(ism.Session(g))
    assert cuts == [-(-batch // 4)]
    for gv, cv in zip(got, cut):
        np.testing.assert_array_equal(gv, cv)


@pytest.mark.parametrize("path", ["numpy", "loop", "gemm"])
@pytest.mark.parametrize("reverse,states,batch,scale", [(False, False, 1, 0.5), (True, True, 3, 0.5),
                                                        (False, True, 2, 8.0), (True, False, 1, 8.0)])
def test_paths_match_float64(monkeypatch, path, reverse, states, batch, scale):
    """scale 8 drives the gates into saturation (|z| up to ~100): the compiled exp's clamp is exercised."""
    _set_path(monkeypatch, path)
    # hid 5, not a multiple of 4: the loop's remainder rows run too
    ops, g, run = _lstm_case(np.random.default_rng(7 + batch), (9, batch, 6, 5), scale, states, reverse)
    with g.as_default():
        sess = ism.Session(g)
        got = run(sess)
        again = run(sess)  # the prepared weights are reused
    want = _ref(*ops, reverse)
    for gv, av, wv in zip(got, again, want):
        assert gv.dtype == np.float32 and np.all(np.isfinite(gv))
        np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=2e-6)
        np.testing.assert_array_equal(gv, av)


@pytest.mark.parametrize("path", ["loop", "gemm"])
def test_weights_fed_at_run_time_are_not_cached(monkeypatch, path):
    """Weights that can change between runs (a fed placeholder) are rearranged on every call."""
    _set_path(monkeypatch, path)
    rng = np.random.default_rng(3)
    t_len, batch, feat, hid = 4, 2, 3, 4
    x = rng.standard_normal((t_len, batch, feat)).astype(np.float32)
    r = rng.standard_normal((4 * hid, hid)).astype(np.float32)
    b = np.zeros(4 * hid, np.float32)
    g = ism.Graph()
    with g.as_default():
        wp = ism.placeholder("float32", (4 * hid, feat))
        y, _, _ = lstm_sequence(x, wp, r, b)
        sess = ism.Session(g)
        for seed in (1, 2):
            w = np.random.default_rng(seed).standard_normal((4 * hid, feat)).astype(np.float32)
            want = _ref(x, w, r, b, np.zeros((batch, hid)), np.zeros((batch, hid)), False)[0]
            np.testing.assert_allclose(sess.run(y, {wp: w}), want, rtol=1e-5, atol=2e-6)


def test_fused_cell_against_float64():
    """jit.rnn's one-pass cell (five inlined exps per hidden unit, vectorized across units) against the
    ONNX equations in float64, over pre-activations from tiny to saturated and infinite."""
    from isthmus.jit.rnn import lstm_cells
    rng = np.random.default_rng(5)
    batch, hid = 7, 37  # not a multiple of the vector width: the remainder loop runs too
    z = (rng.standard_normal((batch, 4 * hid)) * np.array([0.1, 3, 30, 300])[rng.integers(0, 4, (batch, 1))])
    z = z.astype(np.float32)
    z[0, :4] = [np.inf, -np.inf, 0, 1e-30]
    p = rng.standard_normal((batch, 4 * hid)).astype(np.float32)
    c0 = (rng.standard_normal((batch, hid)) * 4).astype(np.float32)
    c, h = c0.copy(), np.empty((batch, hid), np.float32)
    bias = rng.standard_normal(4 * hid).astype(np.float32)
    lstm_cells(z.copy(), p, bias, c, h)
    u = z.astype(np.float64) + p + bias
    with np.errstate(over="ignore"):
        i, o, f = (1 / (1 + np.exp(u[:, k * hid:(k + 1) * hid])) for k in range(3))  # rows i, o, f negated
    c_want = f * c0 + i * np.tanh(u[:, 3 * hid:])
    np.testing.assert_allclose(c, c_want, rtol=1e-6, atol=3e-7)
    np.testing.assert_allclose(h, o * np.tanh(c_want), rtol=1e-6, atol=3e-7)


def _lstm_case(rng, dims, scale, states, reverse):
    """Operands (x, w, r, b, h0, c0) for dims (T, batch, features, hidden), the graph of one
    lstm_sequence over them, and run(session) -> its outputs."""
    t_len, batch, feat, hid = dims
    x = rng.standard_normal((t_len, batch, feat)).astype(np.float32)
    w = (rng.standard_normal((4 * hid, feat)) * scale).astype(np.float32)
    r = (rng.standard_normal((4 * hid, hid)) * scale).astype(np.float32)
    b = rng.standard_normal(4 * hid).astype(np.float32)
    h0, c0 = (rng.standard_normal((2, batch, hid)) if states else np.zeros((2, batch, hid))).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        xp = ism.placeholder("float32", (None, None, feat))
        hp, cp = ism.placeholder("float32", (None, hid)), ism.placeholder("float32", (None, hid))
        outs = lstm_sequence(xp, w, r, b, hp if states else None, cp if states else None, reverse=reverse)
    return (x, w, r, b, h0, c0), g, lambda sess: sess.run(list(outs), {xp: x, hp: h0, cp: c0})
