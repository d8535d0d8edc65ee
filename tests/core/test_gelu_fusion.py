"""passes/gelu.py: the exact GELU written out as five nodes (as ONNX exporters before opset 20 write
it) runs as one Gelu node, with the same bits as the five where erf's argument is x * (1/sqrt(2));
the Gelu kernel's compiled pass against a float64 reference."""
import math

import numpy as np
import pytest

import isthmus as ism
from isthmus.core.executor import prune
from isthmus.core.passes import SESSION_PASSES, optimize

INV = np.float32(1 / math.sqrt(2))


def _erf_form(x, variant: str):
    """x * 0.5 * (1 + erf(x / sqrt(2))) in the shapes exporters write."""
    f = lambda v: ism.constant(np.float32(v))  # noqa: E731
    arg = ism.div(x, f(math.sqrt(2))) if variant == "div" else ism.mul(x, f(INV))
    e1 = ism.add(ism.erf(arg), f(1.0))
    if variant in ("torch", "div"):
        return ism.mul(ism.mul(x, e1), f(0.5))
    if variant == "half_first":
        return ism.mul(ism.mul(x, f(0.5)), e1)
    return ism.mul(x, ism.mul(e1, f(0.5)))  # "half_inside"


def _graph(variant, extra_use=False):
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (8, 40), name="x")
        h = ism.tanh(x)
        y = _erf_form(h, variant)
        outs = [ism.identity(y, name="y")]
        if extra_use:  # the erf read elsewhere too: nothing may be fused away
            outs.append(ism.identity(ism.erf(ism.mul(h, ism.constant(INV))), name="other"))
    return g, x, outs


def _ops(g, outs, x):
    nodes = prune([o.node for o in outs], {x})
    rw = optimize(g, nodes, outs, [x], SESSION_PASSES)
    rw.graph.verify()
    return [n.op for n in rw.graph.nodes]


@pytest.mark.cpu  # compares the CPU's kernels bit for bit
@pytest.mark.parametrize("variant", ["torch", "half_first", "half_inside", "div"])
def test_the_written_out_gelu_runs_as_one_node_with_the_same_values(variant):
    g, x, outs = _graph(variant)
    ops = _ops(g, outs, x)
    assert ops.count("Gelu") == 1 and "Erf" not in ops and "Add" not in ops and "Mul" not in ops and "Div" not in ops
    xv = np.random.default_rng(0).standard_normal((8, 40)).astype(np.float32) * 3
    fused = ism.Session(g).run(outs[0], {x: xv})
    plain = ism.Session(g, optimize=False).run(outs[0], {x: xv})
    h = np.tanh(xv.astype(np.float64))
    ref = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))  # float64, written out
    np.testing.assert_allclose(fused, ref, rtol=2e-6, atol=2e-7)
    if variant == "div":  # erf's argument rounded once differently: the last bits may move
        np.testing.assert_allclose(fused, plain, rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(fused, plain)


def test_a_gelu_whose_parts_are_read_elsewhere_or_whose_constants_differ_is_left_alone():
    g, x, outs = _graph("torch", extra_use=True)
    ops = _ops(g, outs, x)  # the second erf is merged with the first, which then has two readers
    assert "Gelu" not in ops and ops.count("Erf") == 1
    g = ism.Graph(seed=0)
    with g.as_default():
        xx = ism.placeholder("float32", (4,), name="x")
        f = lambda v: ism.constant(np.float32(v))  # noqa: E731
        y = ism.mul(ism.mul(xx, ism.add(ism.erf(ism.mul(xx, f(0.7))), f(1.0))), f(0.5))  # not 1/sqrt(2)
    assert "Gelu" not in _ops(g, [y], xx)


def test_the_gelu_kernel_matches_float64_and_its_gradient_finite_differences():
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float64", (50,), name="x")
        y = ism.gelu(x)
        dx, = ism.gradients(ism.reduce_sum(y), [x])
        x32 = ism.placeholder("float32", (3, 1000), name="x32")
        y32 = ism.gelu(x32)
    s = ism.Session(g)
    xv = np.linspace(-6, 6, 50)
    ref = 0.5 * xv * (1 + np.vectorize(math.erf)(xv / math.sqrt(2)))
    np.testing.assert_allclose(s.run(y, {x: xv}), ref, rtol=1e-12, atol=1e-14)
    eps = 1e-6
    fd = (s.run(y, {x: xv + eps}) - s.run(y, {x: xv - eps})) / (2 * eps)
    np.testing.assert_allclose(s.run(dx, {x: xv}), fd, rtol=1e-6, atol=1e-8)
    v32 = np.random.default_rng(1).standard_normal((3, 1000)).astype(np.float32) * 4
    got = s.run(y32, {x32: v32[:, ::1]})
    r32 = 0.5 * v32.astype(np.float64) * (1 + np.vectorize(math.erf)(v32.astype(np.float64) / math.sqrt(2)))
    # 1 + erf cancels for x << 0: float32 leaves an absolute error of about |x| eps there
    np.testing.assert_allclose(got, r32, rtol=3e-6, atol=1e-6)
