"""`isthmus partition` reads a .tflite model (through the TFLite importer) and explains a plan."""
import subprocess
import sys

from .test_tflite_import import cnn_model


def test_partition_a_tflite_model(tmp_path):
    data, _ = cnn_model()
    src = tmp_path / "cnn.tflite"
    src.write_bytes(data)
    out = subprocess.run([sys.executable, "-m", "isthmus", "partition", str(src), "--bandwidth", "5mbps",
                          "--rtt", "40ms"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "split plan" in out.stdout and "predicted latency" in out.stdout
