"""Table-driven tests of the math family (core/ops/math.py, core/ops/linalg.py)."""
import numpy as np
import pytest
from scipy.special import erf as sp_erf

import isthmus as ism

from .opcheck import check_forward, check_gradients

rng = np.random.default_rng(0)


def _r(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, shape)


def _pos(*shape):
    return rng.uniform(0.5, 2.0, shape)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _gelu(x):
    return 0.5 * x * (1 + sp_erf(x / np.sqrt(2)))


# name, builder, inputs (float64), numpy reference, differentiable
FLOAT_CASES = [
    ("add_bcast", lambda a, b: a + b, [_r(3, 4), _r(4)], np.add, True),
    ("add_bcast_col", lambda a, b: ism.add(a, b), [_r(3, 1), _r(1, 4)], np.add, True),
    ("sub", lambda a, b: a - b, [_r(2, 3), _r(2, 3)], np.subtract, True),
    ("mul_bcast", lambda a, b: a * b, [_r(2, 3, 4), _r(3, 1)], np.multiply, True),
    ("div", lambda a, b: a / b, [_r(2, 3), _pos(2, 3)], np.divide, True),
    ("pow", lambda a, b: a ** b, [_pos(2, 3), _r(2, 3)], np.power, True),
    ("maximum", ism.maximum, [_r(3, 4), _r(3, 4)], np.maximum, True),
    ("minimum", ism.minimum, [_r(3, 4), _r(4)], np.minimum, True),
    ("neg", lambda a: -a, [_r(5)], np.negative, True),
    ("abs", ism.abs, [_r(5)], np.abs, True),
    ("exp", ism.exp, [_r(2, 3)], np.exp, True),
    ("log", ism.log, [_pos(2, 3)], np.log, True),
    ("sqrt", ism.sqrt, [_pos(2, 3)], np.sqrt, True),
    ("rsqrt", ism.rsqrt, [_pos(2, 3)], lambda x: 1 / np.sqrt(x), True),
    ("square", ism.square, [_r(2, 3)], np.square, True),
    ("reciprocal", ism.reciprocal, [_pos(4)], np.reciprocal, True),
    ("tanh", ism.tanh, [_r(2, 3)], np.tanh, True),
    ("sigmoid", ism.sigmoid, [_r(2, 3, lo=-6, hi=6)], _sigmoid, True),
    ("erf", ism.erf, [_r(2, 3)], sp_erf, True),
    ("relu", ism.relu, [_r(3, 4)], lambda x: np.maximum(x, 0), True),
    ("relu6", ism.relu6, [_r(3, 4, lo=-3, hi=9)], lambda x: np.clip(x, 0, 6), True),
    ("leaky_relu", lambda x: ism.leaky_relu(x, 0.1), [_r(3, 4)], lambda x: np.where(x > 0, x, 0.1 * x), True),
    ("gelu", ism.gelu, [_r(3, 4)], _gelu, True),
    ("gelu_tanh", lambda x: ism.gelu(x, "tanh"), [_r(3, 4)],
     lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))), True),
    ("where", lambda c, a, b: ism.where(c, a, b), [_r(3, 4) > 0, _r(3, 4), _r(4)], np.where, True),
    ("cast_f32", lambda a: ism.cast(a, "float32"), [_r(2, 2)], lambda a: a.astype(np.float32), False),
    ("matmul", ism.matmul, [_r(3, 4), _r(4, 5)], np.matmul, True),
    ("matmul_ta", lambda a, b: ism.matmul(a, b, transpose_a=True), [_r(4, 3), _r(4, 5)], lambda a, b: a.T @ b, True),
    ("matmul_tb", lambda a, b: ism.matmul(a, b, transpose_b=True), [_r(3, 4), _r(5, 4)], lambda a, b: a @ b.T, True),
    ("matmul_tab", lambda a, b: ism.matmul(a, b, True, True), [_r(4, 3), _r(5, 4)], lambda a, b: a.T @ b.T, True),
    ("matmul_batched_bcast", lambda a, b: a @ b, [_r(2, 3, 4), _r(4, 5)], np.matmul, True),
    ("bias_add", ism.bias_add, [_r(3, 4), _r(4)], np.add, True),
    ("bias_add_nchw", lambda x, b: ism.bias_add(x, b, axis=1), [_r(2, 3, 2, 2), _r(3)],
     lambda x, b: x + b.reshape(1, 3, 1, 1), True),
    ("add_n", lambda a, b, c: ism.add_n([a, b, c]), [_r(2, 3), _r(2, 3), _r(2, 3)], lambda a, b, c: a + b + c, True),
]


@pytest.mark.parametrize("name,build,inputs,ref,diff", FLOAT_CASES, ids=[c[0] for c in FLOAT_CASES])
def test_forward_float64(name, build, inputs, ref, diff):
    check_forward(build, inputs, ref, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("name,build,inputs,ref,diff", FLOAT_CASES, ids=[c[0] for c in FLOAT_CASES])
def test_forward_float32(name, build, inputs, ref, diff):
    ins = [a.astype(np.float32) if a.dtype == np.float64 else a for a in inputs]
    got_ref = ref(*ins)
    check_forward(build, ins, lambda *a: got_ref, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("name,build,inputs,ref,diff", [c for c in FLOAT_CASES if c[4]],
                         ids=[c[0] for c in FLOAT_CASES if c[4]])
def test_gradient(name, build, inputs, ref, diff):
    check_gradients(build, inputs)


COMPARE_CASES = [
    ("equal", ism.equal, np.equal), ("not_equal", ism.not_equal, np.not_equal),
    ("less", ism.less, np.less), ("less_equal", ism.less_equal, np.less_equal),
    ("greater", lambda a, b: a > b, np.greater), ("greater_equal", lambda a, b: a >= b, np.greater_equal),
]


@pytest.mark.parametrize("name,build,ref", COMPARE_CASES, ids=[c[0] for c in COMPARE_CASES])
def test_comparisons(name, build, ref):
    a = rng.integers(0, 3, (3, 4)).astype(np.int32)
    b = rng.integers(0, 3, (4,)).astype(np.int32)
    check_forward(build, [a, b], ref)


def test_integer_arithmetic_and_scalar_promotion():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    check_forward(lambda x: x * 3 + 1, [a], lambda x: x * 3 + 1)
    check_forward(lambda x: x // 2, [a], lambda x: x // 2)


def test_mixed_dtypes_fail_at_construction_naming_the_node():
    with ism.Graph().as_default():
        a = ism.placeholder("float32", (2,), name="a")
        b = ism.placeholder("float64", (2,), name="b")
        with pytest.raises(ism.ShapeError, match=r"node 'Add' \(Add\).*float32 vs float64"):
            ism.add(a, b)
        i = ism.placeholder("int32", (2,), name="i")
        with pytest.raises(ism.ShapeError, match="cannot combine float"):
            i + 1.5


def test_broadcast_error_names_node_and_shapes():
    with ism.Graph().as_default():
        a = ism.placeholder("float32", (2, 3), name="a")
        b = ism.placeholder("float32", (4,), name="b")
        with pytest.raises(ism.ShapeError, match=r"'my_add'.*\[2,3\].*\[1,4\]"):
            ism.add(a, b, name="my_add")


def test_matmul_shape_error():
    with ism.Graph().as_default():
        a = ism.placeholder("float32", (2, 3))
        b = ism.placeholder("float32", (4, 5))
        with pytest.raises(ism.ShapeError, match="inner dimensions differ"):
            a @ b


def test_sigmoid_does_not_overflow():
    check_forward(ism.sigmoid, [np.array([-1000.0, 0.0, 1000.0], np.float32)],
                  lambda x: np.array([0.0, 0.5, 1.0], np.float32))


def test_cast_gradient():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float64", (3,))
        y = ism.cast(x, "float32") * 2.0
        (dx,) = ism.gradients(y, [x])
        got = ism.Session(g).run(dx, {x: np.ones(3)})
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, [2.0, 2.0, 2.0])


def test_add_n_of_scalars_fan_in():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float64", (3,))
        s = ism.reduce_sum(x)
        y = s * s + 2.0 * s + ism.exp(s)  # s feeds three consumers: its gradient is an AddN of scalars
        (ds,) = ism.gradients(y, [s])
        got = ism.Session(g).run(ds, {x: np.array([0.1, 0.2, 0.3])})
    np.testing.assert_allclose(got, 2 * 0.6 + 2 + np.exp(0.6))


@pytest.mark.parametrize("jit", ["0", "1"])
def test_float32_erf_against_the_standard_library(monkeypatch, jit):
    # the float32 kernel is a rational approximation (not scipy): check it against math.erf,
    # an independent double-precision reference, over the whole range, tiny values, +-inf and NaN;
    # numpy passes (ISTHMUS_JIT=0) and the compiled loop (jit/erf.py) alike
    import math
    monkeypatch.setenv("ISTHMUS_JIT", jit)
    x = np.concatenate([np.linspace(-7, 7, 20001), np.logspace(-36, 0.7, 2001), -np.logspace(-36, 0.7, 2001),
                        [0.0, -0.0, np.inf, -np.inf]]).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        p = ism.placeholder(ism.float32, [None], name="x")
        y = ism.erf(p)
        h = ism.placeholder(ism.float16, [None], name="h")
        yh = ism.erf(h)
    with ism.Session(g) as s:
        got = s.run(y, {p: x})
        got_h = s.run(yh, {h: x.astype(np.float16)})
        nan = s.run(y, {p: np.array([np.nan], np.float32)})
    ref = np.array([math.erf(float(v)) for v in x])
    assert got.dtype == np.float32 and got_h.dtype == np.float16
    rel = np.abs(got - ref) / np.maximum(np.abs(ref), np.finfo(np.float32).tiny)
    assert rel.max() < 1e-6, x[np.argmax(rel)]
    assert np.array_equal(got[-4:], [0.0, 0.0, 1.0, -1.0]) and np.signbit(got[-3])
    ref_h = np.array([math.erf(float(v)) for v in x.astype(np.float16)])
    assert np.abs(got_h.astype(np.float64) - ref_h).max() < 1e-3
    assert np.isnan(nan[0])
