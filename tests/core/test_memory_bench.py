"""benchmarks/converters_infer.py reports minor page faults per run and RSS beside its timings."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_converters_infer_reports_faults_and_rss():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "converters_infer.py"), "--models", "mlp",
                          "--batches", "1", "--repeats", "3"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads(out.stdout[out.stdout.index("{"):])
    (row,) = rec["rows"]
    assert row["isthmus_faults_per_run"] >= 0 and row["onnxruntime_faults_per_run"] >= 0
    assert row["isthmus_faults_per_run"] < 50    # an MLP at batch 1 allocates a few KiB per run
    assert 10 < row["rss_mb"] < 4000
    assert rec["malloc"]["applied"] in (True, False) and rec["malloc"]["reason"]
    assert row["max_rel_err"] < 1e-4
