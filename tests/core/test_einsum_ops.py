"""einsum (core/ops/einsum.py) against numpy.einsum, gradients against finite differences."""
import numpy as np
import pytest

import isthmus as ism

from .opcheck import check_forward, check_gradients

rng = np.random.default_rng(10)
A, B, C = rng.standard_normal((2, 3)), rng.standard_normal((3, 4)), rng.standard_normal((2, 3, 4))


def _case(eq, *xs):
    return (eq, lambda *t: ism.einsum(eq, *t), list(xs), lambda *a: np.einsum(eq, *a), True)


CASES = [
    _case("ij,jk->ik", A, B),
    _case("ij,jk", A, B),                       # implicit output
    _case("bij,bjk->bik", C, rng.standard_normal((2, 4, 3))),
    _case("ij->", A),                            # a letter summed away only in its operand
    _case("ij->ji", A),
    _case("i,i->", A[0], A[1]),
    _case("...j,jk->...k", C, rng.standard_normal((4, 5))),
    _case("bij,j->bi", C[:, :, :3], rng.standard_normal(3)),
    _case("ij,ij,ij->i", A, A * 2, A - 1),
]
NO_GRADIENT = set()


@pytest.mark.parametrize("name,build,inputs,ref,diff", CASES, ids=[c[0] for c in CASES])
def test_forward(name, build, inputs, ref, diff):
    check_forward(build, inputs, ref, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("name,build,inputs,ref,diff", CASES, ids=[c[0] for c in CASES])
def test_gradient(name, build, inputs, ref, diff):
    check_gradients(build, inputs)


def test_diagonal_forward_and_refused_gradient():
    x = rng.standard_normal((3, 3))
    with ism.Graph().as_default():
        p = ism.placeholder("float64", (3, 3))
        y = ism.einsum("ii->i", p)
        np.testing.assert_allclose(ism.Session().run(y, {p: x}), np.diag(x))
        with pytest.raises(ism.GraphError, match="repeated index"):
            ism.gradients(ism.reduce_sum(y), [p])


def test_mismatched_sizes_are_refused_at_construction():
    with ism.Graph().as_default():
        with pytest.raises(ism.ShapeError, match="'j'"):
            ism.einsum("ij,jk->ik", ism.placeholder("float32", (2, 3)), ism.placeholder("float32", (4, 5)))
