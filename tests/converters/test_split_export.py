"""Split export: one edge file carrying every candidate cut of the adaptive planner, the full
model, and each cut's link range; each cut run with its cloud half equals the unsplit model."""
import json

import numpy as np
import pytest

import isthmus as ism
from isthmus.cloud.offload_model import cloud_part
from isthmus.converters.edge_export import to_edge
from isthmus.converters.split_export import export_split
from isthmus.wire.split_format import SPLIT_KEY
from isthmus.edge import EdgeModelError, Interpreter, load
from isthmus.edge.split_model import load_split
from isthmus.partitioner.costmodel import CostModel
from isthmus.partitioner.devices import CLOUD_DEVICE, EDGE_DEVICE
from isthmus.wire.link import LinkModel
from isthmus.partitioner.plan import AdaptivePlanner
from isthmus.partitioner.problem import Constraints

from ..split_models import GRID, adaptive_cnn


@pytest.fixture(scope="module")
def cnn():
    sess, x, y, cm, ap = adaptive_cnn()
    xs = np.random.default_rng(0).standard_normal((4, 1, 3, 32, 32)).astype(np.float32)
    return dict(sess=sess, x=x, y=y, ap=ap, cm=cm, xs=xs, ref=[sess.run(y, {x: v}) for v in xs])


def _cloud(sp, cut_name):
    """The cut's cloud half as the offload service builds it, run by a core Session."""
    name, ins, outs = next(s for s in sp.cloud_signatures() if s[0] == cut_name)
    part = cloud_part(sp.graph, ins, outs, name, check_batching=False)
    sess = ism.Session(part.graph)
    fetch = [part.graph.tensor(s.tensor) for s in part.outputs]
    feeds = [part.graph.tensor(s.tensor) for s in part.inputs]
    return lambda remote, arrays: sess.run(fetch, dict(zip(feeds, arrays)))


def _run_cut(sp, cut, x):
    if not cut.cloud_part:
        return Interpreter(cut.model).invoke(x)[0]
    return Interpreter(cut.model, remote=_cloud(sp, cut.cloud_part)).invoke(x)[0]


def test_cuts_ranges_and_results(cnn, tmp_path):
    sp = export_split(cnn["sess"], [cnn["y"]], cnn["ap"])
    path = sp.save(str(tmp_path / "cnn.isth"))
    sm = load_split(path)
    assert len(sm.cuts) == 4 and sm.cuts[0].cloud_part == "" and sm.cuts[-1].inputs == ["x:0"]
    assert any(c.inputs and c.inputs != ["x:0"] for c in sm.cuts)  # a cut inside the network
    assert sm.cuts[0].min_bandwidth_bps == 0 and all(a.max_bandwidth_bps == b.min_bandwidth_bps for a, b in zip(sm.cuts, sm.cuts[1:]))
    # the range holding a bandwidth names a plan as fast as the planner's own choice there
    for bw in GRID:
        link = cnn["cm"].link.with_uplink(bw)
        k = sm.cut_for(bw)
        mine = sp.cuts[k].terms
        pred = mine[0] + mine[1] / link.up_bandwidth_bps + mine[3] / link.down_bandwidth_bps + (mine[2] + mine[4]) * link.rtt_s / 2
        assert pred == pytest.approx(cnn["ap"].choose(link).predict(link), rel=1e-9), bw
    # every cut, its edge part on the interpreter and its cloud part on a Session, equals the unsplit graph
    for cut in sm.cuts:
        for v, r in zip(cnn["xs"], cnn["ref"]):
            np.testing.assert_allclose(_run_cut(sp, cut, v), r, rtol=1e-4, atol=1e-6)
    # the weights every cut shares with the full model are stored once
    assert len(sp.data) < 1.5 * len(to_edge(cnn["sess"], [cnn["y"]]))
    meta = json.loads(sm.metadata[SPLIT_KEY])
    assert meta["full"] == 0 and [c["name"] for c in meta["cuts"]] == [c.name for c in sp.cuts]
    # the single-model loader reads one subgraph only, and says so
    with pytest.raises(EdgeModelError, match="expected one subgraph"):
        load(path)


def test_int8_cuts_stay_within_quantization_tolerance(cnn):
    rng = np.random.default_rng(1)
    calib = [{"x": v} for v in rng.standard_normal((8, 1, 3, 32, 32)).astype(np.float32)]
    sp = export_split(cnn["sess"], [cnn["y"]], cnn["ap"], int8=True, calibration=calib)
    from isthmus.edge.loader import verify_all
    from isthmus.edge.split_model import read_split
    sm = read_split(verify_all(sp.data))
    inner = [c for c in sm.cuts if c.cloud_part and c.inputs != ["x:0"]]
    assert inner and any(t.dtype == np.int8 for t in inner[0].model.tensors)
    for cut in sm.cuts:
        got = np.concatenate([_run_cut(sp, cut, v) for v in cnn["xs"]])
        ref = np.concatenate(cnn["ref"])
        assert np.abs(got - ref).max() < 0.03, (cut.name, np.abs(got - ref).max())
    assert not np.array_equal(_run_cut(sp, inner[0], cnn["xs"][0]), cnn["ref"][0])
    with pytest.raises(ValueError, match="calibration"):
        export_split(cnn["sess"], [cnn["y"]], cnn["ap"], int8=True)


def test_a_placement_needing_the_cloud_twice_is_skipped_with_a_reason():
    g = ism.Graph(seed=0)
    rng = np.random.default_rng(0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 16), name="x")
        w = [ism.constant(rng.standard_normal((16, 16)).astype(np.float32), name=f"w{i}") for i in range(3)]
        a = ism.relu(ism.matmul(x, w[0], name="mm0"), name="a")
        with ism.device(CLOUD_DEVICE):
            b = ism.matmul(a, w[1], name="b")
        with ism.device(EDGE_DEVICE):
            c = ism.relu(b, name="c")
        with ism.device(CLOUD_DEVICE):
            d = ism.matmul(c, w[2], name="d")
        y = ism.softmax(d, name="y")
    ap = AdaptivePlanner(g, CostModel.edge_cloud(LinkModel(1e6, 1e6, 1e-3)), [y], Constraints(edge_memory_budget=None),
                         bandwidths=[1e6, 1e8])
    assert all(p.placement["b"] == CLOUD_DEVICE and p.placement["c"] == EDGE_DEVICE for p in ap.plans)
    with pytest.raises(ValueError, match="needs the cloud more than once per inference"):
        export_split(g, [y], ap)
