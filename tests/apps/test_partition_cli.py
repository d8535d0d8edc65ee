"""The partition and calibrate commands (their modules; cli.py lists them)."""
import argparse
import textwrap

import pytest

from isthmus.partitioner import calibrate
from isthmus.apps.partition import main
from isthmus.partitioner.devices import DeviceProfile

MODEL = textwrap.dedent('''
    import numpy as np
    import isthmus as ism

    def build():
        g = ism.Graph()
        with g.as_default():
            x = ism.placeholder("float32", (None, 512), name="x")
            h = ism.relu(ism.matmul(x, ism.constant(np.ones((512, 16), np.float32))), name="h")
            y = ism.tanh(ism.matmul(h, ism.constant(np.ones((16, 512), np.float32))), name="y")
        return g, [y]
''')


def test_partition_command_explains_and_draws(tmp_path, capsys):
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    svg, plot = tmp_path / "g.svg", tmp_path / "l.svg"
    assert main([f"{model}:build", "--bandwidth", "5mbps", "--rtt", "40ms", "--batch", "8",
                 "--edge-slowdown", "8", "--svg", str(svg), "--latency-plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "split plan (mincut)" in out and "up 5 Mbit/s" in out and "cloud_only" in out
    assert svg.read_text().startswith("<svg") and plot.read_text().startswith("<svg")
    assert main([f"{model}:build", "--bandwidth", "5mbps", "--call-cost", "3ms"]) == 0
    assert "rtt 40 ms, call 3 ms" in capsys.readouterr().out


def test_calibrate_command_writes_a_profile(tmp_path, capsys):
    p = argparse.ArgumentParser()
    calibrate.add_arguments(p)
    out = tmp_path / "phone.json"
    args = p.parse_args(["--device", "phone", "--out", str(out), "--ops", "Add", "Relu", "--quick",
                         "--slowdown", "8"])
    assert calibrate.run(args) == 0
    prof = DeviceProfile.load(str(out))
    assert prof.name == "phone" and set(prof.op_coeffs) == {"Add", "Relu"}
    assert "wrote" in capsys.readouterr().out


def test_calibrate_command_on_one_blas_thread_in_cpu_time(tmp_path):
    p = argparse.ArgumentParser()
    calibrate.add_arguments(p)
    out = tmp_path / "cloud.json"
    args = p.parse_args(["--out", str(out), "--ops", "Add", "--quick", "--blas-threads", "1", "--clock", "cpu"])
    assert calibrate.run(args) == 0
    assert DeviceProfile.load(str(out)).blas_threads == 1
    if calibrate.current_blas_threads() not in (None, 1):  # several threads: their time is not this thread's
        args = p.parse_args(["--out", str(out), "--ops", "Add", "--quick", "--clock", "cpu"])
        with pytest.raises(SystemExit, match="--blas-threads 1"):
            calibrate.run(args)


def test_partition_prices_the_edge_clients_own_cost(tmp_path, capsys):
    """`isthmus partition` prices the client (issue 27): the profile's client section, else this
    machine's measured client slowed as --edge-slowdown says; the explanation shows it."""
    from dataclasses import replace as dc_replace
    from isthmus.partitioner.client_cost import HERE, ClientCost
    from isthmus.partitioner.devices import EDGE
    f = tmp_path / "m.py"
    f.write_text(MODEL)
    args = argparse.Namespace(cloud_profile=None, edge_profile=None, edge_slowdown=4.0, bandwidth="5mbps",
                              rtt="40ms", downlink=None, call_cost="0ms", batch=1)
    from isthmus.apps.partition import cost_model
    assert cost_model(args).client == HERE.scaled(4.0)
    prof = tmp_path / "e.json"
    dc_replace(EDGE, client=ClientCost(call_s=0.5)).save(str(prof))
    args.edge_profile = str(prof)
    assert cost_model(args).client == ClientCost(call_s=0.5)
    assert main([f"{f}:build", "--edge-profile", str(prof), "--bandwidth", "1000mbps", "--rtt", "1ms"]) == 0
    out = capsys.readouterr().out   # a 0.5 s call: cloud-only pays it, the plan keeps to the edge
    assert float(out.split("cloud_only ")[1].split(" ms")[0]) >= 500.0, out
    assert "no faster than edge_only" in out, out
