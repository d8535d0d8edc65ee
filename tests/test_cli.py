"""The `isthmus` command: help, version, ops; subcommands import only what they need."""
import json
import subprocess
import sys


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "isthmus.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_commands_and_version():
    out = _run("--help")
    assert out.returncode == 0
    for cmd in ("demo", "ops", "partition", "calibrate"):
        assert cmd in out.stdout
    assert _run("--version").stdout.strip() == "0.1.0"


def test_ops_json_lists_every_registered_op_with_its_gradient_flag():
    out = _run("ops", "--json")
    rows = json.loads(out.stdout)
    by = {r["op"]: r for r in rows}
    assert by["MatMul"]["gradient"] and by["Conv2D"]["gradient"] and not by["Placeholder"]["gradient"]
    assert len(rows) > 100
