import numpy as np
import pytest

from isthmus.core import gpu


def test_pool_limit_parsing():
    total = 80 << 30
    assert gpu.parse_pool_limit(None, total) == int(total * gpu.DEFAULT_POOL_FRACTION) < total
    assert gpu.parse_pool_limit(0.5, total) == 40 << 30
    assert gpu.parse_pool_limit("8GiB", total) == 8 << 30
    assert gpu.parse_pool_limit("512MiB", total) == 512 << 20
    assert gpu.parse_pool_limit(1 << 20, total) == 1 << 20
    for bad in (0.0, -1, "lots", "99GiB", True, [1]):
        with pytest.raises(ValueError):
            gpu.parse_pool_limit(bad, total)


def test_cpu_module_is_numpy_and_bad_kind_rejected():
    assert gpu.array_module("CPU") is np
    with pytest.raises(ValueError):
        gpu.array_module("TPU")


def test_absent_gpu_error_names_node():
    if gpu.gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="dense_1/MatMul"):
        gpu.require_gpu("dense_1/MatMul", "/job:cloud/task:0/device:GPU:0")
    assert gpu.unavailable_reason()


def test_peak_meter():
    m = gpu.PeakMeter()
    for v in (10, 50, 20):
        m.sample(v)
    assert (m.start, m.peak) == (10, 50)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu.gpu_available(), reason=f"no GPU: {gpu.unavailable_reason()}")
def test_pool_cap_applied_on_gpu():
    cp = gpu.array_module("GPU")
    cap = gpu.configure_memory_pool(0.25)
    assert cp.get_default_memory_pool().get_limit() == cap
    a = cp.arange(10, dtype=cp.float32)
    np.testing.assert_array_equal(cp.asnumpy(np.add(a, a)), np.arange(10, dtype=np.float32) * 2)


def test_calibrate_gpu_errors_clearly_without_gpu():
    if gpu.gpu_available():
        pytest.skip("a GPU is present")
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "isthmus", "calibrate", "--device", "gpu"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "no GPU available" in r.stderr
