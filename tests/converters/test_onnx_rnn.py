"""ONNX LSTM, GRU and RNN import (lowered to while_loop) against onnxruntime, on random models
built with onnx.helper: both directions, per-example lengths, initial states, batch-major
layout, clipping, GRU's linear_before_reset, LSTM peepholes; plus a symbolic batch and
sequence length, and gradients flowing through the imported loop."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import isthmus as ism
from isthmus.converters import from_onnx

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _model(op, t, b, i, h, direction="forward", lens=None, init=False, layout=0, peep=False, seed=0,
           symbolic=False, **attrs):
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    inits = [numpy_helper.from_array(rng.standard_normal((d, g * h, i)).astype(np.float32) * 0.5, "W"),
             numpy_helper.from_array(rng.standard_normal((d, g * h, h)).astype(np.float32) * 0.5, "R"),
             numpy_helper.from_array(rng.standard_normal((d, 2 * g * h)).astype(np.float32) * 0.5, "B")]
    xs = ["T", "N"] if symbolic else [t, b]
    xshape = [xs[1], xs[0], i] if layout else [xs[0], xs[1], i]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, xshape)]
    names = ["X", "W", "R", "B", "", "", ""]
    feeds = {"X": rng.standard_normal((b, t, i) if layout else (t, b, i)).astype(np.float32)}
    if lens is not None:
        inputs.append(helper.make_tensor_value_info("L", TensorProto.INT32, [b]))
        names[4] = "L"
        feeds["L"] = np.asarray(lens, np.int32)
    if init:
        sshape = (b, d, h) if layout else (d, b, h)
        inputs.append(helper.make_tensor_value_info("H0", TensorProto.FLOAT, list(sshape)))
        names[5] = "H0"
        feeds["H0"] = rng.standard_normal(sshape).astype(np.float32)
        if op == "LSTM":
            inputs.append(helper.make_tensor_value_info("C0", TensorProto.FLOAT, list(sshape)))
            names[6] = "C0"
            feeds["C0"] = rng.standard_normal(sshape).astype(np.float32)
    if peep:
        inits.append(numpy_helper.from_array(rng.standard_normal((d, 3 * h)).astype(np.float32), "P"))
        names.append("P")
    names = names[:6] if op != "LSTM" else names
    while names and not names[-1]:
        names.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=h, direction=direction, layout=layout, **attrs)
    vi = [helper.make_tensor_value_info(o, TensorProto.FLOAT, [f"{o}{k}" for k in range(4 if o == "Y" else 3)])
          for o in outs]
    m = helper.make_model(helper.make_graph([node], "rnn", inputs, vi, inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m, feeds


def _reference(m, feeds):
    """onnxruntime; the onnx reference evaluator for batch-major layout, which onnxruntime lacks."""
    if any(a.name == "layout" and a.i for a in m.graph.node[0].attribute):
        from onnx.reference import ReferenceEvaluator
        return ReferenceEvaluator(m).run(None, feeds)
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _compare(m, feeds, rtol=1e-4, atol=1e-5):
    want = _reference(m, feeds)
    g, ins, outs = from_onnx(m)
    got = ism.Session(g).run(outs, {ins[k]: v for k, v in feeds.items()})
    for o, gv, wv in zip(m.graph.output, got, want):
        assert gv.shape == wv.shape, (o.name, gv.shape, wv.shape)
        np.testing.assert_allclose(gv, wv, rtol=rtol, atol=atol, err_msg=o.name)
    return g, ins, outs


CASES = [
    ("lstm_fwd", "LSTM", dict()),
    ("lstm_bidir_lens_init", "LSTM", dict(direction="bidirectional", lens=[5, 2, 0 + 1], init=True)),
    ("lstm_reverse_lens_peep_clip", "LSTM", dict(direction="reverse", lens=[3, 5, 1], peep=True, clip=1.5)),
    ("lstm_batch_major", "LSTM", dict(layout=1, init=True, direction="bidirectional")),
    ("lstm_input_forget_lens", "LSTM", dict(input_forget=1, lens=[2, 5, 4], init=True)),
    ("lstm_reverse_init", "LSTM", dict(direction="reverse", init=True)),
    ("lstm_bidir_nobias_out", "LSTM", dict(direction="bidirectional")),
    ("gru_fwd", "GRU", dict()),
    ("gru_lbr_bidir_lens", "GRU", dict(linear_before_reset=1, direction="bidirectional", lens=[4, 5, 2])),
    ("gru_reverse_init_layout", "GRU", dict(direction="reverse", init=True, layout=1)),
    ("gru_lbr_reverse_init", "GRU", dict(direction="reverse", init=True, linear_before_reset=1)),
    ("rnn_fwd_relu", "RNN", dict(activations=["Relu"])),
    ("rnn_bidir_lens_init", "RNN", dict(direction="bidirectional", lens=[1, 5, 3], init=True)),
    ("rnn_reverse_hardsigmoid", "RNN", dict(direction="reverse", activations=["HardSigmoid"],
                                            activation_alpha=[0.3], activation_beta=[0.4])),
]


# fused steps -> ONNX primitives; LSTMSequence / GRUSequence -> ONNX LSTM / GRU
EXPORT_BACK = {"gru_fwd", "gru_lbr_bidir_lens", "lstm_bidir_lens_init", "lstm_fwd", "lstm_reverse_init",
               "lstm_bidir_nobias_out", "gru_lbr_reverse_init"}


# constant weights, default activations, no clip/peepholes/input_forget: one sequence node per direction
SEQUENCE_OP = {"lstm_fwd", "lstm_bidir_lens_init", "lstm_batch_major", "lstm_reverse_init", "lstm_bidir_nobias_out",
               "gru_fwd", "gru_lbr_bidir_lens", "gru_reverse_init_layout", "gru_lbr_reverse_init"}


@pytest.mark.parametrize("name,op,kw", CASES, ids=[c[0] for c in CASES])
def test_rnn_matches_onnxruntime(name, op, kw):
    m, feeds = _model(op, t=5, b=3, i=4, h=6, seed=len(name), **kw)
    g, ins, outs = _compare(m, feeds)
    ops = {n.op for n in g.nodes}
    assert (f"{op}Sequence" in ops and "While" not in ops) == (name in SEQUENCE_OP), ops
    if name in EXPORT_BACK:  # the imported loop exported again (While -> Loop) still matches
        from isthmus.converters import to_onnx
        back = to_onnx(g, outs)
        sess = ort.InferenceSession(back.SerializeToString(), providers=["CPUExecutionProvider"])
        got = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
        for gv, wv in zip(got, _reference(m, feeds)):
            np.testing.assert_allclose(gv, wv, rtol=1e-4, atol=1e-5)


def test_symbolic_batch_and_time():
    m, feeds = _model("LSTM", t=7, b=2, i=3, h=4, direction="bidirectional", symbolic=True)
    g, ins, outs = from_onnx(m)
    assert ins["X"].shape == (None, None, 3)
    _compare(m, feeds)
    rng = np.random.default_rng(9)  # the same graph at another length and batch
    x2 = rng.standard_normal((3, 5, 3)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x2})
    got = ism.Session(g).run(outs, {ins["X"]: x2})
    for gv, wv in zip(got, want):
        np.testing.assert_allclose(gv, wv, rtol=1e-4, atol=1e-5)


def test_gradient_through_imported_gru_matches_finite_differences():
    m, feeds = _model("GRU", t=4, b=2, i=3, h=5, direction="bidirectional", lens=[4, 2], seed=3)
    g, ins, outs = from_onnx(m, trainable=True)
    with g.as_default():
        loss = ism.reduce_sum(ism.square(outs[0]))
        w = [v for v in ism.global_variables(g) if v.name.startswith("R")][0]
        (dw,) = ism.gradients(loss, [w])
    sess = ism.Session(g)
    sess.run(ism.global_variables_initializer(g))
    feed = {ins[k]: v for k, v in feeds.items()}
    if isinstance(dw, ism.IndexedSlices):  # W and R reach the loop through a gather
        vals, idx = sess.run([dw.values, dw.indices], feed)
        got = np.zeros(tuple(w.shape), np.float64)
        np.add.at(got, idx, vals)
    else:
        got = sess.run(dw, feed)
    r0 = sess.run(w)
    rng = np.random.default_rng(0)
    for _ in range(4):  # central differences at a few random coordinates
        idx = tuple(int(rng.integers(0, s)) for s in r0.shape)
        eps = 1e-2
        vals = []
        for sgn in (1, -1):
            r = r0.copy()
            r[idx] += sgn * eps
            w.load(r, sess) if hasattr(w, "load") else sess.run(ism.core.ops.state.assign(w, r))
            vals.append(float(sess.run(loss, feed)))
        np.testing.assert_allclose(got[idx], (vals[0] - vals[1]) / (2 * eps), rtol=2e-2, atol=2e-3)


def test_bad_shapes_and_activations_name_the_node():
    m, feeds = _model("RNN", t=2, b=1, i=3, h=4, activations=["Elu"])
    m.graph.node[0].name = "rnn7"
    with pytest.raises(ism.GraphError, match="rnn7.*Elu"):
        from_onnx(m)
    m, _ = _model("LSTM", t=2, b=1, i=3, h=4)
    m.graph.node[0].attribute[[a.name for a in m.graph.node[0].attribute].index("hidden_size")].i = 5
    with pytest.raises(ism.GraphError, match="W has shape"):
        from_onnx(m)


def test_lstm_classifier_imports_splits_and_exports_back():
    """An ONNX LSTM classifier (the issue's whole-model check): imported == onnxruntime, split
    between edge and cloud by the partitioner, and exported back to ONNX (While -> Loop)."""
    from isthmus.converters import to_onnx
    from isthmus.partitioner import CostModel, LinkModel, SplitSession, plan_split
    rng = np.random.default_rng(11)
    t, b, i, h, k = 6, 2, 5, 8, 3
    inits = [numpy_helper.from_array((rng.standard_normal((1, 4 * h, i)) * 0.4).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((1, 4 * h, h)) * 0.4).astype(np.float32), "R"),
             numpy_helper.from_array((rng.standard_normal((1, 8 * h)) * 0.4).astype(np.float32), "B"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0"),
             numpy_helper.from_array(rng.standard_normal((h, k)).astype(np.float32), "head_w"),
             numpy_helper.from_array(rng.standard_normal(k).astype(np.float32), "head_b")]
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["", "yh"], hidden_size=h),
             helper.make_node("Squeeze", ["yh", "ax0"], ["hT"]),
             helper.make_node("Gemm", ["hT", "head_w", "head_b"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["p"], axis=-1)]
    m = helper.make_model(helper.make_graph(nodes, "clf", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                         [t, b, i])],
                                            [helper.make_tensor_value_info("p", TensorProto.FLOAT, [b, k])], inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    xv = rng.standard_normal((t, b, i)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": xv})[0]
    g, ins, outs = from_onnx(m)
    np.testing.assert_allclose(ism.Session(g).run(outs[0], {ins["x"]: xv}), want, rtol=1e-4, atol=1e-6)
    plan = plan_split(g, CostModel.edge_cloud(LinkModel.parse("20mbps", "40ms"), batch_size=b), outputs=[outs[0]])
    split = SplitSession(plan.partition()).run({ins["x"].node.name: xv})[0]
    np.testing.assert_allclose(split, want, rtol=1e-4, atol=1e-6)
    assert [n.op for n in g.nodes].count("LSTMSequence") == 1  # constant weights: one fused node
    back = to_onnx(g, outs)
    assert any(nd.op_type == "LSTM" for nd in back.graph.node)  # and back to an ONNX LSTM
    again = ort.InferenceSession(back.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": xv})[0]
    np.testing.assert_allclose(again, want, rtol=1e-4, atol=1e-6)
    # trainable weights: the differentiable loop of LSTMStep nodes, exported as While -> Loop
    g2, ins2, outs2 = from_onnx(m, trainable=True)
    ops2 = {n.op for n in g2.nodes}
    assert "LSTMSequence" not in ops2 and "While" in ops2
    with g2.as_default():
        sess = ism.Session(g2)
        sess.run(ism.global_variables_initializer())
    back2 = to_onnx(sess, outs2)
    assert any(nd.op_type == "Loop" for nd in back2.graph.node)
    again2 = ort.InferenceSession(back2.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": xv})[0]
    np.testing.assert_allclose(again2, want, rtol=1e-4, atol=1e-6)
