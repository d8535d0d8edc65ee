"""Core's depthwise convolution on the edge's channel-blocked kernel (jit.depthwise_blocked, 8
channels per vector) where it pays, against test_conv_forward's float64 reference: strides,
padding, channel counts off the block of 8, batches split over threads, NaN through the clamp."""
import numpy as np
import pytest

from isthmus import jit
from isthmus.core.ops import depthwise

from .test_conv_forward import check, run_conv

pytestmark = [pytest.mark.skipif(not jit.available(), reason="needs numba"), pytest.mark.cpu]


@pytest.fixture
def blocked(monkeypatch):
    """Counts the depthwise convolutions the blocked kernel serves."""
    calls = []
    real = depthwise.DepthwiseConv._run_blocked
    monkeypatch.setattr(depthwise.DepthwiseConv, "_run_blocked", lambda self, *a: calls.append(1) or real(self, *a))
    return calls


@pytest.mark.parametrize("act", ["none", "relu", "relu6"])
@pytest.mark.parametrize("n,c,hw,strides,padding,served", [
    (1, 13, 12, 1, "SAME", True),          # 12x12 output, 13 channels: a short last block
    (1, 16, 24, 2, "SAME", True),          # stride 2
    (3, 9, 11, (2, 1), ((0, 2), (1, 1)), True),  # batch 3, asymmetric stride and padding
    (2, 8, 20, 1, "SAME", True),           # 20x20 at stride 1, batch 2
])
def test_blocked_depthwise_matches_the_reference(blocked, act, n, c, hw, strides, padding, served):
    rng = np.random.default_rng(n * 100 + c + hw)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    check(x, w, rng.standard_normal(c).astype(np.float32), strides, padding, 1, c, act)
    assert bool(blocked) == served


def test_dilated_depthwise_stays_on_the_per_plane_kernel(blocked):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 8, 10, 10)).astype(np.float32)
    w = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    check(x, w, rng.standard_normal(8).astype(np.float32), 1, "SAME", 2, 8, "relu6")
    assert not blocked


def test_blocked_depthwise_split_over_threads_gives_the_same_bytes(blocked, monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 16, 8, 8)).astype(np.float32)
    w = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    one, _ = run_conv(x, w, b, 1, "SAME", 1, 16, "relu6")
    cuts = []

    def three_cuts(kernel, args, total, work):  # as three threads would cut it (par_gate.split_rows)
        for i in range(3):
            kernel(*args, total * i // 3, total * (i + 1) // 3)
        cuts.append(total)
        return 3
    monkeypatch.setattr(depthwise, "split_rows", three_cuts)
    three, _ = run_conv(x, w, b, 1, "SAME", 1, 16, "relu6")
    assert cuts == [12]  # (image, 8-channel block) units
    np.testing.assert_array_equal(one, three)
    assert len(blocked) == 2


def test_nan_passes_the_blocked_clamp(blocked):
    x = np.ones((1, 8, 6, 6), np.float32)
    x[0, 2, 3, 3] = np.nan
    w = np.ones((8, 1, 3, 3), np.float32)
    out, _ = run_conv(x, w, np.zeros(8, np.float32), 1, "SAME", 1, 8, "relu")
    assert blocked and np.isnan(out[0, 2, 2:5, 2:5]).all() and np.isnan(out).sum() == 9
