"""LSTMSequence and GRUSequence (a whole direction in one kernel, inference only) against numpy
written from the ONNX equations and against the differentiable loops of LSTMStep/GRUStep nodes."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core.ops.recurrent import gru_sequence, lstm_sequence

rng = np.random.default_rng(0)


def sig(x):
    return 1 / (1 + np.exp(-x))


def ref(x, w, r, b, h0, c0, reverse):
    """ONNX LSTM (default activations, no peepholes), float64."""
    t_len, batch, _ = x.shape
    hid = r.shape[1]
    h, c = h0.astype(np.float64), c0.astype(np.float64)
    y = np.zeros((t_len, batch, hid))
    for t in (range(t_len - 1, -1, -1) if reverse else range(t_len)):
        z = x[t] @ w.T + h @ r.T + b
        i, o, f, g = sig(z[:, :hid]), sig(z[:, hid:2 * hid]), sig(z[:, 2 * hid:3 * hid]), np.tanh(z[:, 3 * hid:])
        c = f * c + i * g
        h = o * np.tanh(c)
        y[t] = h
    return y, h, c


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("states", [False, True])
@pytest.mark.parametrize("batch", [1, 3])  # batch 1 has a matrix-vector kernel of its own
def test_matches_numpy(dtype, reverse, states, batch):
    t_len, feat, hid = 7, 5, 4
    x = rng.standard_normal((t_len, batch, feat)).astype(dtype)
    w, r = (rng.standard_normal((4 * hid, feat)) * 0.5).astype(dtype), (rng.standard_normal((4 * hid, hid)) * 0.5).astype(dtype)
    b = rng.standard_normal(4 * hid).astype(dtype)
    h0, c0 = rng.standard_normal((batch, hid)).astype(dtype), rng.standard_normal((batch, hid)).astype(dtype)
    g = ism.Graph()
    with g.as_default():
        xp = ism.placeholder(dtype, (None, None, feat))  # run-time T and B
        hp, cp = ism.placeholder(dtype, (None, hid)), ism.placeholder(dtype, (None, hid))
        outs = lstm_sequence(xp, w, r, b, hp if states else None, cp if states else None, reverse=reverse)
        assert [o.shape for o in outs] == [(None, None, hid), (None, hid), (None, hid)]
        got = ism.Session(g).run(list(outs), {xp: x, hp: h0, cp: c0})
    want = ref(x, w, r, b, h0 if states else np.zeros_like(h0), c0 if states else np.zeros_like(c0), reverse)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for gv, wv in zip(got, want):
        assert gv.dtype == dtype
        np.testing.assert_allclose(gv, wv, rtol=tol, atol=tol)


def ref_gru(x, w, r, b, h0, reverse, lbr):
    t_len, batch, _ = x.shape
    hid = r.shape[1]
    wb, rb = b[:3 * hid], b[3 * hid:]
    h = h0.astype(np.float64)
    y = np.zeros((t_len, batch, hid))
    for t in (range(t_len - 1, -1, -1) if reverse else range(t_len)):
        gx = x[t] @ w.T + wb
        z = sig(gx[:, :hid] + h @ r[:hid].T + rb[:hid])
        rg = sig(gx[:, hid:2 * hid] + h @ r[hid:2 * hid].T + rb[hid:2 * hid])
        if lbr:
            n = np.tanh(gx[:, 2 * hid:] + rg * (h @ r[2 * hid:].T + rb[2 * hid:]))
        else:
            n = np.tanh(gx[:, 2 * hid:] + (rg * h) @ r[2 * hid:].T + rb[2 * hid:])
        h = (1 - z) * n + z * h
        y[t] = h
    return y, h


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reverse,lbr,state", [(False, False, False), (True, False, True), (False, True, True),
                                               (True, True, False)])
@pytest.mark.parametrize("batch", [1, 3])
def test_gru_matches_numpy(dtype, reverse, lbr, state, batch):
    t_len, feat, hid = 6, 5, 4
    x = rng.standard_normal((t_len, batch, feat)).astype(dtype)
    w, r = (rng.standard_normal((3 * hid, feat)) * 0.5).astype(dtype), (rng.standard_normal((3 * hid, hid)) * 0.5).astype(dtype)
    b = rng.standard_normal(6 * hid).astype(dtype)
    h0 = rng.standard_normal((batch, hid)).astype(dtype)
    g = ism.Graph()
    with g.as_default():
        xp = ism.placeholder(dtype, (None, None, feat))
        hp = ism.placeholder(dtype, (None, hid))
        outs = gru_sequence(xp, w, r, b, hp if state else None, reverse=reverse, linear_before_reset=lbr)
        assert [o.shape for o in outs] == [(None, None, hid), (None, hid)]
        got = ism.Session(g).run(list(outs), {xp: x, hp: h0})
    want = ref_gru(x, w, r, b, h0 if state else np.zeros_like(h0), reverse, lbr)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for gv, wv in zip(got, want):
        assert gv.dtype == dtype
        np.testing.assert_allclose(gv, wv, rtol=tol, atol=tol)


def _masked(step, t_len, lens, reverse, states):
    """Run `step(t, states) -> (out, states)` over time with ONNX sequence_lens: past its length an
    example keeps its states and outputs zeros; reverse reads each example's own prefix backwards."""
    y = None
    for k in range(t_len):
        t = t_len - 1 - k if reverse else k
        out, new = step(t, states)
        live = (t < lens)[:, None]
        states = [np.where(live, a, o) for a, o in zip(new, states)]
        y = np.zeros((t_len,) + out.shape) if y is None else y
        y[t] = np.where(live, out, 0)
    return y, states


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("reverse", [False, True])
def test_sequence_lengths(op, reverse):
    t_len, batch, feat, hid = 6, 4, 3, 5
    gates = 4 if op == "LSTM" else 3
    x = rng.standard_normal((t_len, batch, feat))
    w, r = rng.standard_normal((gates * hid, feat)) * 0.5, rng.standard_normal((gates * hid, hid)) * 0.5
    b = rng.standard_normal((4 if op == "LSTM" else 6) * hid)
    h0, c0 = rng.standard_normal((batch, hid)), rng.standard_normal((batch, hid))
    lens = np.array([6, 0, 3, 1], np.int32)

    def lstm_step(t, st):
        y, h, c = ref(x[t:t + 1], w, r, b, st[0], st[1], False)
        return h, [h, c]

    def gru_step(t, st):
        y, h = ref_gru(x[t:t + 1], w, r, b, st[0], False, True)
        return h, [h]
    want_y, want_st = _masked(lstm_step if op == "LSTM" else gru_step, t_len, lens, reverse,
                              [h0, c0] if op == "LSTM" else [h0])
    g = ism.Graph()
    with g.as_default():
        if op == "LSTM":
            outs = lstm_sequence(x, w, r, b, h0, c0, reverse=reverse, lens=lens)
        else:
            outs = gru_sequence(x, w, r, b, h0, reverse=reverse, linear_before_reset=True, lens=lens)
        got = ism.Session(g).run(list(outs))
    for gv, wv in zip(got, [want_y] + want_st):
        np.testing.assert_allclose(gv, wv, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got[0][:, 1], 0)  # a zero-length example outputs zeros, keeps h0
    np.testing.assert_array_equal(got[1][1], h0[1])


def test_lstm_with_only_h0_starts_from_a_zero_cell():
    x = rng.standard_normal((4, 2, 3)).astype(np.float32)
    w, r = (rng.standard_normal((8, 3)) * 0.5).astype(np.float32), (rng.standard_normal((8, 2)) * 0.5).astype(np.float32)
    b, h0 = rng.standard_normal(8).astype(np.float32), rng.standard_normal((2, 2)).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        got = ism.Session(g).run(list(lstm_sequence(x, w, r, b, h0=h0)))
    for gv, wv in zip(got, ref(x, w, r, b, h0, np.zeros_like(h0), False)):
        np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-6)


def test_zero_steps_returns_the_initial_state():
    h0, c0 = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        y, h, c = lstm_sequence(np.zeros((0, 2, 4), np.float32), np.ones((12, 4), np.float32),
                                np.ones((12, 3), np.float32), np.zeros(12, np.float32), h0, c0)
        yv, hv, cv = ism.Session(g).run([y, h, c])
    assert yv.shape == (0, 2, 3)
    np.testing.assert_array_equal(hv, h0)
    np.testing.assert_array_equal(cv, c0)


def test_shapes_are_checked_and_the_gradient_is_refused_by_name():
    g = ism.Graph()
    with g.as_default():
        with pytest.raises(ism.ShapeError, match="16 rows"):
            lstm_sequence(np.zeros((2, 1, 3), np.float32), np.zeros((12, 3), np.float32),
                          np.zeros((16, 4), np.float32), np.zeros(16, np.float32))
        with pytest.raises(ism.ShapeError, match="features"):
            lstm_sequence(np.zeros((2, 1, 5), np.float32), np.zeros((16, 3), np.float32),
                          np.zeros((16, 4), np.float32), np.zeros(16, np.float32))
        x = ism.placeholder("float32", (2, 1, 3))
        y, _, _ = lstm_sequence(x, np.zeros((16, 3), np.float32), np.zeros((16, 4), np.float32),
                                np.zeros(16, np.float32), name="seq")
        with pytest.raises(ism.GraphError, match="LSTMSequence.*'seq'"):
            ism.gradients(ism.reduce_sum(y), [x])
        with pytest.raises(ism.ShapeError, match="18 rows"):
            gru_sequence(x, np.zeros((9, 3), np.float32), np.zeros((9, 3), np.float32), np.zeros(9, np.float32))
        yg, _ = gru_sequence(x, np.zeros((9, 3), np.float32), np.zeros((9, 3), np.float32), np.zeros(18, np.float32),
                             name="gseq")
        with pytest.raises(ism.GraphError, match="GRUSequence.*'gseq'"):
            ism.gradients(ism.reduce_sum(yg), [x])


@pytest.mark.parametrize("op,kw", [("LSTM", {}), ("GRU", {}), ("GRU", {"linear_before_reset": 1})])
def test_imported_rnn_is_one_node_per_direction_and_equals_the_step_loop(op, kw):
    """An inference import uses LSTMSequence/GRUSequence; a trainable one the step loop: same numbers."""
    from onnx import TensorProto, helper, numpy_helper

    from isthmus.converters import from_onnx
    hid, feat, gates = 6, 4, 4 if op == "LSTM" else 3
    inits = [numpy_helper.from_array((rng.standard_normal((2, gates * hid, feat)) * 0.5).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((2, gates * hid, hid)) * 0.5).astype(np.float32), "R"),
             numpy_helper.from_array((rng.standard_normal((2, 2 * gates * hid)) * 0.5).astype(np.float32), "B")]
    outs = ["y", "h", "c"][:3 if op == "LSTM" else 2]
    m = helper.make_model(helper.make_graph(
        [helper.make_node(op, ["x", "W", "R", "B"], outs, hidden_size=hid, direction="bidirectional", **kw)],
        "rnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "N", feat])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    xv = rng.standard_normal((9, 5, feat)).astype(np.float32)
    g1, i1, o1 = from_onnx(m)
    assert [n.op for n in g1.nodes].count(f"{op}Sequence") == 2 and "While" not in {n.op for n in g1.nodes}
    fast = ism.Session(g1).run(o1, {i1["x"]: xv})
    g2, i2, o2 = from_onnx(m, trainable=True)
    assert "While" in {n.op for n in g2.nodes}
    with g2.as_default():
        s2 = ism.Session(g2)
        s2.run(ism.global_variables_initializer())
    loop = s2.run(o2, {i2["x"]: xv})
    for a, b in zip(fast, loop):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
