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


def test_train_mlp_cluster_trains_sync_and_async_on_a_local_cluster():
    out = _run("train_mlp_cluster.py", "--steps", "20", "--batch", "64")
    assert out.returncode == 0, out.stderr[-2000:]
    for mode in ("sync", "async"):
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith(f"{mode}: 20 steps"))
        assert float(line.rsplit("test accuracy ", 1)[1]) > 0.7, line  # 20 steps; 600 reach about 0.97
    assert "40 gradients applied, 0 dropped" in out.stdout  # sync: 2 replicas x 20 steps, all taken
