"""Export of the ops added for issue 20: onnxruntime runs the exported model and gives what the isthmus
executor gives on the same inputs."""
import numpy as np
import onnxruntime as ort
import pytest

import isthmus as ism
from isthmus.converters.onnx_export import ExportError, to_onnx

rng = np.random.default_rng(7)
X = rng.standard_normal((2, 3, 4)).astype(np.float32)
X4 = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
IDX = np.array([[0, 2, 1, 1], [2, 0, 1, 0], [1, 1, 0, 2]])


def _run_both(build, feeds):
    g = ism.Graph(seed=0)
    with g.as_default():
        phs = [ism.placeholder(v.dtype, (None,) + v.shape[1:], name=f"in{i}") for i, v in enumerate(feeds)]
        out = build(*phs)
        outs = list(out) if isinstance(out, tuple) else [out]
        sess = ism.Session(g)
        want = sess.run(outs, dict(zip(phs, feeds)))
    model = to_onnx(g, outs, optimize=False)
    ort_sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = ort_sess.run(None, {p.node.name: v for p, v in zip(phs, feeds)})
    return got, want


CASES = [
    ("hard_sigmoid", lambda x: ism.hard_sigmoid(x, 0.3, 0.6), [X]),
    ("hard_swish", lambda x: ism.hard_swish(x * 4.0), [X]),
    ("prelu", lambda x: ism.prelu(x, ism.constant(np.array([0.1, 0.2, 0.3, 0.4], np.float32))), [X]),
    ("elu", lambda x: ism.elu(x, 0.5), [X]),
    ("selu", ism.selu, [X]),
    ("celu", lambda x: ism.celu(x, 2.0), [X]),
    ("softplus", ism.softplus, [X]),
    ("softsign", ism.softsign, [X]),
    ("thresholded_relu", lambda x: ism.thresholded_relu(x, 0.2), [X]),
    ("round_sin_cos", lambda x: ism.round(ism.sin(x) * 3.0) + ism.cos(x), [X]),
    ("tan_atan", lambda x: ism.tan(x * 0.5) + ism.atan(x), [X]),
    ("hyperbolic_and_inverses", lambda x: ism.sinh(x) + ism.cosh(x) + ism.asinh(x) + ism.acosh(ism.abs(x) + 1.5)
     + ism.asin(x * 0.3) + ism.acos(x * 0.3) + ism.atanh(x * 0.3), [X]),
    ("isnan_isinf", lambda x: ism.logical_or(ism.isnan(x), ism.isinf(x, detect_negative=False)),
     [np.array([[1.0, np.nan, np.inf, -np.inf]], np.float32)]),
    ("fmod", lambda x: ism.fmod(x, ism.constant(np.float32(0.7))), [X]),
    ("mod_float", lambda x: ism.mod(x, ism.constant(np.float32(0.7))), [X]),
    ("mod_int", lambda x: ism.mod(x, ism.constant(np.int64(3))), [np.array([[-7, -3, 0, 5, 8]], np.int64)]),
    ("tile", lambda x: ism.tile(x, (1, 2, 3)), [X]),
    ("gather_elements", lambda x: ism.gather_elements(x[0], ism.constant(IDX), 0), [X]),
    ("scatter_elements_add", lambda x: ism.scatter_elements(x[0], ism.constant(IDX), x[1] * 2.0, 0, "add"), [X]),
    ("gather_nd", lambda x: ism.gather_nd(x, ism.constant(np.array([[1, 2], [0, 0]])), 0), [X]),
    ("scatter_nd", lambda x: ism.scatter_nd(x[0], ism.constant(np.array([[2], [0]])), x[1][:2] + 5.0), [X]),
    ("nonzero", lambda x: ism.nonzero(ism.greater(x, 0.3)), [X]),
    ("trilu", lambda x: ism.trilu(x, False, 1), [X]),
    ("cumsum", lambda x: ism.cumsum(x, 2, True, True), [X]),
    ("top_k", lambda x: ism.top_k(x, 2, 1, largest=False), [X]),
    ("reduce_prod", lambda x: ism.reduce_prod(x, (0, 2), True), [X]),
    ("size", ism.size, [X]),
    ("instance_norm", lambda x: ism.instance_norm(x, np.full(3, 1.5, np.float32), np.ones(3, np.float32)), [X]),
    ("group_norm", lambda x: ism.group_norm(x, np.arange(3, dtype=np.float32), np.ones(3, np.float32), 3), [X]),
    ("rms_norm", lambda x: ism.rms_norm(x, np.full(4, 0.5, np.float32)), [X]),
    ("lrn", lambda x: ism.lrn(x, 3, 0.2), [X]),
    ("conv_transpose", lambda x: ism.conv_transpose2d(x, rng.standard_normal((3, 4, 3, 2)).astype(np.float32), 2,
                                                      ((1, 0), (0, 1)), 1, 1, (1, 0)), [X4]),
    ("conv_transpose_groups", lambda x: ism.conv_transpose2d(x[:, :2], rng.standard_normal((2, 3, 2, 2)).astype(np.float32),
                                                             1, ((0, 0), (0, 0)), 2, 2), [X4]),
    ("quantize_per_axis", lambda x: ism.quantize_linear(x, np.array([0.01, 0.02, 0.03], np.float32),
                                                        np.array([0, 5, -5], np.int8), axis=1), [X]),
    ("einsum", lambda x: ism.einsum("bij,bkj->bik", x, x * 2.0), [X]),
    ("rotary_embedding", lambda x: ism.rotary_embedding(x, np.cos(np.arange(8, dtype=np.float32).reshape(4, 2)),
                                                        np.sin(np.arange(8, dtype=np.float32).reshape(4, 2)),
                                                        ism.constant(np.array([[0, 1, 3], [2, 2, 0]])), True, 0, 1),
     [X]),
    ("qdq_uint8", lambda x: ism.dequantize_linear(ism.quantize_linear(x, np.float32(0.02), np.uint8(128)),
                                                  np.float32(0.02), np.uint8(128)), [X]),
]


@pytest.mark.parametrize("name,build,feeds", CASES, ids=[c[0] for c in CASES])
def test_export_matches_onnxruntime(name, build, feeds):
    got, want = _run_both(build, feeds)
    assert len(got) == len(want)
    for gv, wv in zip(got, want):
        assert gv.dtype == np.asarray(wv).dtype
        np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-6)


def test_run_time_parameters_are_exported_as_inputs():
    x = rng.standard_normal((3, 6)).astype(np.float32)
    got, want = _run_both(lambda a, k: ism.top_k(a, ism.reshape(k, ()), 1), [x, np.array([4], np.int64)])
    np.testing.assert_allclose(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_unexportable_reduction_is_named():
    with ism.Graph().as_default() as g:
        d = ism.placeholder("float32", (3,), name="d")
        y = ism.scatter_elements(d, ism.constant(np.array([0, 0])), ism.constant(np.ones(2, np.float32)), 0, "max")
        with pytest.raises(ExportError, match="ScatterElements.*opset 18"):
            to_onnx(g, [y], optimize=False)
