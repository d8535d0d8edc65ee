"""graph_to_tflite: fp32 graphs with ops isthmus's edge interpreter lacks (TRANSPOSE, GATHER,
STRIDED_SLICE, RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR, MEAN) run in LiteRT and equal the
core Session to 1e-5 relative; ops without a TFLite form are refused by node and op."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.converters.tflite_write import TFLiteExportError, read_metadata
from isthmus.converters.tflite_write_graph import graph_to_tflite
from isthmus.core.ops.image import resize
from isthmus.core.ops.sparse import gather

litert = pytest.importorskip("ai_edge_litert.interpreter")


def _graph():
    rng = np.random.default_rng(0)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 3, 8, 8), name="x")
        h = ism.relu(ism.conv2d(x, ism.constant(rng.standard_normal((4, 3, 3, 3)).astype(np.float32)), padding="SAME"))
        out = {
            "bilinear": resize(h, sizes=(1, 4, 16, 16), mode="linear", coordinate_mode="half_pixel"),
            "bilinear_align": resize(h, sizes=(1, 4, 15, 15), mode="linear", coordinate_mode="align_corners"),
            "nearest": resize(h, scales=(1, 1, 2, 2), mode="nearest"),
            "transpose": ism.transpose(h, (0, 2, 3, 1)),
            "slice": ism.transpose(h, (0, 2, 3, 1))[:, 1:7:2, ::-1, 1],
            "mean": ism.reduce_mean(h, axis=(2, 3), keepdims=True),
            "mean_c": ism.reduce_mean(h, axis=1),
            "gather": gather(ism.reshape(h, (1, 4, 64)), ism.constant(np.array([3, 1, 60], np.int64)), axis=2),
        }
        sess = ism.Session(g)
    return sess, x, out


@pytest.mark.parametrize("name", ["bilinear", "bilinear_align", "nearest", "transpose", "slice", "mean", "mean_c",
                                  "gather"])
def test_op_matches_the_session(name):
    sess, x, out = _graph()
    y = out[name]
    data = graph_to_tflite(sess, [y])
    assert read_metadata(data)["inputs"][0]["layout"] == "NHWC"
    it = litert.Interpreter(model_content=data, num_threads=1)
    it.allocate_tensors()
    for seed in (1, 2):
        xv = np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)
        it.set_tensor(it.get_input_details()[0]["index"], np.ascontiguousarray(xv.transpose(0, 2, 3, 1)))
        it.invoke()
        got = it.get_tensor(it.get_output_details()[0]["index"])
        want = sess.run(y, {x: xv})
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_a_transpose_of_an_nhwc_tensor_is_one_op():
    """NCHW->NHWC of a tensor already NHWC inside the file costs a RESHAPE, not two TRANSPOSEs."""
    from isthmus.converters.tflite_schema import fb
    sess, x, out = _graph()
    m = fb.Model.GetRootAs(graph_to_tflite(sess, [out["transpose"]]), 0)
    sub = m.Subgraphs(0)
    codes = [m.OperatorCodes(sub.Operators(i).OpcodeIndex()).BuiltinCode() for i in range(sub.OperatorsLength())]
    assert fb.BuiltinOperator.TRANSPOSE not in codes and fb.BuiltinOperator.RESHAPE in codes


def test_ops_without_a_tflite_form_are_refused_by_node():
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 8), name="x")
        y = ism.tile(x, (2, 1), name="running")   # Tile: no TFLite form here
    with pytest.raises(TFLiteExportError, match=r"'running' \(Tile\)"):
        graph_to_tflite(g, [y])


def _lstm(read="y", reverse=False):
    from isthmus.core.ops.recurrent import lstm_sequence
    rng = np.random.default_rng(0)
    t, b, i, h = 5, 2, 3, 4
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (t, b, i), name="x")
        y, h_t, c_t = lstm_sequence(x, ism.constant((rng.standard_normal((4 * h, i)) * 0.5).astype(np.float32)),
                                    ism.constant((rng.standard_normal((4 * h, h)) * 0.5).astype(np.float32)),
                                    ism.constant((rng.standard_normal(4 * h) * 0.5).astype(np.float32)),
                                    reverse=reverse, name="lstm")
        out = ism.relu({"y": y, "h": h_t, "c": c_t}[read])
        sess = ism.Session(g)
    return sess, x, out


@pytest.mark.parametrize("read,reverse", [("y", False), ("h", False), ("y", True), ("h", True)])
def test_lstm_sequence_as_unidirectional_sequence_lstm(read, reverse):
    """Gates reordered (ONNX i, o, f, c -> TFLite i, f, c, o); h_T is y's last step (a GATHER); a
    reverse direction runs between two REVERSE_V2. LiteRT keeps h and c across invokes, so each
    invoke after the first starts from reset_all_variables()."""
    sess, x, y = _lstm(read, reverse)
    data = graph_to_tflite(sess, [y])
    it = litert.Interpreter(model_content=data, num_threads=1)
    it.allocate_tensors()
    rng = np.random.default_rng(3)
    for _ in range(2):
        xv = rng.standard_normal((5, 2, 3)).astype(np.float32)
        it.reset_all_variables()
        it.set_tensor(it.get_input_details()[0]["index"], xv)
        it.invoke()
        want = sess.run(y, {x: xv})
        got = it.get_tensor(it.get_output_details()[0]["index"])
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-5 * max(1, np.abs(want).max())


def test_lstm_reading_the_cell_state_is_unrolled():
    """c_T lives inside TFLite's sequence LSTM: a graph that reads it gets the unrolled steps."""
    sess, x, y = _lstm(read="c")
    data = graph_to_tflite(sess, [y])
    it = litert.Interpreter(model_content=data, num_threads=1)
    it.allocate_tensors()
    xv = np.random.default_rng(3).standard_normal((5, 2, 3)).astype(np.float32)
    it.set_tensor(it.get_input_details()[0]["index"], xv)
    it.invoke()
    want = sess.run(y, {x: xv})
    got = it.get_tensor(it.get_output_details()[0]["index"])
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-5 * max(1, np.abs(want).max())
