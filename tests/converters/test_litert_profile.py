"""calibrate_litert: the partitioner's calibration cases timed as .tflite files in LiteRT give a
device profile keyed like the interpreter's (cost keys), with the edge's kernel table kept."""
import pytest

from isthmus.partitioner import calibrate as cal
from isthmus.partitioner.devices import DeviceProfile

pytest.importorskip("ai_edge_litert.interpreter")


def test_profile_from_litert_timings(tmp_path):
    from isthmus.converters.litert_profile import calibrate_litert, measure_litert
    samples = measure_litert(("MatMul", "FusedConv2D", "Relu"), level="quick", budget_s=0.01, rounds=1)
    keys = {s.op for s in samples}
    assert {"MatMul:vector", "MatMul", "FusedConv2D", "FusedConv2D:grouped", "Relu"} <= keys
    assert all(s.seconds > 0 and s.flops >= 0 and s.nbytes > 0 for s in samples)
    # a bigger product takes longer (same key, 1x256x256 vs 1x1024x1024: 16x the FLOPs)
    vec = sorted((s for s in samples if s.op == "MatMul:vector"), key=lambda s: s.flops)
    assert vec[-1].seconds > vec[0].seconds
    path = str(tmp_path / "litert.json")
    p = calibrate_litert("phone-litert", ops=("MatMul", "Relu"), slowdown=4.0, path=path)
    back = DeviceProfile.load(path)
    assert back.name == "phone-litert" and back.kernel_table == "edge" and back.blas_threads == 1
    assert set(p.op_coeffs) >= {"MatMul:vector", "Relu"}
    # priced 4x slower than measured here, by the fit of the same regression calibrate uses
    fast = cal.fit(samples, "here")
    s = vec[-1]
    assert p.op_time(s.op, s.flops, s.nbytes) > fast.op_time(s.op, s.flops, s.nbytes)
