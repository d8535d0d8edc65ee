"""The short version of benchmarks/reliability.py: every harness, a few hundred mutated inputs.

Each harness runs in its own subprocess with its address space capped at 1 GiB above its
start and a 2 s alarm per input (as in the full run); any undocumented exception, hang or
memory error fails the test and names the harness and the first messages.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "reliability.py")
HARNESSES = ["edge_loader", "onnx_importer", "checkpoint_loader", "graphdef_decoder", "tensorproto_decoder", "recvtensor_reader",
             "chunk_stream_reader", "tflite_importer"]


@pytest.mark.parametrize("harness", HARNESSES)
def test_harness_short_run(harness):
    out = subprocess.run([sys.executable, SCRIPT, "--worker", harness, "--inputs", "300", "--seed", "1"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["inputs"] == 300
    assert (row["crashes"], row["hangs"], row["over_1GiB"]) == (0, 0, 0), row["examples"]
    assert row["reached_deep"] > 0  # some mutants get past the first check, so the deeper code is fuzzed too


def test_all_harnesses_are_in_the_short_run():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        import reliability
    finally:
        sys.path.pop(0)
    assert sorted(reliability.HARNESSES) == sorted(HARNESSES)
