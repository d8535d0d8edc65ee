"""Ops a GPU session once ran with numpy on device values, against the CPU path (on the stand-in GPU
in CI, on a real GPU under `pytest -m gpu`): the spectral ops now take the device's FFT (their sizes
and run-time axis stay in host memory), NonMaxSuppression and Unique run on the host with copies
around them, and a float16 depthwise convolution sums its taps in float32."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core import gpu
from isthmus.core.ops.selection import non_max_suppression, unique
from isthmus.core.ops.spectral import dft, stft

BACKENDS = [pytest.param("simulated", id="sim"),
            pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
                not gpu.gpu_available(), reason=f"no GPU: {gpu.unavailable_reason()}")])]


def _both(build, feeds, backend):
    """The fetches of `build(*placeholders)` on the CPU and on a GPU session."""
    out = []
    for device in ("cpu", "gpu"):
        g = ism.Graph(seed=0)
        with g.as_default():
            phs = [ism.placeholder(v.dtype, v.shape) for v in feeds]
            ys = build(*phs)
            s = ism.Session(g, device=device, gpu=backend) if device == "gpu" else ism.Session(g, device="cpu")
            out.append([np.asarray(v) for v in s.run(list(ys), dict(zip(phs, feeds)))])
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_spectral_ops_on_gpu_match_numpys_fft(backend):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 2)).astype(np.float32)
    sig = rng.standard_normal((1, 32, 1)).astype(np.float32)
    win = np.hanning(8).astype(np.float32)

    def build(x_, s_, axis_):
        return [dft(x_, axis=1), dft(x_, axis=axis_), dft(x_, axis=1, onesided=True), dft(x_, axis=1, inverse=True),
                stft(s_, ism.constant(np.array(4, np.int64)), ism.constant(win))]
    cpu, dev = _both(build, [x, sig, np.array(-2, np.int64)], backend)
    z = x[..., 0] + 1j * x[..., 1]
    want = np.fft.fft(z, axis=1)  # the reference, written out
    np.testing.assert_allclose(cpu[0][..., 0] + 1j * cpu[0][..., 1], want, rtol=1e-5, atol=1e-5)
    frames = np.stack([sig[0, f * 4:f * 4 + 8, 0] * win for f in range(7)])
    np.testing.assert_allclose(cpu[4][0, ..., 0] + 1j * cpu[4][0, ..., 1], np.fft.fft(frames)[:, :5], rtol=1e-5,
                               atol=1e-5)
    for a, b in zip(dev, cpu):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_max_suppression_and_unique_run_on_the_host_of_a_gpu_session(backend):
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 2, 1, 3], [0, 2.05, 1, 3.05]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.7, 0.95]]], np.float32)
    vals = np.array([3, 1, 3, 2, 1, 3], np.float32)

    def build(b_, s_, v_):
        keep = non_max_suppression(b_, s_, ism.constant(np.array(3, np.int64)), ism.constant(np.array(0.5, np.float32)))
        return [keep] + unique(ism.mul(v_, ism.constant(np.float32(2.0))))
    cpu, dev = _both(build, [boxes, scores, vals], backend)
    np.testing.assert_array_equal(cpu[0], [[0, 0, 3], [0, 0, 0]])  # by hand: boxes 3 and 0 kept, IoU > 0.5 dropped
    np.testing.assert_array_equal(cpu[1], [2, 4, 6])
    for a, b in zip(dev, cpu):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float16_depthwise_convolution_sums_in_float32_on_gpu(backend):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8, 1, 40)).astype(np.float16)
    w = (rng.standard_normal((8, 1, 1, 9)) * 0.5).astype(np.float16)

    def build(x_):
        return [ism.conv2d(x_, ism.constant(w), groups=8, padding="VALID")]
    cpu, dev = _both(build, [x], backend)
    want = np.zeros((2, 8, 1, 32), np.float64)  # by hand, in float64
    for j in range(9):
        want += x[..., j:j + 32].astype(np.float64) * w[:, 0, 0, j].astype(np.float64)[None, :, None, None]
    assert dev[0].dtype == np.float16
    np.testing.assert_allclose(dev[0].astype(np.float64), want, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(dev[0].astype(np.float32), cpu[0].astype(np.float32), rtol=2e-3, atol=2e-3)
