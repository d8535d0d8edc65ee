"""The examples a user copies from keep running (short versions of them)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script, *args, timeout=240):
    return subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args],
                          capture_output=True, text=True, timeout=timeout)


def test_train_digits_trains_checkpoints_and_restores_in_a_fresh_process(tmp_path):
    out = _run("train_digits.py", "--model", "both", "--epochs", "2", "--ckpt-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    for model in ("mlp", "cnn"):
        assert f"{model}: restored in a fresh process" in out.stdout and "(same)" in out.stdout
    acc = float(out.stdout.split("mlp: test accuracy ")[1].split(";")[0])
    assert acc > 0.85  # two epochs already; the full demo reaches 0.989


def test_lstm_digits_runs():
    out = _run("lstm_digits.py", "--epochs", "2", "--units", "16")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "test accuracy" in out.stdout
