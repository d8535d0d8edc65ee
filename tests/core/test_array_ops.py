"""Array ops: forward against numpy, gradients against finite differences, errors at build."""
import numpy as np
import pytest

import isthmus as ism

from .opcheck import check_forward, check_gradients

rng = np.random.default_rng(0)
A = rng.standard_normal((2, 3, 4))

CASES = [
    ("reshape", lambda x: ism.reshape(x, (6, -1)), [A], lambda x: x.reshape(6, -1)),
    ("flatten", ism.flatten, [A], lambda x: x.reshape(2, -1)),
    ("transpose", lambda x: ism.transpose(x, (2, 0, 1)), [A], lambda x: x.transpose(2, 0, 1)),
    ("transpose_default", ism.transpose, [A], lambda x: x.T),
    ("concat", lambda a, b: ism.concat([a, b], axis=1), [A, rng.standard_normal((2, 2, 4))],
     lambda a, b: np.concatenate([a, b], 1)),
    ("split_sum", lambda x: ism.split(x, [1, 3], axis=2)[1] * 2.0, [A], lambda x: x[:, :, 1:] * 2),
    ("split_even", lambda x: ism.split(x, 2, axis=2)[0] + ism.split(x, 2, axis=2)[1], [A],
     lambda x: x[:, :, :2] + x[:, :, 2:]),
    ("getitem", lambda x: x[1, ::2, 1:3], [A], lambda x: x[1, ::2, 1:3]),
    ("getitem_neg_step", lambda x: x[:, ::-1, None, -1], [A], lambda x: x[:, ::-1, None, -1]),
    ("getitem_ellipsis", lambda x: x[..., 2], [A], lambda x: x[..., 2]),
    ("slice", lambda x: ism.slice(x, (0, 1, 1), (-1, 2, 2)), [A], lambda x: x[:, 1:3, 1:3]),
    ("pad", lambda x: ism.pad(x, ((0, 0), (1, 2), (0, 1))), [A], lambda x: np.pad(x, ((0, 0), (1, 2), (0, 1)))),
    ("pad_reflect", lambda x: ism.pad(x, ((0, 0), (1, 1), (2, 1)), "reflect"), [A],
     lambda x: np.pad(x, ((0, 0), (1, 1), (2, 1)), "reflect")),
    ("pad_edge", lambda x: ism.pad(x, ((1, 0), (0, 0), (1, 1)), "edge"), [A],
     lambda x: np.pad(x, ((1, 0), (0, 0), (1, 1)), "edge")),
    ("squeeze", lambda x: ism.squeeze(x, 1), [rng.standard_normal((3, 1, 2))], lambda x: x[:, 0]),
    ("expand_dims", lambda x: ism.expand_dims(x, -1), [A], lambda x: x[..., None]),
    ("tile", lambda x: ism.tile(x, (2, 1, 3)), [A], lambda x: np.tile(x, (2, 1, 3))),
    ("broadcast_to", lambda x: ism.broadcast_to(x, (2, 3, 4)), [rng.standard_normal((3, 1))],
     lambda x: np.broadcast_to(x, (2, 3, 4))),
]


@pytest.mark.parametrize("name,build,inputs,ref", CASES, ids=[c[0] for c in CASES])
def test_forward(name, build, inputs, ref):
    check_forward(build, inputs, ref, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name,build,inputs,ref", CASES, ids=[c[0] for c in CASES])
def test_gradient(name, build, inputs, ref):
    check_gradients(build, inputs)


def test_shape_fill_one_hot():
    check_forward(lambda x: ism.shape(x), [A], lambda x: np.array(x.shape, np.int32))
    check_forward(lambda x: ism.zeros(ism.shape(x)) + 1.0, [A.astype(np.float32)], lambda x: np.ones_like(x))
    idx = np.array([0, 2, 1], np.int32)
    check_forward(lambda i: ism.one_hot(i, 4), [idx], lambda i: np.eye(4, dtype=np.float32)[i])
    with ism.Graph().as_default():
        assert ism.ones((2, 3)).shape == (2, 3)


@pytest.mark.parametrize("build,msg", [
    (lambda x: ism.reshape(x, (5, -1)), "cannot reshape"),
    (lambda x: ism.transpose(x, (0, 0, 1)), "not a permutation"),
    (lambda x: ism.concat([x, ism.constant(np.zeros((2, 2), np.float32))], 0), "differ in rank"),
    (lambda x: ism.split(x, [1, 1], axis=1), "do not add up"),
    (lambda x: ism.squeeze(x, 1), "cannot squeeze"),
    (lambda x: x[0, 0, 0, 0], "too many indices"),
])
def test_errors_at_construction(build, msg):
    with ism.Graph().as_default():
        x = ism.placeholder("float32", (2, 3, 4), name="x")
        with pytest.raises(ism.ShapeError, match=msg):
            build(x)
