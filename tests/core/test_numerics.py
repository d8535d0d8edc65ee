"""NaN/Inf checks (issue 23): the CheckNumerics op, Session(check_numerics=True) naming the first
node that produced a NaN or Inf, and optimizers skipping a step whose gradients are not finite."""
import warnings

import numpy as np
import pytest

import isthmus as ism
from isthmus import nn
from isthmus.core.ops.numerics import NonFiniteError, NonFiniteWarning, all_finite, check_numerics, non_finite


def test_non_finite_finds_the_first_bad_element_and_passes_clean_arrays():
    assert non_finite(np.ones((3, 4), np.float32)) is None
    assert non_finite(np.arange(5)) is None                     # ints are never checked
    assert non_finite(np.full((2,), 3e30, np.float32)) is None  # the dot overflows; the exact test clears it
    x = np.zeros((3, 4), np.float32)
    x[1, 2], x[2, 0] = np.nan, np.inf
    assert non_finite(x) == "NaN at index (1, 2) (2 of 12 elements not finite)"
    assert non_finite(-np.inf * np.ones((), np.float64)).startswith("-Inf at index ()")
    assert non_finite(np.asfortranarray(x)).startswith("NaN")   # not contiguous: the exact path
    assert non_finite(x.astype(np.float16)).startswith("NaN")


def test_check_numerics_op_passes_values_through_and_names_itself_on_nan():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 3), name="x")
        y = check_numerics(ism.log(x), "after log", name="check_log")
        loss = ism.reduce_sum(y * x)
        dx = ism.gradients(loss, [x])[0]
    s = ism.Session(g)
    v = np.array([[1.0, 2.0, 3.0]], np.float32)
    got, grad = s.run([y, dx], {x: v})
    np.testing.assert_allclose(got, np.log(v))
    np.testing.assert_allclose(grad, np.log(v) + 1.0, rtol=1e-6)  # d/dx x*log(x): the check passes dy through
    with pytest.raises(NonFiniteError, match=r"node 'check_log' \(CheckNumerics\): after log: input "
                                             r"'.*' holds NaN at index \(0, 1\)") as e:
        s.run(y, {x: np.array([[1.0, -2.0, 3.0]], np.float32)})
    assert e.value.node_name == "check_log"


def _chain():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2,), name="x")
        a = ism.mul(x, 2.0, name="double")
        b = ism.sqrt(a, name="root")          # NaN for a negative input
        c = ism.div(1.0, b, name="inverse")   # Inf for a zero
        out = ism.add(c, 1.0, name="out")
    return g, x, out


def test_session_check_numerics_names_the_first_node_that_produced_nan_or_inf():
    g, x, out = _chain()
    # off by default: NaN passes silently
    assert np.isnan(ism.Session(g).run(out, {x: np.array([-1.0, 1.0], np.float32)})).any()
    s = ism.Session(g, check_numerics=True)
    np.testing.assert_allclose(s.run(out, {x: np.array([2.0, 8.0], np.float32)}), [1.5, 1.25])
    with pytest.raises(NonFiniteError, match=r"node 'root' \(Sqrt\) produced NaN at index \(0,\)") as e:
        s.run(out, {x: np.array([-1.0, 1.0], np.float32)})
    assert e.value.node_name == "root" and e.value.op == "Sqrt"
    with pytest.raises(NonFiniteError, match=r"node 'inverse' \(Div\) produced \+Inf"):
        s.run(out, {x: np.array([0.0, 1.0], np.float32)})
    with pytest.raises(NonFiniteError, match=r"feed 'x:0' holds NaN"):
        s.run(out, {x: np.array([np.nan, 1.0], np.float32)})


def _model(opt, skip):
    g = ism.Graph(seed=3)
    with g.as_default():
        x = ism.placeholder("float32", (None, 8), name="x")
        y = ism.placeholder("int32", (None,), name="y")
        logits = nn.Sequential([nn.Dense(6, activation="relu", name="fc1"), nn.Dense(3, name="fc2")])(x)
        loss = nn.sparse_softmax_cross_entropy(y, logits)
        step = ism.optimizers.get_or_create_global_step()
        o = opt()
        train = o.minimize(loss, global_step=step, skip_non_finite=skip)
        init = ism.global_variables_initializer()
    return g, dict(x=x, y=y, loss=loss, train=train, init=init, opt=o, step=step)


def _batches():
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((4, 8)).astype(np.float32), rng.integers(0, 3, 4).astype(np.int32))
            for _ in range(4)]


@pytest.mark.parametrize("opt", [lambda: ism.optimizers.SGD(0.1), lambda: ism.optimizers.Adam(0.01),
                                 lambda: ism.optimizers.Momentum(0.1)], ids=["sgd", "adam", "momentum"])
@pytest.mark.cpu  # bit for bit on the CPU; on a GPU the guarded step is 1 ulp off the plain one
def test_a_nan_batch_is_skipped_and_counted_and_training_goes_on_as_without_it(opt):
    data = _batches()
    poisoned = data[1][0].copy()
    poisoned[2, 5] = np.nan
    # the reference: the clean batches only, without the option
    g0, t0 = _model(opt, False)
    s0 = ism.Session(g0)
    s0.run(t0["init"])
    for xb, yb in (data[0], data[2], data[3]):
        s0.run(t0["train"], {t0["x"]: xb, t0["y"]: yb})
    ref = {v.node.name: s0.run(v.value()) for v in g0.get_collection("trainable_variables")}
    # without the option one NaN batch poisons every variable
    g1, t1 = _model(opt, False)
    s1 = ism.Session(g1)
    s1.run(t1["init"])
    s1.run(t1["train"], {t1["x"]: poisoned, t1["y"]: data[1][1]})
    assert all(np.isnan(s1.run(v.value())).all() for v in g1.get_collection("trainable_variables")
               if v.node.name.endswith("kernel"))
    # with it: the step is skipped, said so, counted; the others train exactly as the reference
    g2, t2 = _model(opt, True)
    s2 = ism.Session(g2)
    s2.run(t2["init"])
    s2.run(t2["train"], {t2["x"]: data[0][0], t2["y"]: data[0][1]})
    with pytest.warns(NonFiniteWarning, match="the gradient of '.*' holds NaN"):
        s2.run(t2["train"], {t2["x"]: poisoned, t2["y"]: data[1][1]})
    for xb, yb in (data[2], data[3]):
        s2.run(t2["train"], {t2["x"]: xb, t2["y"]: yb})
    assert s2.run(t2["opt"].skipped_steps.value()) == 1
    assert s2.run(t2["step"].value()) == 3   # the skipped step is not a step
    for v in g2.get_collection("trainable_variables"):
        np.testing.assert_array_equal(s2.run(v.value()), ref[v.node.name], err_msg=v.node.name)


def test_all_finite_op():
    g = ism.Graph()
    with g.as_default():
        a = ism.placeholder("float32", (2,), name="a")
        b = ism.placeholder("int32", (2,), name="b")
        ok = all_finite([a, b], ["a", "b"])
    s = ism.Session(g)
    assert s.run(ok, {a: np.ones(2, np.float32), b: np.ones(2, np.int32)}) == True  # noqa: E712
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert s.run(ok, {a: np.array([1, np.inf], np.float32), b: np.ones(2, np.int32)}) == False  # noqa: E712
    assert "'a' holds +Inf at index (1,)" in str(w[0].message)
