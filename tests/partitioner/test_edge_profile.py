"""`isthmus profile --runtime edge-int8|edge-fp32` (converters/edge_profile.py): the calibration cases
timed in the edge interpreter, fitted per op family (cost keys), fire-module shapes included; the
profile keeps the edge's kernel table and predicts its own cases."""
import numpy as np

from isthmus.apps import cli
from isthmus.converters.edge_profile import calibrate_edge, measure_edge
from isthmus.partitioner import calibrate as cal
from isthmus.partitioner.costmodel import cost_key
from isthmus.partitioner.devices import DeviceProfile


def test_int8_cases_are_timed_by_family_and_the_fit_predicts_them():
    samples = measure_edge(["Conv2D", "Relu"], level="quick", int8=True, budget_s=0.01, rounds=1)
    keys = {s.op for s in samples}
    assert {"Conv2D", "Conv2D:pointwise", "Conv2D:grouped", "Relu"} <= keys  # dense, 1x1, depthwise, elementwise
    assert len([s for s in samples if s.op.startswith("Conv2D")]) == len(list(cal.cases("Conv2D", "quick")))
    assert all(s.seconds > 0 and np.isfinite(s.seconds) for s in samples)
    prof = cal.fit(samples, "e")
    err = cal.errors(prof, samples)
    assert err["Relu"] < 0.5, err  # a fit that describes what it was fitted on


def test_fire_module_convolutions_are_calibrated():
    """SqueezeNet's squeeze (1x1) and expand (1x1, 3x3) shapes on small maps are among the cases."""
    shapes = {(c, hw, o, k) for (n, c, hw, o, k, st) in cal._FIRE_AND_BOTTLENECK}
    assert (64, 24, 16, 1) in shapes and (16, 24, 64, 3) in shapes
    built = [inputs for inputs, _ in cal.cases("Conv2D", "quick")]
    assert any(a[0].shape == (1, 64, 24, 24) and a[1].shape == (16, 64, 1, 1) for a in built)


def test_profile_runtime_edge_int8_writes_an_edge_profile(tmp_path, capsys):
    path = str(tmp_path / "e.json")
    assert cli.main(["profile", "--runtime", "edge-int8", "--ops", "Relu", "MaxPool", "--quick", "--slowdown", "4",
                     "--out", path]) == 0
    assert "edge interpreter profile" in capsys.readouterr().out
    prof = DeviceProfile.load(path)
    assert prof.kernel_table == "edge" and {"Relu", "MaxPool"} <= set(prof.op_coeffs)
    assert prof.op_time("Relu", 1e5, 8e5) > 0
    assert cli.main(["profile", "--runtime", "edge-int8", "--ops", "Softmax", "--out", str(tmp_path / "f.json")]) == 2
    assert "--ops Softmax: the edge interpreter is timed on" in capsys.readouterr().err


def test_pointwise_convolutions_have_their_own_key():
    import isthmus as ism
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (1, 8, 6, 6))
        one = ism.conv2d(x, ism.constant(np.ones((4, 8, 1, 1), np.float32)))
        strided = ism.conv2d(x, ism.constant(np.ones((4, 8, 1, 1), np.float32)), strides=2)
        three = ism.conv2d(x, ism.constant(np.ones((4, 8, 3, 3), np.float32)))
    assert [cost_key(t.node) for t in (one, strided, three)] == ["Conv2D:pointwise", "Conv2D", "Conv2D"]
    assert DeviceProfile("p", op_coeffs={"Conv2D": (1.0, 0.0, 0.0)}).op_time("Conv2D:pointwise", 0, 0) == 1.0
