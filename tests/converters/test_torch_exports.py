"""Models exported by torch.onnx (TorchScript and dynamo exporters) import and match onnxruntime.

The fixtures in torch_models/ are tiny random-weight versions of public architectures written by
torch_models/make.py (run by hand; torch is not needed here). Each imports once with its dynamic
batch axis (and sequence, audio length or image size where exported dynamic) and runs at batch 1
and 32, the other dynamic dims at sizes other than the export's; every output must match onnxruntime within 1e-4 relative
(elementwise rtol 1e-4, with an absolute floor of 1e-4 times the output's largest magnitude).
"""
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import isthmus as ism
from isthmus.converters.onnx_import import from_onnx

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_models")
MODELS = ("bert", "vit", "audio", "mobilenet", "seg", "inception")
EXPORTERS = ("torchscript", "dynamo")
# sizes for the dynamic dims besides the batch, at (batch 1, batch 32): other than the export's own
OTHER_DIMS = {"seq": (9, 23), "samples": (200, 392), "height": (32, 48), "width": (48, 32)}


def _feeds(model, batch, rng, scale=1.0):
    """Random inputs for the model's graph inputs at this batch, its other dynamic dims (sequence, audio
    length, image height and width) sized from OTHER_DIMS (BERT: token ids and a padding mask)."""
    out = {}
    for vi in model.graph.input:
        dims = [batch] + [d.dim_value or OTHER_DIMS[d.dim_param.split("*")[-1]][batch > 1]
                          for d in vi.type.tensor_type.shape.dim[1:]]
        if vi.name == "input_ids":
            out[vi.name] = rng.integers(0, 120, dims).astype(np.int64)
        elif vi.name == "attention_mask":
            out[vi.name] = np.ones(dims, np.int64)
            out[vi.name][::2, 7:] = 0  # every other sequence padded after 7 tokens
        else:
            out[vi.name] = (rng.standard_normal(dims) * scale).astype(np.float32)
    return out


def _check(path, feeds, sess, ins, outs, ref_sess):
    want = ref_sess.run(None, feeds)
    got = sess.run(outs, {ins[k]: v for k, v in feeds.items()})
    assert len(got) == len(want)
    for name, a, b in zip([o.name for o in ref_sess.get_outputs()], got, want):
        assert a.shape == b.shape, f"{path} output {name}: shape {a.shape} vs onnxruntime's {b.shape}"
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(b))),
                                   err_msg=f"{os.path.basename(path)} output {name}")
        if len(b) > 1:  # a fixture whose output ignores its input would check nothing
            assert b.std(axis=0).mean() > 0.01 * np.abs(b).mean(), f"{path} output {name} hardly depends on the input"


def test_every_model_and_exporter_has_a_fixture():
    files = sorted(f for f in os.listdir(HERE) if f.endswith(".onnx"))
    assert files == sorted(f"{m}.{e}.onnx" for m in MODELS for e in EXPORTERS)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", MODELS)
def test_torch_export_imports_and_matches_onnxruntime(name, exporter):
    path = os.path.join(HERE, f"{name}.{exporter}.onnx")
    model = onnx.load(path)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["exporter"] == f"torch.onnx {exporter}" and meta["torch"].startswith("2.")
    assert os.path.getsize(path) < 1 << 20
    for vi in model.graph.input:  # exported with a dynamic batch axis
        assert vi.type.tensor_type.shape.dim[0].dim_param, f"{vi.name}: batch axis is not dynamic"
    g, ins, outs = from_onnx(path)  # imported once, run at two batch sizes
    g.verify()
    sess = ism.Session(g)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (1, 32):
        rng = np.random.default_rng(batch)
        # the audio model's If scales loud clips (mean log power > 0) and passes quiet ones: run both branches
        for scale in ((2.0, 0.01) if name == "audio" else (1.0,)):
            _check(path, _feeds(model, batch, rng, scale), sess, ins, outs, ref)
