"""benchmarks/report.py: reads what benchmarks print and renders docs/benchmarks.md."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
try:
    import report  # noqa: E402
finally:
    sys.path.pop(0)


def test_last_json_finds_the_final_object_indented_or_not():
    text = 'note: warming up\n{"a": 1}\nprogress {not json}\n{\n  "benchmark": "x",\n  "r": {"b": [1, 2]}\n}\n'
    assert report.last_json(text) == {"benchmark": "x", "r": {"b": [1, 2]}}
    assert report.last_json("no json here") is None
    assert report.last_json('{"x": 1}\n{"y": 2}\n') == {"y": 2}


def test_every_listed_benchmark_exists():
    for name, (args, _) in report.BENCHMARKS.items():
        assert os.path.exists(os.path.join(ROOT, "benchmarks", args[0])), name


def test_render_shows_metrics_machine_and_failures():
    ok = {"name": "mlp", "status": "ok", "when": "2026-01-01 00:00 UTC", "seconds": 3.0, "load_before": 0.1,
          "machine": {"cpu": "TestCPU", "cpus": 2, "python": "3.11", "numpy": "2.0", "commit": "abc123"},
          "result": {"benchmark": "mlp", "machine": {}, "train": {"ratio_vs_numpy": 1.02, "target": 1.1},
                     "pass": True}}
    bad = {"name": "cnn", "status": "exit 1", "when": "2026-01-01 00:01 UTC", "seconds": 1.0, "load_before": 0.2,
           "machine": {}, "result": None, "stderr": "Traceback: boom"}
    page = report.render([ok, bad])
    assert "| train.ratio_vs_numpy | 1.02 |" in page and "| pass | true |" in page
    assert "TestCPU x2" in page and "commit abc123" in page and "load average before 0.1" in page
    assert "**exit 1**" in page and "boom" in page
