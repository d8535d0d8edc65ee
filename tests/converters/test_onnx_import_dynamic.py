"""Shapes computed at run time: a model whose Reshape/Expand/Pad/Slice/ConstantOfShape/Range/Resize
sizes come from Shape/Gather/arithmetic on inputs with unknown batch and sequence dims imports once
and runs at batch 1 and 32 (and two sequence lengths), matching onnxruntime; with static dims the same
arithmetic folds to constants at import."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import isthmus as ism
from isthmus.converters.onnx_import import from_onnx

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _i(name, *v):
    return numpy_helper.from_array(np.array(v, np.int64), name)


def _dynamic_model(batch="N", seq="T"):
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["s"]),
        n("Gather", ["s", "zero"], ["nb"], axis=0), n("Gather", ["s", "one"], ["nt"], axis=0),
        n("Unsqueeze", ["nb", "ax0"], ["nb1"]), n("Unsqueeze", ["nt", "ax0"], ["nt1"]),
        # reshape [N, T, 8] -> [N, T, 2, 4] with a run-time shape, then transpose
        n("Concat", ["nb1", "nt1", "two_four"], ["shape4"], axis=0),
        n("Reshape", ["x", "shape4"], ["r"]), n("Transpose", ["r"], ["rt"], perm=[0, 2, 1, 3]),
        # pad the time axis to 2T (pads end = T, computed)
        n("Concat", ["zeros6", "nt1", "zero1"], ["pads"], axis=0),
        n("Pad", ["rt", "pads", "padv"], ["padded"]),
        # positions 0..T-1 expanded to [N, T]
        n("Range", ["zero_s", "nt", "one_s"], ["pos"]), n("Cast", ["pos"], ["posf"], to=F),
        n("Concat", ["nb1", "nt1"], ["nt_shape"], axis=0), n("Expand", ["posf", "nt_shape"], ["pos2"]),
        # ones of shape [N, 3]
        n("Concat", ["nb1", "three"], ["ones_shape"], axis=0),
        n("ConstantOfShape", ["ones_shape"], ["ones"], value=numpy_helper.from_array(np.array([1.0], np.float32))),
        # drop the last time step: x[:, :T-1]
        n("Sub", ["nt1", "one1"], ["end"]), n("Slice", ["x", "zero1", "end", "one1"], ["head"]),
        # image branch: resize to twice the run-time spatial size
        n("Shape", ["img"], ["si"]), n("Slice", ["si", "zero1", "two1"], ["nc"]),
        n("Slice", ["si", "two1", "four1"], ["hw"]), n("Mul", ["hw", "two1"], ["hw2"]),
        n("Concat", ["nc", "hw2"], ["sizes"], axis=0),
        n("Resize", ["img", "", "", "sizes"], ["big"], mode="linear"),
        # a mean over the run-time time axis, batch kept
        n("ReduceMean", ["x"], ["mean"], axes=[1], keepdims=0),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "one"),
             _i("ax0", 0), _i("two_four", 2, 4), _i("zeros6", 0, 0, 0, 0, 0, 0),
             _i("zero1", 0), _i("one1", 1), _i("two1", 2), _i("four1", 4), _i("three", 3),
             numpy_helper.from_array(np.array(0, np.int64), "zero_s"), numpy_helper.from_array(np.array(1, np.int64), "one_s"),
             numpy_helper.from_array(np.array(-1.0, np.float32), "padv")]
    inputs = [helper.make_tensor_value_info("x", F, [batch, seq, 8]),
              helper.make_tensor_value_info("img", F, [batch, 3, "H", "W"])]
    outs = ["padded", "pos2", "ones", "head", "big", "mean"]
    g = helper.make_graph(nodes, "dyn", inputs, [helper.make_tensor_value_info(o, F, None) for o in outs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _feeds(b, t, h, w, seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((b, t, 8)).astype(np.float32),
            "img": rng.standard_normal((b, 3, h, w)).astype(np.float32)}


def test_one_import_runs_at_batch_1_and_32_with_run_time_shapes():
    model = _dynamic_model()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    g, ins, outs = from_onnx(model)
    g.verify()
    assert ins["x"].shape == (None, None, 8)
    sess = ism.Session(g)
    for k, (b, t, h, w) in enumerate([(1, 5, 4, 6), (32, 7, 3, 5)]):
        feeds = _feeds(b, t, h, w, k)
        want = ref.run(None, feeds)
        got = sess.run(outs, {ins[n]: v for n, v in feeds.items()})
        for name, a, e in zip(("padded", "pos2", "ones", "head", "big", "mean"), got, want):
            assert a.shape == e.shape, (name, b, a.shape, e.shape)
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5, err_msg=f"{name} at batch {b}")


def test_static_dims_fold_the_shape_arithmetic_to_constants():
    """With every dim known, Shape/Gather/Concat/Sub fold at import: Reshape, Pad, Expand and Slice
    get static sizes and no run-time shape op is left in the graph."""
    model = _dynamic_model(batch=2, seq=5)
    for vi in model.graph.input:
        if vi.name == "img":
            vi.type.tensor_type.shape.dim[2].dim_value = 4
            vi.type.tensor_type.shape.dim[3].dim_value = 6
    g, ins, outs = from_onnx(model)
    ops = {n.op for n in g.nodes}
    assert not ops & {"ReshapeTo", "PadDynamic", "SliceDynamic", "Fill", "Shape"}, ops
    assert [tuple(o.shape) for o in outs] == [(2, 2, 10, 4), (2, 5), (2, 3), (2, 4, 8), (2, 3, 8, 12), (2, 8)]
    feeds = _feeds(2, 5, 4, 6, 3)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ism.Session(g).run(outs, {ins[n]: v for n, v in feeds.items()})
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_with_run_time_pads_in_every_mode(mode):
    """PadDynamic against numpy.pad (negative pads crop) for pads fed at run time."""
    x = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    n = helper.make_node("Pad", ["x", "p", "v"], ["y"], mode=mode)
    g = helper.make_graph([n], "p", [helper.make_tensor_value_info("x", F, ["A", 3, 5]),
                                     helper.make_tensor_value_info("p", I64, [6])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(np.array(7.0, np.float32), "v")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    gi, ins, outs = from_onnx(m)
    assert outs[0].node.op == "PadDynamic"
    sess = ism.Session(gi)
    for pads in ([0, 1, 2, 1, 0, 2], [1, -1, 0, 0, 1, -2]):
        got = sess.run(outs[0], {ins["x"]: x, ins["p"]: np.array(pads, np.int64)})
        grow = [(max(a, 0), max(b, 0)) for a, b in zip(pads[:3], pads[3:])]
        want = np.pad(x, grow, mode=mode, **({"constant_values": 7.0} if mode == "constant" else {}))
        crop = tuple(slice(-a if a < 0 else None, b if b < 0 else None) for a, b in zip(pads[:3], pads[3:]))
        np.testing.assert_array_equal(got, want[crop])


def test_run_time_pads_for_given_axes_and_an_if_on_a_condition_known_at_import():
    """Pad (opset 18) with pads fed at run time for axes [-1, 1]; an If whose condition folds at import
    builds only the taken branch (the other would not even build: it splits into too many pieces)."""
    n = helper.make_node
    then_g = helper.make_graph([n("Neg", ["y"], ["t"])], "then", [], [helper.make_tensor_value_info("t", F, None)])
    else_g = helper.make_graph([n("Split", ["y"], ["e0", "e1", "e2", "e3", "e4"], axis=0, num_outputs=5),
                                n("Identity", ["e0"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, None)])
    nodes = [n("Pad", ["x", "p", "v", "axes"], ["y"]),
             n("Shape", ["x"], ["s"]), n("Equal", ["s", "s"], ["eq"]), n("Cast", ["eq"], ["eq_i"], to=I64),
             n("ReduceMin", ["eq_i"], ["mn"], keepdims=0), n("Cast", ["mn"], ["cond"], to=TensorProto.BOOL),
             n("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "p", [helper.make_tensor_value_info("x", F, [2, 3, 4]),
                                       helper.make_tensor_value_info("p", I64, [4])],
                          [helper.make_tensor_value_info("z", F, None)],
                          [numpy_helper.from_array(np.array(0.5, np.float32), "v"),
                           numpy_helper.from_array(np.array([-1, 1], np.int64), "axes")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    gi, ins, outs = from_onnx(m)
    assert "If" not in {nd.op for nd in gi.nodes}
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    sess = ism.Session(gi)
    for pads in ([1, 0, 2, 3], [0, 2, -1, 1]):
        feeds = {"x": x, "p": np.array(pads, np.int64)}
        np.testing.assert_array_equal(sess.run(outs[0], {ins[k]: v for k, v in feeds.items()}), ref.run(None, feeds)[0])


def test_loop_scan_outputs_stack_each_iterations_value():
    """Loop with a carried sum and two scan outputs (a [2, K] value per iteration, its row sums),
    a trip count fed at run time: matches onnxruntime for 1 and 4 iterations."""
    n = helper.make_node
    body = helper.make_graph(
        [n("Identity", ["cond_in"], ["cond_out"]),
         n("Cast", ["i"], ["fi"], to=F), n("Mul", ["x", "fi"], ["v"]), n("Add", ["acc", "v"], ["acc_out"]),
         n("ReduceSum", ["v", "one"], ["rows"], keepdims=0), n("Identity", ["v"], ["scan_v"])],
        "body", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", F, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", F, None),
         helper.make_tensor_value_info("scan_v", F, None), helper.make_tensor_value_info("rows", F, None)],
        [numpy_helper.from_array(np.array([1], np.int64), "one")])
    g = helper.make_graph([n("Loop", ["trip", "", "acc0"], ["acc_final", "vs", "row_sums"], body=body)], "loop",
                          [helper.make_tensor_value_info("trip", I64, []), helper.make_tensor_value_info("x", F, [2, "K"]),
                           helper.make_tensor_value_info("acc0", F, [2, "K"])],
                          [helper.make_tensor_value_info(o, F, None) for o in ("acc_final", "vs", "row_sums")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    gi, ins, outs = from_onnx(m)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = ism.Session(gi)
    rng = np.random.default_rng(5)
    for trip, k in ((1, 3), (4, 5)):
        feeds = {"trip": np.array(trip, np.int64), "x": rng.standard_normal((2, k)).astype(np.float32),
                 "acc0": rng.standard_normal((2, k)).astype(np.float32)}
        got = sess.run(outs, {ins[name]: v for name, v in feeds.items()})
        for a, e in zip(got, ref.run(None, feeds)):
            assert a.shape == e.shape
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


def test_scan_reads_slices_in_both_directions_and_stacks_outputs_on_any_axis():
    """Scan (opset 16): a running sum over axis 1 of x read forwards and over y read backwards; the
    per-step values stacked on axis 1 and in reverse on axis 0; against onnxruntime, two lengths."""
    n = helper.make_node
    body = helper.make_graph(
        [n("Add", ["s_in", "xi"], ["s_out"]), n("Mul", ["xi", "yi"], ["p"]), n("Identity", ["s_out"], ["step"])],
        "body", [helper.make_tensor_value_info("s_in", F, [2]), helper.make_tensor_value_info("xi", F, [2]),
                 helper.make_tensor_value_info("yi", F, [2])],
        [helper.make_tensor_value_info("s_out", F, [2]), helper.make_tensor_value_info("step", F, [2]),
         helper.make_tensor_value_info("p", F, [2])])
    node = n("Scan", ["s0", "x", "y"], ["s", "steps", "prods"], body=body, num_scan_inputs=2,
             scan_input_axes=[1, 0], scan_input_directions=[0, 1], scan_output_axes=[1, 0],
             scan_output_directions=[0, 1])
    g = helper.make_graph([node], "scan", [helper.make_tensor_value_info("s0", F, [2]),
                                           helper.make_tensor_value_info("x", F, [2, "T"]),
                                           helper.make_tensor_value_info("y", F, ["T", 2])],
                          [helper.make_tensor_value_info(o, F, None) for o in ("s", "steps", "prods")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)])
    m.ir_version = 8
    gi, ins, outs = from_onnx(m)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = ism.Session(gi)
    rng = np.random.default_rng(9)
    for t in (1, 6):
        feeds = {"s0": rng.standard_normal(2).astype(np.float32), "x": rng.standard_normal((2, t)).astype(np.float32),
                 "y": rng.standard_normal((t, 2)).astype(np.float32)}
        got = sess.run(outs, {ins[name]: v for name, v in feeds.items()})
        for a, e in zip(got, ref.run(None, feeds)):
            assert a.shape == e.shape
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [-2, 1])
def test_dft_with_a_run_time_axis_counts_it_over_every_axis(axis):
    """DFT-20's axis input (here fed at run time, negative or not) counts the real/imaginary axis too."""
    n = helper.make_node("DFT", ["x", "", "a"], ["y"], onesided=1)
    g = helper.make_graph([n], "dft", [helper.make_tensor_value_info("x", F, [2, 8, 6, 1]),
                                       helper.make_tensor_value_info("a", I64, [])],
                          [helper.make_tensor_value_info("y", F, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    gi, ins, outs = from_onnx(m)
    x = np.random.default_rng(2).standard_normal((2, 8, 6, 1)).astype(np.float32)
    got = ism.Session(gi).run(outs[0], {ins["x"]: x, ins["a"]: np.array(axis, np.int64)})
    z = np.fft.rfft(x[..., 0], axis=axis % 4)
    np.testing.assert_allclose(got, np.stack([z.real, z.imag], -1), rtol=1e-5, atol=1e-5)


def test_tile_by_run_time_repeats_and_pad_of_run_time_axes_match_onnxruntime():
    """Tile whose repeats are computed from the input's Shape, and a Pad whose axes are a graph input
    (opset 18), on inputs of unknown dims: onnxruntime's numbers at two sizes; Tile's gradient is a
    sum over the copies."""
    n = helper.make_node
    nodes = [n("Shape", ["x"], ["s"]), n("Slice", ["s", "zero1", "one1"], ["nb"]),
             n("Concat", ["one1", "nb"], ["reps"], axis=0),  # repeat axis 1 by the batch size
             n("Tile", ["x", "reps"], ["t"]),
             n("Pad", ["x", "pads", "padv", "axes"], ["p"], mode="constant")]
    inits = [_i("zero1", 0), _i("one1", 1), numpy_helper.from_array(np.array(-1.5, np.float32), "padv")]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", F, ["N", "T"]),
                                       helper.make_tensor_value_info("pads", I64, [2]),
                                       helper.make_tensor_value_info("axes", I64, [1])],
                          [helper.make_tensor_value_info(k, F, None) for k in ("t", "p")], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    gi, ins, outs = from_onnx(m)
    sess = ism.Session(gi)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    for shape, axes in (((1, 3), [-1]), ((3, 5), [0])):
        feeds = {"x": rng.standard_normal(shape).astype(np.float32), "pads": np.array([1, 2], np.int64),
                 "axes": np.array(axes, np.int64)}
        want = ref.run(None, feeds)
        got = sess.run(outs, {ins[k]: v for k, v in feeds.items()})
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    with gi.as_default():
        (dx,) = ism.gradients(ism.reduce_sum(outs[0]), [ins["x"]])
    x = rng.standard_normal((3, 2)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(dx, {ins["x"]: x}), np.full((3, 2), 3.0, np.float32))
