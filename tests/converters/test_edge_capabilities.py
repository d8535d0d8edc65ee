"""One table of what the edge runs (edge/capabilities.py): the kernel registries agree with it, and
default planning never places on the edge a node that the edge export (and the interpreter's
prepare) then refuses, over the models the test suite and the benchmarks build."""
import numpy as np
import pytest

import isthmus as ism
from isthmus import nn
from isthmus.converters import from_onnx, to_onnx
from isthmus.converters.edge_export import to_edge
from isthmus.converters.split_export import _standalone
from isthmus.core.passes import freeze
from isthmus.edge import Interpreter, capabilities
from isthmus.edge.int8_kernels import INT8_KERNELS
from isthmus.edge.kernels import KERNELS
from isthmus.partitioner import CostModel, LinkModel, plan_split
from isthmus.partitioner.devices import EDGE, EDGE_DEVICE
from isthmus.partitioner.partition import partition

from benchmarks.models import mobilenet_v2
from tests.converters.test_whole_models import cnn, encoder, mlp, mobilenet, session_of


def test_table_matches_the_kernel_registries():
    assert set(capabilities.FP32) == set(KERNELS)
    assert capabilities.INT8 <= set(INT8_KERNELS)
    assert capabilities.SAME_QPARAMS <= capabilities.INT8


def test_refusals_name_the_reason():
    f32 = (np.float32, (1, 3, 8, 8))
    assert capabilities.refusal("Relu", {}, [f32], [f32]) is None
    assert "ArgMax" in capabilities.refusal("ArgMax", {"axis": 1}, [f32], [(np.int64, (1, 8, 8))])
    assert "int64" in capabilities.refusal("Identity", {}, [(np.int64, (3,))], [(np.int64, (3,))])
    assert "reflect" in capabilities.refusal("Pad", {"paddings": ((0, 0),) * 4, "mode": "reflect"}, [f32], [f32])
    assert "gelu" in capabilities.refusal("FusedMatMul", {"transpose_a": False, "transpose_b": False,
                                                          "activation": "gelu"}, [f32, f32, f32], [f32])
    conv = {"strides": (1, 1), "dilations": (1, 1), "pads": ((1, 1), (1, 1)), "groups": 1, "activation": "tanh"}
    w = (np.float32, (4, 3, 3, 3))
    assert capabilities.refusal("FusedConv2D", conv, [f32, w, (np.float32, (4,))], [f32]) is None
    assert "tanh" in capabilities.int8_refusal("FusedConv2D", conv, [f32, w, (np.float32, (4,))], [f32],
                                               [False, True, True])
    assert "constant" in capabilities.int8_refusal("Conv2D", conv, [f32, w], [f32], [False, False])


def test_scalar_slope_prelu_exports_and_runs():
    """PReLU as TFLite import writes it, with a scalar slope: the writer kept 0-d constants 0-d."""
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(np.float32, (1, 3, 4, 4), name="x")
        y = ism.add(ism.relu(x), ism.mul(ism.constant(np.float32(0.25)), ism.minimum(x, 0.0)))
    xv = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
    got = Interpreter(to_edge(g, [y])).invoke(xv)[0]
    np.testing.assert_allclose(got, np.where(xv > 0, xv, 0.25 * xv), rtol=1e-6)


def _lstm(x):
    from isthmus.core.rnn import LSTMCell, dynamic_rnn
    _, (c, h) = dynamic_rnn(LSTMCell(6, seed=1), x, return_outputs=False)
    return nn.Dense(3, name="head")(h)


def _odd_ops(x):
    """ArgMax, Abs, an int64 path: ops the edge has no kernel for, between ones it has (gelu among them)."""
    h = nn.Dense(16, activation="relu")(x)
    h = ism.abs(h) + nn.Dense(16, activation="gelu")(h)
    return ism.argmax(nn.Dense(4)(h), axis=1)


SESSION_MODELS = [("mlp", mlp, (2, 20)), ("cnn", cnn, (2, 3, 16, 16)), ("mobilenet", mobilenet, (1, 3, 32, 32)),
                  ("transformer", encoder, (2, 8, 16)), ("lstm", _lstm, (2, 5, 4)), ("odd_ops", _odd_ops, (2, 12))]


def _models():
    """(name, graph without variables, outputs) for every model below, native and through ONNX."""
    for name, build, shape in SESSION_MODELS:
        sess, _, y = session_of(build, shape)
        frozen = freeze(sess, [y])
        yield name, frozen, [frozen.tensor(y.name)]
        if name == "odd_ops":
            continue
        g2, _, outs = from_onnx(to_onnx(sess, [y]))
        yield name + "-onnx", g2, [outs[0]]
    g, x, logits = mobilenet_v2(batch=1, res=32)
    with g.as_default():
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    frozen = freeze(sess, [logits])
    yield "bench-mobilenet_v2", frozen, [frozen.tensor(logits.name)]


# an edge 100x faster than the default profile behind a 1 kbit/s link: planning puts on the edge
# everything it believes the edge can run; and the default profile and link
COSTS = [("greedy-edge", lambda b: CostModel.edge_cloud(LinkModel(1e3, 1e3, 0.04), edge=EDGE.scaled(0.01),
                                                        batch_size=b)),
         ("default", lambda b: CostModel.edge_cloud(batch_size=b))]


@pytest.mark.parametrize("cost_name,make_cost", COSTS, ids=[c[0] for c in COSTS])
def test_default_planning_places_only_what_the_edge_exports(cost_name, make_cost):
    checked = 0
    for name, g, outs in _models():
        batch = outs[0].shape[0] or 1
        plan = plan_split(g, make_cost(batch), outputs=outs)
        on_edge = [n for n, d in plan.placement.items() if d == EDGE_DEVICE]
        part = partition(g, plan.placement, outs, return_to=EDGE_DEVICE)
        edge_part = part.parts.get(EDGE_DEVICE)
        if edge_part is None:
            continue
        eg, recvs, sends, eouts = _standalone(edge_part, part.transfers, batch_none=False)
        e_outs = [sends[s] for s in sorted(sends)] + [eouts[t.name] for t in outs if t.name in eouts]
        e_ins = [t for t in recvs.values()] + [n.outputs[0] for n in eg.nodes if n.op == "Placeholder"
                                               and n.outputs[0] not in recvs.values()]
        if not e_outs:
            continue
        try:
            Interpreter(to_edge(eg, e_outs, e_ins, batch=batch))  # export, load and prepare every kernel
        except Exception as e:
            pytest.fail(f"{name} ({cost_name}): the plan put {len(on_edge)} nodes on the edge, and the edge "
                        f"refuses its part: {e}")
        checked += 1
    assert checked >= 8


NEW_OPS = [  # (name, input shape, build(x) -> outputs): each edge kernel against the core kernel
    ("transpose", (2, 3, 4, 5), lambda x: [ism.transpose(x, (0, 2, 3, 1))]),
    ("transpose_3d", (2, 3, 4), lambda x: [ism.transpose(x, (2, 0, 1))]),
    ("split_axis1", (2, 6, 5), lambda x: list(ism.split(x, 3, axis=1))),
    ("split_sizes_last", (2, 3, 7), lambda x: list(ism.split(x, [2, -1, 1], axis=-1))),
    ("layer_norm", (2, 5, 8), lambda x: [nn.LayerNorm()(x)]),
    ("layer_norm_axis1", (3, 4, 6), lambda x: [nn.LayerNorm(axis=1)(x)]),
    ("leaky_relu", (3, 7), lambda x: [ism.leaky_relu(x, 0.1)]),
    ("leaky_relu_steep", (3, 7), lambda x: [ism.leaky_relu(x, 1.5)]),
]


@pytest.mark.parametrize("name,shape,build", NEW_OPS, ids=[c[0] for c in NEW_OPS])
def test_new_edge_kernels_match_the_core_kernels(name, shape, build):
    sess, x, ys = session_of(build, shape)
    xv = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    want = sess.run(ys, {x: xv})
    it = Interpreter(to_edge(sess, ys))
    got = it.invoke(xv)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    again = it.invoke(xv)  # arena reused: the same answer
    for a, b in zip(again, got):
        np.testing.assert_array_equal(a, b)
