"""calibrate_ort: the partitioner's calibration cases written as isthmus's ONNX edge parts and timed
in onnxruntime give a device profile keyed like the interpreter's (cost keys), the edge's kernel
table kept, priced slowdown x what was measured."""
import pytest

from isthmus.partitioner import calibrate as cal
from isthmus.partitioner.devices import DeviceProfile

pytest.importorskip("onnxruntime")


def test_profile_from_onnxruntime_timings(tmp_path):
    from isthmus.converters.ort_profile import calibrate_ort, measure_ort
    samples = measure_ort(("MatMul", "FusedConv2D", "Relu"), level="quick", budget_s=0.01, rounds=1)
    keys = {s.op for s in samples}
    assert {"MatMul:vector", "MatMul", "FusedConv2D", "FusedConv2D:grouped", "Relu"} <= keys
    assert all(s.seconds > 0 and s.flops >= 0 and s.nbytes > 0 for s in samples)
    vec = sorted((s for s in samples if s.op == "MatMul:vector"), key=lambda s: s.flops)
    assert vec[-1].seconds > vec[0].seconds     # 16x the FLOPs takes longer
    path = str(tmp_path / "ort.json")
    p = calibrate_ort("phone-ort", ops=("MatMul", "Relu"), slowdown=4.0, path=path)
    back = DeviceProfile.load(path)
    assert back.name == "phone-ort" and back.kernel_table == "edge" and back.blas_threads == 1
    assert set(p.op_coeffs) >= {"MatMul:vector", "Relu"}
    s = vec[-1]
    assert p.op_time(s.op, s.flops, s.nbytes) > cal.fit(samples, "here").op_time(s.op, s.flops, s.nbytes)
