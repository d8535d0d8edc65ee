"""Det (core/ops/det.py) against numpy.linalg.det, its gradient against finite differences."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core.ops.det import det

from .opcheck import check_forward, check_gradients

rng = np.random.default_rng(12)

CASES = [
    ("det_2x2", det, [rng.standard_normal((2, 2))], np.linalg.det, True),
    ("det_batched_3x3", det, [rng.standard_normal((2, 4, 3, 3)) + 2 * np.eye(3)], np.linalg.det, True),
]
NO_GRADIENT = set()


@pytest.mark.parametrize("name,build,inputs,ref,diff", CASES, ids=[c[0] for c in CASES])
def test_forward(name, build, inputs, ref, diff):
    check_forward(build, inputs, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,build,inputs,ref,diff", CASES, ids=[c[0] for c in CASES])
def test_gradient(name, build, inputs, ref, diff):
    check_gradients(build, inputs)


def test_non_square_and_integer_inputs_are_refused_when_built():
    with ism.Graph().as_default():
        with pytest.raises(ism.ShapeError, match="square"):
            det(ism.placeholder("float32", (2, 3)))
        with pytest.raises(ism.ShapeError, match="float"):
            det(ism.placeholder("int32", (2, 2)))
