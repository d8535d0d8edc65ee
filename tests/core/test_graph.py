"""The graph IR: names, scopes, devices, control deps, verify(), printing, errors at construction."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core.errors import GraphError


def test_unique_names_and_scopes():
    g = ism.Graph()
    with g.as_default():
        a = ism.placeholder("float32", (2,), name="x")
        b = ism.placeholder("float32", (2,), name="x")
        assert (a.node.name, b.node.name) == ("x", "x_1")
        with ism.name_scope("layer"):
            c = a + b
            with ism.name_scope("inner"):
                d = ism.relu(c)
        with ism.name_scope("layer"):
            e = ism.tanh(a)
    assert c.node.name == "layer/Add"
    assert d.node.name == "layer/inner/Relu"
    assert e.node.name == "layer_1/Tanh"
    assert g.tensor("layer/Add:0") is c and g.node("x_1") is b.node
    g.verify()


def test_device_scopes_nest_and_merge():
    g = ism.Graph()
    with g.as_default():
        with ism.device("/job:cloud/task:0"):
            with ism.device("/device:GPU:0"):
                a = ism.constant(1.0)
            b = ism.constant(2.0)
        c = ism.constant(3.0)
    assert a.node.device == "/job:cloud/task:0/device:GPU:0"
    assert b.node.device == "/job:cloud/task:0"
    assert c.node.device is None
    with pytest.raises(ValueError, match="malformed device"):
        with g.device("/gpu-zero"):
            pass


def test_control_dependencies_are_recorded_and_run_first():
    g = ism.Graph()
    with g.as_default():
        v = ism.Variable(np.zeros(1, np.float32), name="v")
        inc = v.assign_add(np.ones(1, np.float32))
        with ism.control_dependencies([inc]):
            out = ism.identity(ism.constant(5.0))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
        sess.run(out)
        sess.run(out)
        assert out.node.control_inputs == (inc.node,)
        np.testing.assert_array_equal(sess.run(v), [2.0])


def test_shape_error_names_node_op_and_shapes():
    with ism.Graph().as_default():
        a = ism.placeholder("float32", (3, 4), name="acts")
        w = ism.placeholder("float32", (5, 2), name="w")
        with pytest.raises(ism.ShapeError) as e:
            ism.matmul(a, w, name="dense")
    msg = str(e.value)
    assert "'dense'" in msg and "MatMul" in msg and "[3,4]" in msg and "[5,2]" in msg


def test_inputs_from_another_graph_are_refused():
    g1, g2 = ism.Graph(), ism.Graph()
    with g1.as_default():
        a = ism.constant(1.0)
    with g2.as_default():
        b = ism.constant(2.0)
    with pytest.raises(GraphError, match="another graph"):
        g2.add_node("Add", (a, b))


def test_unknown_op_lists_known_ops_and_attrs_are_checked():
    g = ism.Graph()
    with pytest.raises(KeyError, match="unknown op 'Frobnicate'.*Add"):
        g.add_node("Frobnicate")
    with g.as_default():
        x = ism.constant(1.0)
    with pytest.raises(GraphError, match="unknown attribute"):
        g.add_node("Relu", (x,), {"alpha": 1})
    with pytest.raises(GraphError, match="takes 2 inputs"):
        g.add_node("Add", (x,))


def test_duplicate_registration_is_an_error():
    from isthmus.core import registry
    with pytest.raises(GraphError, match="registered twice"):
        registry.register(registry.get("Add"))


def test_verify_finds_corruption():
    g = ism.Graph()
    with g.as_default():
        a = ism.placeholder("float32", (2,), name="a")
        b = ism.relu(a)
    g.verify()
    b.node.outputs[0].shape = (3,)  # corrupt the static shape
    with pytest.raises(GraphError, match="inference says"):
        g.verify()
    b.node.outputs[0].shape = (2,)
    g.nodes.reverse()  # wrong order
    with pytest.raises(GraphError):
        g.verify()


def test_printout_is_one_line_per_node():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 4), name="x")
        y = ism.relu(x + 1.0, name="act")
    text = str(g)
    assert len(text.splitlines()) == len(g.nodes)
    assert "%act = Relu(%Add) : float32[?,4]" in text


def test_bool_of_tensor_is_an_error():
    with ism.Graph().as_default():
        x = ism.constant(1.0)
        with pytest.raises(TypeError, match="truth value"):
            if x:
                pass


def test_an_empty_graph_passed_explicitly_is_used():
    g = ism.Graph()
    x = ism.placeholder("float32", (2,), graph=g)
    assert x.graph is g and len(g) == 1
