"""A split run the way an ONNX Runtime Mobile app runs it: the edge part as .onnx in onnxruntime, the
cloud part on the offload service (127.0.0.1, a free port), one Infer per request. fp32 equals the
unsplit model (1e-5 relative); int8 (QDQ) stays within the int8 model's own drift from fp32."""
import json

import numpy as np
import pytest

from isthmus.cloud.offload import OffloadServer
from isthmus.cloud.offload_model import cloud_part, save_cloud_parts
from isthmus.converters.onnx_edge import edge_to_onnx, split_to_onnx
from isthmus.converters.split_export import SplitWriter, export_split
from isthmus.edge import Interpreter
from isthmus.edge.format import EdgeModelError
from isthmus.edge.loader import verify_all
from isthmus.edge.split_model import load_split, read_split
from isthmus.wire.split_format import SPLIT_KEY

from ..split_models import adaptive_cnn

pytest.importorskip("onnxruntime")
from isthmus.edge.onnxruntime_client import OffloadCallError, OnnxRuntimeOffloadClient  # noqa: E402


def _bytes(proto) -> bytes:
    return proto.SerializeToString()


def _rel(got, want) -> float:
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))


@pytest.fixture(scope="module", params=["fp32", "int8"])
def split(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("ortclient")
    sess, x, y, _, ap = adaptive_cnn()
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((3, 1, 3, 32, 32)).astype(np.float32)
    int8 = request.param == "int8"
    calib = [{"x": v} for v in rng.standard_normal((8, 1, 3, 32, 32)).astype(np.float32)] if int8 else None
    sp = export_split(sess, [y], ap, int8=int8, calibration=calib, model_name="cnn")
    sp.save(str(d / "cnn.isth"))
    save_cloud_parts(str(d / "cnn.cloud"), [cloud_part(sp.graph, i, o, n) for n, i, o in sp.cloud_signatures()],
                     model="cnn")
    server = OffloadServer(str(d / "cnn.cloud"), max_batch_size=1, max_queue_delay_ms=0.1)
    cuts = [c for c in sp.cuts if c.cloud_part]
    yield dict(sp=sp, path=str(d / "cnn.isth"), server=server, xs=xs, int8=int8, cuts=cuts,
               ref=[sess.run(y, {x: v}) for v in xs])
    server.stop(grace=0)


def test_every_cut_through_onnxruntime_and_the_service(split):
    """Each cut with a cloud part (the input sent raw, and cuts inside the network) gives the unsplit
    model's output: fp32 to 1e-5 relative; int8 no further from isthmus's own int8 split (same cloud)
    than that is from fp32."""
    assert len(split["cuts"]) >= 2, [c.inputs for c in split["sp"].cuts]
    models = {c.name: c.model for c in load_split(split["path"]).cuts}
    for cut in split["cuts"]:
        part = split_to_onnx(split["path"], cut=cut.name)
        assert part.post is None and part.wire_inputs == cut.inputs
        with OnnxRuntimeOffloadClient(_bytes(part.edge), split["server"].address, deadline_ms=60000) as client:
            assert client.send_names == cut.inputs and client.part == cut.cloud_part
            for v, r in zip(split["xs"], split["ref"]):
                got = client.invoke(v)[0]
                if not split["int8"]:
                    assert _rel(got, r) <= 1e-5, (cut.name, _rel(got, r))
                    continue
                mine = Interpreter(models[cut.name], remote=lambda p, arrays: client.call_cloud(arrays)).invoke(v)[0]
                drift = np.abs(mine - r).max()
                assert np.abs(got - mine).max() <= max(drift, 1e-3), (cut.name, np.abs(got - mine).max(), drift)


def test_errors_name_the_part_and_refuse_a_model_that_is_no_edge_part(split):
    part = split_to_onnx(split["path"], cut=split["cuts"][-1].name)
    client = OnnxRuntimeOffloadClient(_bytes(part.edge), split["server"].address, deadline_ms=60000)
    client.part = "missing"
    with pytest.raises(OffloadCallError, match="Infer 'missing'"):
        client.invoke(split["xs"][0])
    client.close()
    whole = edge_to_onnx(load_split(split["path"]).full)   # no split metadata: not an edge part
    with pytest.raises(EdgeModelError, match="not the edge part of a split"):
        OnnxRuntimeOffloadClient(_bytes(whole), split["server"].address)
    with pytest.raises(EdgeModelError, match="onnxruntime cannot load"):
        OnnxRuntimeOffloadClient(b"not an onnx file", split["server"].address)


def _split_with_work_after_the_answer() -> bytes:
    """One cut: conv on the edge, the cloud's answer, then edge work reading the answer and x."""
    rng = np.random.default_rng(0)
    w = SplitWriter()
    w.begin("cut0")
    x = w.add_input("x", "float32", (1, 3, 6, 6))
    k = w.add_constant("k", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    h = w.add_tensor("h", "float32", (1, 4, 6, 6))
    w.add_operator("Conv2D", [x, k], [h], {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "groups": 1})
    r = w.add_tensor("answer", "float32", (1, 4, 6, 6))
    w.add_remote_part("cut0", [h], [r])
    k2 = w.add_constant("k2", rng.standard_normal((4, 3, 1, 1)).astype(np.float32))
    s = w.add_tensor("skip", "float32", (1, 4, 6, 6))
    w.add_operator("Conv2D", [x, k2], [s], {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "groups": 1})
    a = w.add_tensor("sum", "float32", (1, 4, 6, 6))
    w.add_operator("Add", [r, s], [a])
    y = w.add_tensor("y", "float32", (1, 4, 6, 6))
    w.add_operator("Relu", [a], [y])
    w.mark_output(y)
    w.metadata[SPLIT_KEY] = json.dumps({"version": 1, "model": "m", "full": None, "rtt_s": 0.01, "cuts": [
        {"name": "cut0", "subgraph": 0, "cloud_part": "cut0", "inputs": ["conv:0"], "outputs": ["cloud:0"],
         "min_bandwidth_bps": 0, "max_bandwidth_bps": None, "predicted_s": 0.0, "terms": [0, 0, 1, 0, 1]}]})
    return w.to_bytes()


def test_a_cut_with_edge_work_after_the_answer_runs_its_post_part():
    """split_to_onnx writes the part after the answer (inputs: the answer, then the model inputs it
    reads); the client runs both around its cloud call and gets what isthmus's interpreter gets."""
    data = _split_with_work_after_the_answer()
    part = split_to_onnx(data, cut="cut0")
    assert part.post is not None and [o.name for o in part.edge.graph.output] == ["conv:0"]
    assert [i.name for i in part.post.graph.input] == ["answer", "x"]
    cloud = lambda arrays: [np.tanh(arrays[0]) - 0.3]   # noqa: E731  (the cloud part, as a function)
    model = read_split(verify_all(data)).cuts[0].model
    xv = np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(np.float32)
    want = Interpreter(model, remote=lambda p, arrays: cloud(arrays)).invoke(xv)[0]
    client = OnnxRuntimeOffloadClient(_bytes(part.edge), "127.0.0.1:1", post=_bytes(part.post))
    client.call_cloud = cloud
    assert _rel(client.invoke(xv)[0], want) <= 1e-5
