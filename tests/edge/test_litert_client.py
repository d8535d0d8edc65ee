"""A split run the way a phone runs it: the edge part as .tflite in LiteRT, the cloud part on the
offload service (127.0.0.1, a free port), one Infer per request. fp32 equals the unsplit model;
int8 stays within the int8 model's own drift from fp32."""
import os

import numpy as np
import pytest

from isthmus.cloud.offload import OffloadServer
from isthmus.cloud.offload_model import cloud_part, save_cloud_parts
from isthmus.converters.split_export import export_split
from isthmus.converters.tflite_write import TFLiteExportError, split_to_tflite
from isthmus.edge.litert_client import LiteRTOffloadClient, OffloadCallError, tflite_metadata
from isthmus.edge import Interpreter
from isthmus.edge.split_model import load_split

from ..split_models import adaptive_cnn

pytest.importorskip("ai_edge_litert.interpreter")


@pytest.fixture(scope="module", params=["fp32", "int8"])
def split(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("litert")
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
    inner = [c for c in sp.cuts if c.cloud_part and c.inputs != ["x:0"]]
    yield dict(sp=sp, path=str(d / "cnn.isth"), server=server, xs=xs, int8=int8, inner=inner,
               ref=[sess.run(y, {x: v}) for v in xs])
    server.stop(grace=0)


def test_a_cut_inside_the_network_through_litert_and_the_service(split):
    assert split["inner"], [c.inputs for c in split["sp"].cuts]
    cut = split["inner"][0]
    part = split_to_tflite(split["path"], cut=cut.name)
    assert part.cloud_part == cut.cloud_part and part.wire_inputs == cut.inputs and part.post is None
    meta = tflite_metadata(part.edge)
    assert [o["wire_name"] for o in meta["outputs"]] == cut.inputs
    assert meta["inputs"][0]["layout"] == "NHWC"
    model = next(c.model for c in load_split(split["path"]).cuts if c.name == cut.name)
    with LiteRTOffloadClient(part.edge, split["server"].address, deadline_ms=5000) as client:
        for v, r in zip(split["xs"], split["ref"]):
            got = client.invoke(v)[0]
            if not split["int8"]:
                np.testing.assert_allclose(got, r, rtol=1e-4, atol=1e-6)
                continue
            # int8: LiteRT's edge part against isthmus's own int8 edge part, both with the same cloud
            mine = Interpreter(model, remote=lambda part_info, arrays: client.call_cloud(arrays)).invoke(v)[0]
            drift = np.abs(mine - r).max()
            assert np.abs(got - mine).max() <= max(drift, 1e-3), (np.abs(got - mine).max(), drift)


def test_the_sent_tensors_are_what_isthmus_sends(split):
    """The edge part's outputs, as sent, equal the isthmus edge part's: fp32 to 1e-5 relative, int8
    within one step of the int8 tensor each was dequantized from (metadata "quantization")."""
    cut = split["inner"][0]
    part = split_to_tflite(split["path"], cut=cut.name)
    client = LiteRTOffloadClient(part.edge, split["server"].address)
    sm = load_split(split["path"])
    model = next(c.model for c in sm.cuts if c.name == cut.name)
    for v in split["xs"]:
        captured = []
        Interpreter(model, remote=lambda p, arrays: captured.extend(arrays) or [np.zeros((1, 10), np.float32)]
                    ).invoke(v)
        sent = client.run_edge(v)
        assert len(sent) == len(captured)
        for a, b, spec in zip(sent, captured, client.meta["outputs"]):
            assert a.shape == b.shape and a.dtype == np.float32
            tol = spec["quantization"]["scale"][0] * 1.0001 if split["int8"] else 1e-5 * max(1.0, np.abs(b).max())
            assert np.abs(a - b).max() <= tol, (np.abs(a - b).max(), tol)


def test_errors_name_the_cut_and_the_part(split):
    with pytest.raises(TFLiteExportError, match="no cut 'nope'"):
        split_to_tflite(split["path"], cut="nope")
    cut = split["inner"][0]
    part = split_to_tflite(split["path"], cut=cut.name)
    client = LiteRTOffloadClient(part.edge, split["server"].address, deadline_ms=5000)
    client.part = "missing"
    with pytest.raises(OffloadCallError, match="Infer 'missing'"):
        client.invoke(split["xs"][0])


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_write_edge_parts_one_file_per_cut_and_the_full_model(split, tmp_path, fmt):
    import json
    import onnxruntime as ort
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    from isthmus.converters.edge_formats import write_edge_parts
    files = write_edge_parts(split["path"], str(tmp_path), fmt)
    parts = json.loads((tmp_path / "parts.json").read_text())
    assert parts["format"] == fmt and parts["parts"][0]["cut"] == "full"
    cuts = [c for c in split["sp"].cuts if c.cloud_part]
    named = {p["cut"]: p for p in parts["parts"]}
    assert all(named[c.name]["file"] == f"{c.name}.{fmt}" and named[c.name]["wire_inputs"] == c.inputs for c in cuts)
    assert sorted(os.path.basename(f) for f in files) == sorted(
        ["parts.json", f"full.{fmt}"] + [f"{c.name}.{fmt}" for c in cuts])
    x = split["xs"][0]
    if fmt == "tflite":   # the full model alone: the unsplit graph's result
        it = LiteRT(model_path=str(tmp_path / "full.tflite"), num_threads=1)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], np.ascontiguousarray(x.transpose(0, 2, 3, 1)))
        it.invoke()
        got = it.get_tensor(it.get_output_details()[0]["index"])
    else:
        s = ort.InferenceSession(str(tmp_path / "full.onnx"), providers=["CPUExecutionProvider"])
        got = s.run(None, {s.get_inputs()[0].name: x})[0]
    if not split["int8"]:
        np.testing.assert_allclose(got, split["ref"][0], rtol=1e-4, atol=1e-6)
    else:   # against isthmus's own int8 full model, within that model's drift from fp32
        mine = Interpreter(load_split(split["path"]).full).invoke(x)[0]
        assert np.abs(got - mine).max() <= np.abs(mine - split["ref"][0]).max()


def test_int8_outputs_are_dequantized_by_the_client_as_the_file_would(split):
    """output_type="int8": the edge part hands int8 to the app, which dequantizes with the metadata's
    parameters: the same float32 values the file's own DEQUANTIZE gives."""
    if not split["int8"]:
        with pytest.raises(TFLiteExportError, match="cannot be an int8 output"):
            split_to_tflite(split["path"], cut=split["inner"][0].name, output_type="int8")
        return
    cut = split["inner"][0]
    as_float = LiteRTOffloadClient(split_to_tflite(split["path"], cut=cut.name).edge, split["server"].address)
    part = split_to_tflite(split["path"], cut=cut.name, input_type="int8", output_type="int8")
    meta = tflite_metadata(part.edge)
    assert meta["inputs"][0]["dtype"] == "int8" and all(o["dtype"] == "int8" for o in meta["outputs"])
    as_int8 = LiteRTOffloadClient(part.edge, split["server"].address)
    for v in split["xs"]:
        for a, b, spec in zip(as_int8.run_edge(v), as_float.run_edge(v), meta["outputs"]):
            # the int8 input was quantized by the client, not the file: the same rint, at most a step apart
            assert np.abs(a - b).max() <= spec["quantization"]["scale"][0] * 1.0001
    with as_int8:
        got = as_int8.invoke(split["xs"][0])[0]
    assert got.shape == split["ref"][0].shape
