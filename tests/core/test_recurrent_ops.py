"""LSTMStep and GRUStep (one fused recurrent step, ONNX gate orders) against numpy written from
the ONNX equations; gradients by finite differences."""
import numpy as np
import pytest

from isthmus.core.ops.recurrent import gru_step, lstm_step

from .opcheck import check_forward, check_gradients

rng = np.random.default_rng(0)
B, H = 3, 4


def sig(x):
    return 1 / (1 + np.exp(-x))


def ref_lstm(gx, h, c, rt):
    z = gx + h @ rt
    i, o, f, g = sig(z[:, :H]), sig(z[:, H:2 * H]), sig(z[:, 2 * H:3 * H]), np.tanh(z[:, 3 * H:])
    c2 = f * c + i * g
    return o * np.tanh(c2), c2


def ref_gru(gx, h, rt, rbh, lbr):
    z = sig(gx[:, :H] + h @ rt[:, :H])
    r = sig(gx[:, H:2 * H] + h @ rt[:, H:2 * H])
    if lbr:
        n = np.tanh(gx[:, 2 * H:] + r * (h @ rt[:, 2 * H:] + rbh))
    else:
        n = np.tanh(gx[:, 2 * H:] + (r * h) @ rt[:, 2 * H:])
    return (1 - z) * n + z * h


def test_lstm_step_forward_and_gradient():
    args = [rng.standard_normal((B, 4 * H)), rng.standard_normal((B, H)), rng.standard_normal((B, H)),
            rng.standard_normal((H, 4 * H)) * 0.5]
    check_forward(lambda *a: list(lstm_step(*a)), args, ref_lstm, rtol=1e-12, atol=1e-12)
    check_gradients(lambda *a: lstm_step(*a)[0], args)
    check_gradients(lambda *a: lstm_step(*a)[1], args)  # dh' is zero here: the None path


@pytest.mark.parametrize("lbr", [False, True])
def test_gru_step_forward_and_gradient(lbr):
    args = [rng.standard_normal((B, 3 * H)), rng.standard_normal((B, H)), rng.standard_normal((H, 3 * H)) * 0.5,
            rng.standard_normal(H)]
    check_forward(lambda *a: gru_step(*a, linear_before_reset=lbr), args, lambda *a: ref_gru(*a, lbr),
                  rtol=1e-12, atol=1e-12)
    check_gradients(lambda *a: gru_step(*a, linear_before_reset=lbr), args)


def test_step_shapes_are_checked():
    import isthmus as ism
    g = ism.Graph()
    with g.as_default():
        with pytest.raises(ism.ShapeError, match="16 columns"):
            lstm_step(np.zeros((2, 12)), np.zeros((2, 4)), np.zeros((2, 4)), np.zeros((4, 16)))
