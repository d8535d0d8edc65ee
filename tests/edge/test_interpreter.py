"""The edge interpreter against the core executor on the same graphs and inputs; the arena."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.converters.edge_export import to_edge
from isthmus.edge import EdgeModelError, Interpreter
from isthmus.edge.arena import ArenaPlanner

rng = np.random.default_rng(0)


def _compare(build, x_shape, rtol=1e-4, atol=1e-5):
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None,) + x_shape[1:], name="x")
        y = build(x)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    xv = rng.standard_normal(x_shape).astype(np.float32)
    want = sess.run(y, {x: xv})
    interp = Interpreter(to_edge(sess, [y], batch=x_shape[0]))
    got = interp.invoke(xv)[0]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    again = interp.invoke(xv)[0]  # the arena is reused across calls
    np.testing.assert_array_equal(got, again)
    return interp


def test_mlp():
    _compare(lambda x: ism.softmax(ism.nn.Sequential([ism.nn.Dense(16, activation="relu"),
                                                      ism.nn.Dense(16, activation="tanh"), ism.nn.Dense(5)])(x)), (3, 8))


@pytest.mark.parametrize("batch", [1, 2])
def test_cnn_with_batch_norm_and_pools(batch):
    def build(x):
        h = ism.nn.Conv2D(8, 3, activation="relu")(x)
        h = ism.max_pool(h, 2, 2)
        h = ism.nn.BatchNorm()(h)
        h = ism.nn.Conv2D(8, 3, strides=2, padding="VALID", activation="relu6")(h)
        h = ism.avg_pool(h, 3, 1, "SAME")
        return ism.nn.Dense(4)(ism.flatten(h))
    interp = _compare(build, (batch, 3, 16, 16))
    assert interp.arena_lower_bound <= interp.arena_bytes < interp.tensor_bytes + interp.scratch_bytes


def test_mobilenet_block_depthwise_residual_global_pool():
    def build(x):
        h = ism.nn.Conv2D(16, 1, activation="relu6")(x)
        h = ism.nn.DepthwiseConv2D(3, activation="relu6")(h)
        h = ism.nn.Conv2D(8, 1)(h)
        h = ism.nn.BatchNorm()(h)
        h = h + x
        return ism.nn.Dense(3)(ism.global_avg_pool(h))
    _compare(build, (1, 8, 12, 12))


def test_unsupported_ops_are_named():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (1, 4), name="x")
        y = ism.abs(x)  # (Erf, the op this test named first, has an edge kernel now)
    with pytest.raises(ism.GraphError, match="no kernel for: Abs x1"):
        to_edge(g, [y])


def test_wrong_input_shape_is_refused():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (1, 4), name="x")
        y = ism.relu(x)
    interp = Interpreter(to_edge(g, [y]))
    with pytest.raises(ValueError, match="prepared for"):
        interp.invoke(np.zeros((2, 4), np.float32))


def test_arena_planner_never_overlaps_live_buffers():
    p = ArenaPlanner()
    for i in range(6):
        p.add(1000 * (i % 3 + 1), i, i + 1)
    offsets, peak = p.plan()
    assert p.lower_bound() <= peak < sum(s for s, _, _ in p.buffers)
    for i in range(6):  # buffers alive together never overlap
        for j in range(i + 1, 6):
            (si, fi, li), (sj, fj, lj) = p.buffers[i], p.buffers[j]
            if not (li < fj or lj < fi):
                assert offsets[i] + si <= offsets[j] or offsets[j] + sj <= offsets[i]


def test_import_isthmus_edge_stays_light():
    import subprocess
    import sys
    code = ("import sys, isthmus.edge, isthmus.edge.interpreter; "
            "bad = [m for m in sys.modules if m.startswith(('isthmus.core', 'onnx', 'grpc', 'isthmus.partitioner', 'flatbuffers'))]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_onnxruntime_delegate_agrees_with_the_numpy_path():
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 3, 12, 12), name="x")
        h = ism.nn.Conv2D(8, 3, activation="relu")(x)
        h = ism.nn.DepthwiseConv2D(3, activation="relu6")(h)
        y = ism.nn.Dense(4)(ism.global_avg_pool(h))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    data = to_edge(sess, [y], delegate=True)
    xv = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
    ref = Interpreter(data).invoke(xv)[0]
    dele = Interpreter(data, delegate="onnxruntime")
    assert dele.delegate is not None
    np.testing.assert_allclose(dele.invoke(xv)[0], ref, rtol=1e-4, atol=1e-5)
    one = Interpreter(data, delegate="onnxruntime", delegate_threads=1)  # one intra-op thread, as on a phone
    np.testing.assert_allclose(one.invoke(xv)[0], ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="delegate_threads"):
        Interpreter(data, delegate="onnxruntime", delegate_threads=0)
    with pytest.raises(EdgeModelError, match="embeds no onnxruntime delegate"):
        Interpreter(to_edge(sess, [y]), delegate="onnxruntime")
    assert Interpreter(to_edge(sess, [y]), delegate="auto").delegate is None
