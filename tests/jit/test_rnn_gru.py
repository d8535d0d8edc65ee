"""jit.rnn.gru_steps (the edge's compiled GRU loop) against the ONNX GRU equations in float64: both
linear_before_reset modes, hidden sizes on and off the loop's unroll of four, saturated gates."""
import numpy as np
import pytest

from isthmus import jit

pytestmark = pytest.mark.skipif(not jit.available(), reason="numba is not installed")


def _ref(x, w, r, wb, rb, h0, lbr):
    def sig(v):
        return 1 / (1 + np.exp(-v))
    hid = r.shape[1]
    h = h0.astype(np.float64)
    ys = []
    for t in range(x.shape[0]):
        gx = x[t] @ w.T.astype(np.float64) + wb
        gh = h @ r[:2 * hid].T.astype(np.float64) + rb[:2 * hid]
        z, rr = sig(gx[:, :hid] + gh[:, :hid]), sig(gx[:, hid:2 * hid] + gh[:, hid:])
        rn, bn = r[2 * hid:].T.astype(np.float64), rb[2 * hid:]
        n = np.tanh(gx[:, 2 * hid:] + (rr * (h @ rn + bn) if lbr else (rr * h) @ rn + bn))
        h = (1 - z) * n + z * h
        ys.append(h)
    return np.stack(ys)


@pytest.mark.parametrize("hid,lbr,scale", [(9, False, 0.5), (9, True, 0.5), (8, True, 6.0), (3, False, 6.0)])
def test_gru_steps_match_float64(hid, lbr, scale):
    from isthmus.jit.rnn import gru_steps
    rng = np.random.default_rng(hid + 10 * lbr)
    steps, batch, feat = 6, 3, 5
    x = rng.standard_normal((steps, batch, feat)).astype(np.float32)
    w = (rng.standard_normal((3 * hid, feat)) * scale).astype(np.float32)
    r = (rng.standard_normal((3 * hid, hid)) * scale).astype(np.float32)
    wb, rb = (rng.standard_normal((2, 3 * hid)) * scale).astype(np.float32)
    h0 = rng.standard_normal((batch, hid)).astype(np.float32)
    neg = np.ones(3 * hid, np.float32)
    neg[:2 * hid] = -1  # the z and r rows negated: the loop reads sigmoid(v) as 1 / (1 + exp(v))
    bias = wb + np.concatenate([rb[:2 * hid], rb[2 * hid:] * (not lbr)])  # R's new-gate bias inside r only if lbr
    proj = ((x.reshape(-1, feat) @ w.T + bias) * neg).reshape(steps, batch, 3 * hid).astype(np.float32)
    rt = np.ascontiguousarray((r * neg[:, None]).T, np.float32)
    y = np.empty((steps, batch, hid), np.float32)
    gru_steps(proj, rt, rb[2 * hid:].copy(), lbr, np.arange(steps), h0, y, np.empty(3 * hid, np.float32),
              np.empty(hid, np.float32))
    np.testing.assert_allclose(y, _ref(x, w, r, wb, rb, h0, lbr), rtol=1e-5, atol=2e-6)
