"""`isthmus split` prices the edge client's own cost (partitioner/client_cost.py): read from the edge
profile's `client` section (else a documented default), passed to the plans, written to plan.json
and printed in the report; a large per-call cost keeps the model on the edge."""
import json
import textwrap
from dataclasses import replace

import pytest

from isthmus.apps import cli
from isthmus.apps.deploy import PHONE_PROFILE
from isthmus.partitioner.client_cost import DEFAULT_EDGE_SLOWDOWN, HERE, ClientCost
from isthmus.partitioner.devices import DeviceProfile

MODEL = textwrap.dedent('''
    import numpy as np
    import isthmus as ism

    def build():
        rng = np.random.default_rng(0)
        g = ism.Graph(seed=0)
        with g.as_default():
            h = ism.placeholder("float32", (None, 784), name="x")
            for i, w in enumerate((1024, 1024, 10)):
                wt = ism.constant((rng.standard_normal((h.shape[1], w)) * 0.05).astype(np.float32), name=f"w{i}")
                h = ism.relu(ism.matmul(h, wt), name=f"h{i}")
        return g, [h]
''')


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("splitcc")
    (d / "mlp.py").write_text(MODEL)
    phone = DeviceProfile.load(PHONE_PROFILE)
    for name, client in (("free", ClientCost()), ("costly", ClientCost(request_s=1e-3, call_s=2.0, byte_s=1e-9))):
        replace(phone, name=f"phone, client {name}", client=client).save(str(d / f"{name}.json"))
    return d


def _split(capsys, d, out, *flags):
    capsys.readouterr()
    assert cli.main(["split", f"{d / 'mlp.py'}:build", "-o", str(d / out), "--bandwidth", "1000mbps",
                     "--rtt", "1ms", "--force", *flags]) == 0
    return capsys.readouterr().out, json.loads((d / out / "plan.json").read_text())


def test_split_reads_the_client_cost_from_the_edge_profile_and_prints_it(setup, capsys):
    d = setup
    out0, plan0 = _split(capsys, d, "free", "--edge-profile", str(d / "free.json"))
    out1, plan1 = _split(capsys, d, "costly", "--edge-profile", str(d / "costly.json"))
    assert plan0["client_cost_s"] == ClientCost().to_dict() and plan0["client_cost_source"].startswith("edge profile")
    assert plan1["client_cost_s"] == ClientCost(request_s=1e-3, call_s=2.0, byte_s=1e-9).to_dict()
    assert "client cost assumed on the edge: 1 ms per request + 0 ms per edge part + 2e+03 ms per remote call" in out1
    # free client, fast link: the phone offloads; a 2 s call keeps everything on the edge
    assert plan0["predicted_s"]["split"] < plan0["predicted_s"]["edge_only"] - 1e-3, plan0["predicted_s"]
    assert set(plan0["placement"].values()) != {"/job:edge/task:0/device:CPU:0"}
    assert set(plan1["placement"].values()) == {"/job:edge/task:0/device:CPU:0"}, plan1["placement"]
    p1 = plan1["predicted_s"]
    assert p1["split"] == pytest.approx(p1["edge_only"], rel=1e-9)
    assert p1["cloud_only"] >= plan0["predicted_s"]["cloud_only"] + 2.0  # every plan pays the client
    assert p1["edge_only"] == pytest.approx(plan0["predicted_s"]["edge_only"] + 1e-3, rel=1e-9)


def test_without_a_client_section_split_prices_the_documented_default(setup, capsys):
    d = setup
    out, plan = _split(capsys, d, "default")   # the built-in edge: this machine 8x slower, no client section
    assert plan["client_cost_s"] == pytest.approx(HERE.scaled(DEFAULT_EDGE_SLOWDOWN).to_dict())
    assert plan["client_cost_source"].startswith("default") and "client cost assumed on the edge" in out
    _, phone = _split(capsys, d, "phone", "--edge-profile", "phone")   # the shipped profile has one
    assert phone["client_cost_s"] == DeviceProfile.load(PHONE_PROFILE).client.to_dict()
    assert phone["client_cost_s"]["call_s"] > 0


def test_profile_client_measures_the_client_and_split_prices_it(setup, capsys):
    """`isthmus profile --client` runs the offload client against a loopback service and writes the
    fitted terms x --slowdown; `isthmus split --edge-profile` then prices exactly those."""
    d = setup
    path = str(d / "measured.json")
    capsys.readouterr()
    assert cli.main(["profile", "--device", "e", "--ops", "MatMul", "--quick", "--slowdown", "8", "--client",
                     "--client-requests", "4", "--out", path, "--force"]) == 0
    assert "wrote the client section of" in capsys.readouterr().out
    client = DeviceProfile.load(path).client
    assert client is not None
    per_call = client.request_s + client.call_s   # what a cloud-only request costs the client, bytes aside
    assert 8 * 5e-6 < per_call < 8 * 20e-3, client   # tens to hundreds of us here (issue 27: 0.145 ms), x 8
    _, plan = _split(capsys, d, "measured", "--edge-profile", path)
    assert plan["client_cost_s"] == client.to_dict() and plan["client_cost_source"] == f"edge profile {path}"
