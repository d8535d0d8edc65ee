"""`isthmus convert` on a .tflite file: to the edge format (run by the edge interpreter) and to
ONNX (run by onnxruntime), both against the NHWC numpy reference of the test model."""
import subprocess
import sys

import numpy as np

from .test_tflite_import import cnn_model


def _convert(*args):
    return subprocess.run([sys.executable, "-m", "isthmus", "convert", *args], capture_output=True, text=True,
                          timeout=120)


def test_convert_tflite_to_edge_and_onnx(tmp_path):
    data, ref = cnn_model()
    src = tmp_path / "cnn.tflite"
    src.write_bytes(data)
    x = np.random.default_rng(4).standard_normal((1, 9, 9, 3)).astype(np.float32)
    out = _convert(str(src), "--to", "edge", "-o", str(tmp_path / "cnn.isth"))
    assert out.returncode == 0, out.stderr
    from isthmus.edge import Interpreter
    (got,) = Interpreter((tmp_path / "cnn.isth").read_bytes()).invoke(x.transpose(0, 3, 1, 2))
    np.testing.assert_allclose(got, ref(x), rtol=1e-4, atol=1e-6)

    out = _convert(str(src), "--to", "onnx", "--nhwc", "-o", str(tmp_path / "cnn.onnx"))
    assert out.returncode == 0, out.stderr
    import onnx
    import onnxruntime as ort
    m = onnx.load(str(tmp_path / "cnn.onnx"))
    m.ir_version = min(m.ir_version, 10)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
    np.testing.assert_allclose(got, ref(x), rtol=1e-4, atol=1e-6)


def test_convert_names_a_broken_tflite_file(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x10\x00\x00\x00TFL3" + b"\xff" * 40)
    out = _convert(str(bad), "--to", "edge")
    assert out.returncode != 0 and "cannot import" in out.stderr and "bad.tflite" in out.stderr
