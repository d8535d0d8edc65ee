"""Graph <-> GraphDef round trips bit for bit, control-flow bodies included."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.cloud import graph_codec as gc
from isthmus.core.function import Function
from isthmus.core.ops.control import SavedTensors
from isthmus.core.variables import Variable
from isthmus.proto import graph_pb2


# ---- structural comparison --------------------------------------------------------------
def _gid(graphs, g):
    for k, x in enumerate(graphs):
        if x is g:
            return k
    graphs.append(g)
    return len(graphs) - 1


def _same_attr(a, b, ga, gb, where):
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), where
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), where
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            _same_attr(x, y, ga, gb, f"{where}[{k}]")
    elif isinstance(a, Function):
        assert a.name == b.name and _gid(ga, a.graph) == _gid(gb, b.graph), where
        for ta, tb in zip(a.inputs + a.outputs, b.inputs + b.outputs):
            assert ta.name == tb.name and _gid(ga, ta.graph) == _gid(gb, tb.graph), where
        assert len(a.inputs) == len(b.inputs) and len(a.outputs) == len(b.outputs), where
    elif isinstance(a, SavedTensors):
        assert [t.name for t in a.tensors] == [t.name for t in b.tensors], where
        assert all(x.graph is not None for x in b.tensors)
    elif isinstance(a, float):
        assert np.float64(a).tobytes() == np.float64(b).tobytes(), where
    else:
        assert a == b, where


def assert_same_graph(a, b, ga=None, gb=None):
    ga = ga if ga is not None else [a]
    gb = gb if gb is not None else [b]
    assert str(a) == str(b)
    assert len(a.nodes) == len(b.nodes)
    done = set()
    for na, nb in zip(a.nodes, b.nodes):
        where = f"node {na.name}"
        assert (na.name, na.op, na.device, na.index) == (nb.name, nb.op, nb.device, nb.index), where
        assert [c.name for c in na.control_inputs] == [c.name for c in nb.control_inputs], where
        assert [(t.name, _gid(ga, t.graph)) for t in na.inputs] == [(t.name, _gid(gb, t.graph)) for t in nb.inputs]
        assert [(t.dtype, t.shape, type(t)) for t in na.outputs] == [(t.dtype, t.shape, type(t)) for t in nb.outputs]
        assert list(na.attrs) == list(nb.attrs), where
        for k in na.attrs:
            _same_attr(na.attrs[k], nb.attrs[k], ga, gb, f"{where}.{k}")
        if isinstance(na.outputs[0] if na.outputs else None, Variable):
            va, vb = na.outputs[0], nb.outputs[0]
            assert va.initializer.name == vb.initializer.name and va.initial_value.name == vb.initial_value.name
            assert va.trainable == vb.trainable
    assert a.seed == b.seed and a._name_counts == b._name_counts
    assert {(x.name, _gid(ga, x.graph)): y.name for x, y in a.captures.items()} == \
           {(x.name, _gid(gb, x.graph)): y.name for x, y in b.captures.items()}
    assert {k: [getattr(x, "name", x) for x in v] for k, v in a.collections.items()} == \
           {k: [getattr(x, "name", x) for x in v] for k, v in b.collections.items()}
    # the body graphs, each once
    k = 1
    while k < len(ga):
        if k not in done:
            done.add(k)
            assert k < len(gb)
            assert (ga[k].outer is None) == (gb[k].outer is None)
            if ga[k].outer is not None:
                assert _gid(ga, ga[k].outer) == _gid(gb, gb[k].outer)
            sub_a, sub_b = ga[k], gb[k]
            assert_same_graph_nodes(sub_a, sub_b, ga, gb)
        k += 1


def assert_same_graph_nodes(a, b, ga, gb):
    assert str(a) == str(b)
    for na, nb in zip(a.nodes, b.nodes):
        assert [(t.name, _gid(ga, t.graph)) for t in na.inputs] == [(t.name, _gid(gb, t.graph)) for t in nb.inputs]
        for k in na.attrs:
            _same_attr(na.attrs[k], nb.attrs[k], ga, gb, f"{na.name}.{k}")


def round_trip(g):
    data = gc.to_bytes(g)
    g2 = gc.decode(data)
    assert_same_graph(g, g2)
    assert gc.to_bytes(g2) == data  # encoding the decoded graph gives the same bytes
    return g2


def run_both(g, g2, fetches, feeds=None, init=True):
    out = []
    for gg in (g, g2):
        s = ism.Session(gg)
        if init and ism.global_variables(gg):
            s.run(ism.global_variables_initializer(gg))
        fd = {gg.tensor(k): v for k, v in (feeds or {}).items()}
        out.append(s.run([gg.tensor(f) if ":" in f else gg.node(f) for f in fetches], fd))
    for x, y in zip(*out):
        if x is None:
            assert y is None
        else:
            assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
    return out[0]


# ---- graphs ---------------------------------------------------------------------------
def test_mlp_training_with_devices_scopes_and_control_inputs():
    g = ism.Graph(seed=7)
    with g.as_default():
        x = ism.placeholder(ism.float32, (None, 4), name="x")
        y = ism.placeholder(ism.int32, (None,), name="y")
        with ism.device("/job:ps/task:0"):
            h = ism.nn.Dense(8, activation="relu")(x)
        with ism.device("/job:worker/task:1/device:CPU:0"), ism.name_scope("head"):
            logits = ism.nn.Dense(3)(h)
        loss = ism.nn.sparse_softmax_cross_entropy(y, logits)
        with ism.control_dependencies([loss]):
            marker = ism.identity(loss, name="after_loss")
        step = ism.optimizers.Momentum(0.1, 0.9).minimize(loss, global_step=ism.optimizers.get_or_create_global_step(g))
    g2 = round_trip(g)
    assert g2.node("after_loss").control_inputs[0].name == loss.node.name
    assert isinstance(g2.node("global_step").outputs[0], Variable)
    assert g2.get_collection("global_step")[0] is g2.node("global_step").outputs[0]
    rng = np.random.default_rng(0)
    feeds = {"x:0": rng.standard_normal((5, 4)).astype(np.float32), "y:0": rng.integers(0, 3, 5).astype(np.int32)}
    for gg in (g, g2):
        s = ism.Session(gg)
        s.run(ism.global_variables_initializer(gg))
        for _ in range(3):
            s.run(gg.node(step.name), {gg.tensor(k): v for k, v in feeds.items()})
        gg.final = s.run([gg.tensor(marker.name)] + [v for v in ism.trainable_variables(gg)],
                         {gg.tensor(k): v for k, v in feeds.items()})
    for a, b in zip(g.final, g2.final):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_cond_and_gradients_through_it():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (3,), name="x")
        p = ism.placeholder(ism.bool_, (), name="p")
        w = ism.Variable(np.array([1.0, 2.0, 3.0], np.float32), name="w")
        z = ism.cond(p, lambda: ism.reduce_sum(x * w * w), lambda: ism.reduce_sum(ism.exp(x) + w))
        nested = ism.cond(p, lambda: ism.cond(z > 1.0, lambda: z * 2.0, lambda: z), lambda: -z)
        dw, dx = ism.gradients(nested, [w, x])
    g2 = round_trip(g)
    for pv in (True, False):
        run_both(g, g2, [nested.name, dw.name, dx.name],
                 {"x:0": np.array([0.5, -1.0, 2.0], np.float32), "p:0": np.array(pv)})


def test_while_loop_and_gradients_through_it():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (2,), name="x")
        w = ism.Variable(np.array([0.9, 1.1], np.float32), name="w")
        n = ism.placeholder(ism.int32, (), name="n")

        def body(i, a):
            b = ism.cond(i < 2, lambda: a * w, lambda: ism.tanh(a) + w)
            return i + 1, b
        _, out = ism.while_loop(lambda i, a: i < n, body, (ism.constant(0), x))
        capped = ism.while_loop(lambda v: ism.reduce_sum(v) < 100.0, lambda v: v * 2.0, [x],
                                maximum_iterations=5)[0]
        loss = ism.reduce_sum(out * out) + ism.reduce_sum(capped)
        dw, dx = ism.gradients(loss, [w, x])
    whiles = [nd for nd in g.nodes if nd.op == "While"]
    assert any(nd.attrs["saved"].tensors for nd in whiles)
    g2 = round_trip(g)
    for nv in (0, 1, 4):
        run_both(g, g2, [loss.name, dw.name, dx.name],
                 {"x:0": np.array([0.3, -0.7], np.float32), "n:0": np.array(nv, np.int32)})


def test_dynamic_rnn_lstm_gradients():
    g = ism.Graph(seed=3)
    with g.as_default():
        x = ism.placeholder(ism.float32, (None, None, 3), name="x")
        lengths = ism.placeholder(ism.int32, (None,), name="len")
        cell = ism.rnn.LSTMCell(4)
        outs, state = ism.rnn.dynamic_rnn(cell, x, sequence_length=lengths)
        loss = ism.reduce_sum(outs) + ism.reduce_sum(state[0])
        grads = ism.gradients(loss, ism.trainable_variables(g))
    g2 = round_trip(g)
    rng = np.random.default_rng(2)
    run_both(g, g2, [loss.name] + [t.name for t in grads],
             {"x:0": rng.standard_normal((2, 5, 3)).astype(np.float32), "len:0": np.array([5, 3], np.int32)})


def test_partitioned_parts_round_trip():
    from isthmus.partitioner.partition import partition
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (2, 2), name="x")
        a = ism.matmul(x, x, name="a")
        b = ism.add(a, 1.0, name="b")
    p = partition(g, {"x": "/job:worker/task:0/device:CPU:0", "a": "/job:worker/task:0/device:CPU:0",
                      "b": "/job:worker/task:1/device:CPU:0"}, outputs=["b:0"])
    for part in p.parts.values():
        round_trip(part.graph)


def test_every_attribute_kind():
    g = ism.Graph()
    with g.as_default():
        c = ism.constant(np.arange(6, dtype=np.int16).reshape(2, 3), name="c")
    node = c.node
    node.attrs["extra"] = (None, True, False, 0, -1, 1 << 62, -(1 << 63), 1.5, float("nan"), -0.0, float("inf"),
                           "s", "ünï", b"\x00\xff", [1, (2, [3, None])], (), [],
                           np.float32(2.5), np.int64(-3), np.bool_(True), np.dtype("float16"), ism.bool_,
                           np.zeros((0, 2), np.float64), np.array(3, np.uint8), np.array([True, False]))
    g2 = round_trip(g)
    got = g2.node("c").attrs["extra"]
    assert isinstance(got[14], list) and isinstance(got[14][1], tuple) and isinstance(got[14][1][1], list)
    assert got[5] == 1 << 62 and got[6] == -(1 << 63) and np.isnan(got[8])
    assert g2.node("c").attrs["value"].flags.writeable  # graph constants are not read-only views


def test_unserialisable_attrs_are_named():
    g = ism.Graph()
    with g.as_default():
        c = ism.constant(1.0, name="c")
    c.node.attrs["bad"] = object()
    with pytest.raises(gc.GraphCodecError, match=r"node 'c' \(Const\) attribute 'bad'.*object"):
        gc.encode(g)
    c.node.attrs["bad"] = 1 << 64
    with pytest.raises(gc.GraphCodecError, match="int64"):
        gc.encode(g)
    c.node.attrs["bad"] = np.array(["x"])
    with pytest.raises(gc.GraphCodecError, match="cannot be carried"):
        gc.encode(g)


# ---- hostile GraphDefs ------------------------------------------------------------------
def _simple_def():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (2,), name="x")
        ism.cond(ism.reduce_sum(x) > 0, lambda: x * 2.0, lambda: x, name="c")
    return gc.encode(g)


@pytest.mark.parametrize("mutate,match", [
    (lambda d: setattr(d.root.node[0], "op", "NoSuchOp"), "unknown op"),
    (lambda d: d.root.node.add(name="x", op="Placeholder"), "taken twice"),
    (lambda d: setattr(d.root.node[-1].inputs[0], "node", "ghost"), "no node 'ghost'"),
    (lambda d: setattr(d.root.node[-1].inputs[0], "index", 5), "no output 5"),
    (lambda d: setattr(d.root.node[-1].inputs[0], "graph", 9), "graph id 9"),
    (lambda d: setattr(d.library[0], "outer", 1), "loops"),
    (lambda d: d.root.node[1].outputs[0].shape.dim.append(3), "does not verify"),
    (lambda d: setattr(d.root.node[0].outputs[0], "dtype", 77), "unknown dtype"),
    (lambda d: d.root.node[0].outputs[0].shape.dim.__setitem__(0, -5), "negative"),
    (lambda d: d.root.node[0].control_inputs.append("nowhere"), "no control input"),
    (lambda d: setattr(d, "version", 99), "format version 99"),
    (lambda d: d.root.node.reverse(), "does not verify"),
])
def test_hostile_graphdefs_rejected(mutate, match):
    d = _simple_def()
    mutate(d)
    with pytest.raises(gc.GraphCodecError, match=match):
        gc.decode(d.SerializeToString())


def test_garbage_bytes_rejected():
    with pytest.raises(gc.GraphCodecError, match="not a GraphDef"):
        gc.decode(b"\xff\xff\xff\xff garbage")


def test_oversized_constant_rejected():
    d = _simple_def()
    g = ism.Graph()
    with g.as_default():
        ism.constant(np.zeros(1000, np.float32), name="big")
    data = gc.to_bytes(g)
    with pytest.raises(gc.GraphCodecError, match="over the limit"):
        gc.decode(data, max_bytes=100)
    assert gc.decode(d) is not None


def test_unsigned_wide_int_constants_and_placeholders_round_trip():
    """uint16/32/64 tensors and constants (what ONNX imports can hold) cross the GraphDef intact."""
    g = ism.Graph()
    big = np.array([0, 1, np.iinfo(np.uint64).max], np.uint64)
    with g.as_default():
        ism.constant(np.array([np.iinfo(np.uint32).max, 7], np.uint32), name="c32")
        ism.placeholder(np.uint16, (2,), name="p16")
        p64 = ism.placeholder(np.uint64, (3,), name="p64")
        ism.identity(p64, name="y64")
    g2 = round_trip(g)
    assert g2.node("c32").attrs["value"].dtype == np.uint32
    assert [t.dtype for t in (g2.node("p16").outputs[0], g2.node("p64").outputs[0])] == [np.uint16, np.uint64]
    y, c = ism.Session(g2).run(["y64:0", "c32:0"], {"p64:0": big})
    assert y.dtype == np.uint64 and np.array_equal(y, big)
    assert c.tolist() == [np.iinfo(np.uint32).max, 7]
