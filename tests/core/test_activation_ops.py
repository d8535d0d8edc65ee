"""The activation and pointwise families (core/ops/activation.py, core/ops/pointwise.py): forward against
numpy written out, static shapes against the kernel, gradients against finite differences."""
import numpy as np
import pytest

import isthmus as ism

from .opcheck import check_forward, check_gradients, run_op

rng = np.random.default_rng(3)


def _r(*shape, lo=-3.0, hi=3.0):
    x = rng.uniform(lo, hi, shape)
    x[np.abs(x) < 0.05] = 0.3  # keep finite differences away from the kinks at 0
    return x


def _np_elu(x, a=1.0):
    return np.where(x > 0, x, a * (np.exp(x) - 1))


SA, SG = 1.67326319217681884765625, 1.05070102214813232421875
HS = _r(3, 5, lo=-5, hi=5)
HS[np.abs(np.abs(HS) - 3) < 0.05] = 1.0  # HardSwish kinks at +-3
HG = _r(3, 5, lo=-5, hi=5)
HG[np.abs(np.abs(HG + 0.4 / 0.25 - 2) - 2) < 0.05] = 0.7  # HardSigmoid(0.25, 0.4) kinks at -1.6 and 2.4

# name, builder, inputs (float64), numpy reference, differentiable
CASES = [
    ("hard_sigmoid", lambda x: ism.hard_sigmoid(x, 0.25, 0.4), [HG], lambda x: np.clip(0.25 * x + 0.4, 0, 1), True),
    ("hard_swish", ism.hard_swish, [HS], lambda x: x * np.clip(x / 6 + 0.5, 0, 1), True),
    ("elu", lambda x: ism.elu(x, 0.7), [_r(3, 4)], lambda x: _np_elu(x, 0.7), True),
    ("selu", ism.selu, [_r(3, 4)], lambda x: SG * np.where(x > 0, x, SA * (np.exp(x) - 1)), True),
    ("celu", lambda x: ism.celu(x, 0.5), [_r(3, 4)], lambda x: np.maximum(x, 0) + np.minimum(0, 0.5 * (np.exp(x / 0.5) - 1)), True),
    ("softplus", ism.softplus, [_r(3, 4, lo=-30, hi=30)], lambda x: np.log1p(np.exp(x)), True),
    ("softsign", ism.softsign, [_r(3, 4)], lambda x: x / (1 + np.abs(x)), True),
    ("thresholded_relu", lambda x: ism.thresholded_relu(x, 0.5), [_r(3, 4)], lambda x: np.where(x > 0.5, x, 0), True),
    ("prelu_channel", lambda x, s: ism.prelu(x, s), [_r(2, 3, 4), _r(3, 1)], lambda x, s: np.where(x < 0, x * s, x), True),
    ("prelu_scalar", lambda x, s: ism.prelu(x, s), [_r(4, 5), _r(1)], lambda x, s: np.where(x < 0, x * s, x), True),
    ("sin", ism.sin, [_r(3, 4)], np.sin, True),
    ("cos", ism.cos, [_r(3, 4)], np.cos, True),
    ("tan", ism.tan, [_r(3, 4, lo=-1.2, hi=1.2)], np.tan, True),
    ("atan", ism.atan, [_r(3, 4)], np.arctan, True),
    ("sinh", ism.sinh, [_r(3, 4)], np.sinh, True),
    ("cosh", ism.cosh, [_r(3, 4)], np.cosh, True),
    ("asin", ism.asin, [_r(3, 4, lo=-0.9, hi=0.9)], np.arcsin, True),
    ("acos", ism.acos, [_r(3, 4, lo=-0.9, hi=0.9)], np.arccos, True),
    ("asinh", ism.asinh, [_r(3, 4)], np.arcsinh, True),
    ("acosh", ism.acosh, [_r(3, 4, lo=1.1, hi=4.0)], np.arccosh, True),
    ("atanh", ism.atanh, [_r(3, 4, lo=-0.9, hi=0.9)], np.arctanh, True),
    ("fmod", ism.fmod, [_r(3, 4), _r(4, lo=0.5, hi=2)], np.fmod, True),
    ("round", ism.round, [np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.4, -2.6])], np.rint, False),
    ("isnan", ism.isnan, [np.array([1.0, np.nan, -np.inf, 0.0])], np.isnan, False),
    ("isinf", ism.isinf, [np.array([1.0, np.nan, -np.inf, np.inf])], np.isinf, False),
    ("isinf_pos", lambda x: ism.isinf(x, detect_negative=False), [np.array([1.0, -np.inf, np.inf])], np.isposinf, False),
]
NO_GRADIENT = {"Round", "IsNaN", "IsInf"}  # zero or undefined by definition (gradient returns None)


@pytest.mark.parametrize("name,build,inputs,ref,diff", CASES, ids=[c[0] for c in CASES])
def test_forward(name, build, inputs, ref, diff):
    check_forward(build, inputs, ref, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("name,build,inputs,ref,diff", CASES, ids=[c[0] for c in CASES])
def test_forward_float32(name, build, inputs, ref, diff):
    ins = [a.astype(np.float32) for a in inputs]
    want = ref(*inputs)
    got, _ = run_op(build, ins)
    assert got[0].dtype == (np.bool_ if want.dtype == bool else np.float32)
    np.testing.assert_allclose(got[0], want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name,build,inputs,ref,diff", [c for c in CASES if c[4]], ids=[c[0] for c in CASES if c[4]])
def test_gradient(name, build, inputs, ref, diff):
    check_gradients(build, inputs)


def test_softplus_does_not_overflow_in_float32():
    got, _ = run_op(ism.softplus, [np.array([-200.0, 0.0, 200.0], np.float32)])
    np.testing.assert_allclose(got[0], [0.0, np.log(2), 200.0], rtol=1e-6)


def test_integer_input_is_refused_at_construction():
    with ism.Graph().as_default():
        with pytest.raises(ism.ShapeError, match="float"):
            ism.elu(ism.placeholder("int32", (3,)))
