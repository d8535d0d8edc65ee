"""The edge's fused LSTM/GRU kernels give the same sequence through the compiled step loop and through
the numpy passes (edge/kernels_rnn.compiled_pays picks one by shape), both against a float64 numpy
recurrence written out here in ONNX gate order."""
import numpy as np
import pytest

import isthmus as ism
import isthmus.edge.kernels_rnn as kr
from isthmus.converters.edge_export import to_edge
from isthmus.core.ops.recurrent import gru_sequence, lstm_sequence
from isthmus.edge import Interpreter


def _sig(z):
    return 1.0 / (1.0 + np.exp(-z))


def _lstm_ref(x, w, r, b):
    """ONNX LSTM, gates i, o, f, c, zero initial state, b [4H] (Wb + Rb, as core's op takes it): y [T, B, H]."""
    hid = w.shape[0] // 4
    h = np.zeros((x.shape[1], hid))
    c = np.zeros_like(h)
    ys = []
    for xt in x:
        z = xt @ w.T + h @ r.T + b
        i, o, f, g = _sig(z[:, :hid]), _sig(z[:, hid:2 * hid]), _sig(z[:, 2 * hid:3 * hid]), np.tanh(z[:, 3 * hid:])
        c = f * c + i * g
        h = o * np.tanh(c)
        ys.append(h)
    return np.stack(ys)


def _gru_ref(x, w, r, b):
    """ONNX GRU, gates z, r, h, linear_before_reset 0, zero initial state: y [T, B, H]."""
    hid = w.shape[0] // 3
    wb, rb = b[:3 * hid], b[3 * hid:]
    h = np.zeros((x.shape[1], hid))
    ys = []
    for xt in x:
        xz = xt @ w.T + wb
        hz = h @ r[:2 * hid].T + rb[:2 * hid]
        zg = _sig(xz[:, :hid] + hz[:, :hid])
        rg = _sig(xz[:, hid:2 * hid] + hz[:, hid:])
        hh = np.tanh(xz[:, 2 * hid:] + (rg * h) @ r[2 * hid:].T + rb[2 * hid:])
        h = (1 - zg) * hh + zg * h
        ys.append(h)
    return np.stack(ys)


@pytest.mark.parametrize("op", ["LSTMSequence", "GRUSequence"])
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
def test_both_paths_match_the_float64_recurrence(op, compiled, monkeypatch):
    t, b, i, hid = 6, 3, 5, 8
    gates = 4 if op == "LSTMSequence" else 3
    rng = np.random.default_rng(4)
    w = rng.uniform(-0.5, 0.5, (gates * hid, i)).astype(np.float32)
    r = rng.uniform(-0.5, 0.5, (gates * hid, hid)).astype(np.float32)
    bias = rng.uniform(-0.3, 0.3, ((4 if gates == 4 else 6) * hid,)).astype(np.float32)
    xv = rng.standard_normal((t, b, i)).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (t, b, i), name="x")
        wc, rc, bc = (ism.constant(v) for v in (w, r, bias))
        y = (lstm_sequence(x, wc, rc, bc) if gates == 4 else gru_sequence(x, wc, rc, bc))[0]
    monkeypatch.setattr(kr, "compiled_pays", lambda batch, h: compiled)
    it = Interpreter(to_edge(g, [y], [x], batch=b))
    got = it.invoke(xv)[0]
    ref = (_lstm_ref if gates == 4 else _gru_ref)(*(v.astype(np.float64) for v in (xv, w, r, bias)))
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)


def test_the_compiled_loop_is_chosen_where_it_was_measured_to_win():
    assert kr.compiled_pays(1, 64) and kr.compiled_pays(32, 128) and kr.compiled_pays(4, 256)
    assert not kr.compiled_pays(8, 256) and not kr.compiled_pays(16, 256) and not kr.compiled_pays(64, 128)
