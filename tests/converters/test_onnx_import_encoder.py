"""A BERT-style encoder layer written the way torch.onnx exports one (opset 13 and 17): symbolic batch
and sequence dims, head reshapes computed from Shape/Gather/Unsqueeze/Concat, position embeddings
sliced to the run-time length, an additive attention mask built with Cast/Sub/Mul, erf-GELU and
LayerNormalization (decomposed at opset 13). One import runs at batch 1 and 32 and matches
onnxruntime within 1e-4 relative."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import isthmus as ism
from isthmus.converters.onnx_import import from_onnx

F, I64 = TensorProto.FLOAT, TensorProto.INT64
D, H, FF, VOCAB, MAXLEN = 16, 2, 32, 50, 64


def _weights(rng):
    w = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    return {"tok": w(VOCAB, D), "pos": w(MAXLEN, D), "wq": w(D, D), "wk": w(D, D), "wv": w(D, D), "wo": w(D, D),
            "bq": w(D), "bk": w(D), "bv": w(D), "bo": w(D), "w1": w(D, FF), "b1": w(FF), "w2": w(FF, D), "b2": w(D),
            "g1": 1 + w(D), "be1": w(D), "g2": 1 + w(D), "be2": w(D)}


def _ln(n, x, g, b, out, opset, tag):
    if opset >= 17:
        return [n("LayerNormalization", [x, g, b], [out], axis=-1, epsilon=1e-5)]
    return [n("ReduceMean", [x], [f"{tag}_m"], axes=[-1]), n("Sub", [x, f"{tag}_m"], [f"{tag}_c"]),
            n("Pow", [f"{tag}_c", "two_f"], [f"{tag}_sq"]), n("ReduceMean", [f"{tag}_sq"], [f"{tag}_v"], axes=[-1]),
            n("Add", [f"{tag}_v", "eps"], [f"{tag}_ve"]), n("Sqrt", [f"{tag}_ve"], [f"{tag}_s"]),
            n("Div", [f"{tag}_c", f"{tag}_s"], [f"{tag}_nrm"]), n("Mul", [f"{tag}_nrm", g], [f"{tag}_g"]),
            n("Add", [f"{tag}_g", b], [out])]


def _encoder(opset):
    n = helper.make_node
    nodes = [
        n("Gather", ["tok", "ids"], ["emb"]),
        n("Shape", ["ids"], ["ids_shape"]), n("Gather", ["ids_shape", "one_s"], ["seq"]),
        n("Unsqueeze", ["seq", "ax0"], ["seq1"]) if opset >= 13 else n("Unsqueeze", ["seq"], ["seq1"], axes=[0]),
        n("Slice", ["pos", "zero1", "seq1", "zero1"], ["pos_used"]), n("Add", ["emb", "pos_used"], ["x0"]),
        # attention mask [B, T] -> additive [B, 1, 1, T]
        n("Unsqueeze", ["mask", "ax12"], ["m4"]) if opset >= 13 else n("Unsqueeze", ["mask"], ["m4"], axes=[1, 2]),
        n("Cast", ["m4"], ["m4f"], to=F), n("Sub", ["one_f", "m4f"], ["inv"]), n("Mul", ["inv", "neg_big"], ["bias"]),
        # heads: [B, T, D] -> [B, T, H, D/H] -> [B, H, T, D/H], the shape computed at run time
        n("Shape", ["x0"], ["xs"]), n("Gather", ["xs", "zero_s"], ["bsz"]),
        n("Unsqueeze", ["bsz", "ax0"], ["bsz1"]) if opset >= 13 else n("Unsqueeze", ["bsz"], ["bsz1"], axes=[0]),
        n("Concat", ["bsz1", "seq1", "heads"], ["hshape"], axis=0),
        n("Concat", ["bsz1", "seq1", "dmodel"], ["mshape"], axis=0)]
    for t in "qkv":
        nodes += [n("MatMul", ["x0", f"w{t}"], [f"{t}0"]), n("Add", [f"{t}0", f"b{t}"], [f"{t}1"]),
                  n("Reshape", [f"{t}1", "hshape"], [f"{t}2"]),
                  n("Transpose", [f"{t}2"], [f"{t}h"], perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3])]
    nodes += [n("MatMul", ["qh", "kh"], ["sc0"]), n("Div", ["sc0", "sqrt_dk"], ["sc1"]), n("Add", ["sc1", "bias"], ["sc2"]),
              n("Softmax", ["sc2"], ["att"], axis=-1 if opset >= 13 else 3), n("MatMul", ["att", "vh"], ["ctx0"]),
              n("Transpose", ["ctx0"], ["ctx1"], perm=[0, 2, 1, 3]), n("Reshape", ["ctx1", "mshape"], ["ctx"]),
              n("MatMul", ["ctx", "wo"], ["o0"]), n("Add", ["o0", "bo"], ["o1"]), n("Add", ["o1", "x0"], ["r1"])]
    nodes += _ln(n, "r1", "g1", "be1", "h1", opset, "ln1")
    nodes += [n("MatMul", ["h1", "w1"], ["f0"]), n("Add", ["f0", "b1"], ["f1"]),
              n("Div", ["f1", "sqrt2"], ["f2"]), n("Erf", ["f2"], ["f3"]), n("Add", ["f3", "one_f"], ["f4"]),
              n("Mul", ["f1", "f4"], ["f5"]), n("Mul", ["f5", "half"], ["f6"]),
              n("MatMul", ["f6", "w2"], ["f7"]), n("Add", ["f7", "b2"], ["f8"]), n("Add", ["f8", "h1"], ["r2"])]
    nodes += _ln(n, "r2", "g2", "be2", "out", opset, "ln2")
    consts = {"one_s": np.array(1, np.int64), "zero_s": np.array(0, np.int64), "zero1": np.array([0], np.int64),
              "ax0": np.array([0], np.int64), "ax12": np.array([1, 2], np.int64),
              "heads": np.array([H, D // H], np.int64), "dmodel": np.array([D], np.int64),
              "one_f": np.array(1.0, np.float32), "neg_big": np.array(-10000.0, np.float32),
              "sqrt_dk": np.array(np.sqrt(D // H), np.float32), "sqrt2": np.array(np.sqrt(2.0), np.float32),
              "half": np.array(0.5, np.float32), "two_f": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32)}
    inits = [numpy_helper.from_array(v, k) for k, v in {**_weights(np.random.default_rng(0)), **consts}.items()]
    g = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("ids", I64, ["batch", "seq"]),
                                             helper.make_tensor_value_info("mask", I64, ["batch", "seq"])],
                          [helper.make_tensor_value_info("out", F, ["batch", "seq", D])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_encoder_layer_imports_once_and_runs_at_batch_1_and_32(opset):
    model = _encoder(opset)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    g, ins, outs = from_onnx(model)
    g.verify()
    sess = ism.Session(g)
    rng = np.random.default_rng(1)
    for batch, seq in ((1, 7), (32, 12)):
        ids = rng.integers(0, VOCAB, (batch, seq)).astype(np.int64)
        mask = (rng.random((batch, seq)) > 0.2).astype(np.int64)
        mask[:, 0] = 1
        want = ref.run(None, {"ids": ids, "mask": mask})[0]
        got = sess.run(outs[0], {ins["ids"]: ids, ins["mask"]: mask})
        assert got.shape == want.shape == (batch, seq, D)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
