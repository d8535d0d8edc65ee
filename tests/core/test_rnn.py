"""Recurrent cells and dynamic_rnn: against numpy written out, masking, gradients."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core.rnn import GRUCell, LSTMCell, RNNCell, dynamic_rnn

rng = np.random.default_rng(0)


def sig(x):
    return 1 / (1 + np.exp(-x))


def np_cell(kind, x, state, wx, wh, b, units):
    if kind == "rnn":
        h = np.tanh(x @ wx + state[0] @ wh + b)
        return h, [h]
    if kind == "lstm":
        c, h = state
        z = x @ wx + h @ wh + b
        i, f, g, o = np.split(z, 4, axis=1)
        c2 = sig(f + 1.0) * c + sig(i) * np.tanh(g)
        h2 = sig(o) * np.tanh(c2)
        return h2, [c2, h2]
    h = state[0]
    xz, xr, xn = np.split(x @ wx + b, 3, axis=1)
    hz, hr, hn = np.split(h @ wh, 3, axis=1)
    z, r = sig(xz + hz), sig(xr + hr)
    n = np.tanh(xn + r * hn)
    h2 = (1 - z) * n + z * h
    return h2, [h2]


CELLS = {"rnn": RNNCell, "lstm": LSTMCell, "gru": GRUCell}


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_dynamic_rnn_matches_numpy_with_lengths(kind):
    B, T, I, U = 3, 5, 4, 6
    xs = rng.standard_normal((B, T, I))
    lengths = np.array([5, 2, 0], np.int32)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float64", (None, T, I), name="x")
        ln = ism.placeholder("int32", (None,), name="len")
        cell = CELLS[kind](U, seed=1, dtype="float64")
        outs, state = dynamic_rnn(cell, x, sequence_length=ln)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
        got_out, got_state = sess.run([outs, state], {x: xs, ln: lengths})
        wx, wh, b = [sess.run(v) for v in cell.variables]
    st = [np.zeros((B, U)) for _ in range(cell.n_states)]
    want_out = np.zeros((B, T, U))
    for t in range(T):
        o, new = np_cell(kind, xs[:, t], st, wx, wh, b, U)
        live = (t < lengths)[:, None]
        st = [np.where(live, n_, s_) for n_, s_ in zip(new, st)]
        want_out[:, t] = np.where(live, o, 0)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-10, atol=1e-12)
    for a, b_ in zip(got_state, st):
        np.testing.assert_allclose(a, b_, rtol=1e-10, atol=1e-12)


def test_lstm_gradient_matches_finite_differences():
    B, T, I, U = 2, 3, 2, 3
    xs = rng.standard_normal((B, T, I))
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float64", (B, T, I), name="x")
        cell = LSTMCell(U, seed=2, dtype="float64")
        outs, (c, h) = dynamic_rnn(cell, x, sequence_length=np.array([3, 2], np.int32))
        loss = ism.reduce_sum(h * h) + ism.reduce_sum(outs)
        grads = ism.gradients(loss, cell.variables)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
        got = sess.run(grads, {x: xs})
        for v, gv in zip(cell.variables, got):
            base = sess.run(v)
            num = np.zeros_like(base)
            for k in range(base.size):
                for sgn in (1, -1):
                    w = base.copy()
                    w.reshape(-1)[k] += sgn * 1e-6
                    sess.set_variable_value(v, w)
                    num.reshape(-1)[k] += sgn * sess.run(loss, {x: xs}) / 2e-6
            sess.set_variable_value(v, base)
            np.testing.assert_allclose(gv, num, rtol=1e-5, atol=1e-7)
