"""Array ops (core/ops/array.py): forward against numpy with static and unknown dims, gradients
against finite differences and across unknown dims, views, and shape errors at construction."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core.executor import KernelContext, SessionState

from .opcheck import check_forward, check_gradients, run_op

rng = np.random.default_rng(0)
A = rng.standard_normal((2, 3, 4))
B = rng.standard_normal((2, 2, 4))
C = rng.standard_normal((3, 1, 2))
IDX = np.array([[0, 2], [3, 1], [5, -1]], np.int32)

# name, builder, inputs, numpy reference, differentiable
TABLE = [
    ("reshape", lambda x: ism.reshape(x, (6, -1)), [A], lambda x: x.reshape(6, -1), True),
    ("reshape_none_first", lambda x: ism.reshape(x, (None, 2)), [A], lambda x: x.reshape(-1, 2), True),
    ("flatten", ism.flatten, [A], lambda x: x.reshape(2, -1), True),
    ("flatten_axis2", lambda x: ism.flatten(x, 2), [A], lambda x: x.reshape(6, 4), True),
    ("transpose", lambda x: ism.transpose(x, (2, 0, 1)), [A], lambda x: x.transpose(2, 0, 1), True),
    ("transpose_default", ism.transpose, [A], lambda x: x.T, True),
    ("concat", lambda a, b: ism.concat([a, b], axis=1), [A, B[:, :2]], lambda a, b: np.concatenate([a, b], 1), True),
    ("concat3_neg_axis", lambda a, b, c: ism.concat([a, b, c], -1), [A[:, :2], B, B[:, :, :1]],
     lambda a, b, c: np.concatenate([a, b, c], -1), True),
    ("split_sizes", lambda x: ism.split(x, [1, 3], axis=2)[1] * 2.0, [A], lambda x: x[:, :, 1:] * 2, True),
    ("split_neg1", lambda x: ism.split(x, [1, -1], axis=1), [A], lambda x: [x[:, :1], x[:, 1:]], True),
    ("split_even", lambda x: ism.split(x, 2, axis=2)[0] + ism.split(x, 2, axis=2)[1], [A],
     lambda x: x[:, :, :2] + x[:, :, 2:], True),
    ("split_one_piece_used", lambda x: ism.split(x, 3, axis=1)[2], [A], lambda x: x[:, 2:3], True),
    ("getitem", lambda x: x[1, ::2, 1:3], [A], lambda x: x[1, ::2, 1:3], True),
    ("getitem_neg_step", lambda x: x[:, ::-1, None, -1], [A], lambda x: x[:, ::-1, None, -1], True),
    ("getitem_ellipsis", lambda x: x[..., 2], [A], lambda x: x[..., 2], True),
    ("getitem_newaxis_ellipsis", lambda x: x[None, ..., 1:, None], [A], lambda x: x[None, ..., 1:, None], True),
    ("getitem_scalar", lambda x: x[1, -1, 2] * 3.0, [A], lambda x: np.asarray(x[1, -1, 2] * 3), True),
    ("getitem_clipped_stop", lambda x: x[:, 1:10, -9:2], [A], lambda x: x[:, 1:10, -9:2], True),
    ("slice", lambda x: ism.slice(x, (0, 1, 1), (-1, 2, 2)), [A], lambda x: x[:, 1:3, 1:3], True),
    ("slice_to_end", lambda x: ism.slice(x, (1, 0, 3), (1, -1, -1)), [A], lambda x: x[1:2, :, 3:], True),
    ("pad", lambda x: ism.pad(x, ((0, 0), (1, 2), (0, 1)), constant_value=1.5), [A],
     lambda x: np.pad(x, ((0, 0), (1, 2), (0, 1)), constant_values=1.5), True),
    ("pad_reflect", lambda x: ism.pad(x, ((0, 0), (1, 2), (3, 1)), "reflect"), [A],
     lambda x: np.pad(x, ((0, 0), (1, 2), (3, 1)), "reflect"), True),
    ("pad_edge", lambda x: ism.pad(x, ((1, 0), (0, 0), (2, 3)), "edge"), [A],
     lambda x: np.pad(x, ((1, 0), (0, 0), (2, 3)), "edge"), True),
    ("squeeze", lambda x: ism.squeeze(x, 1), [C], lambda x: x[:, 0], True),
    ("squeeze_two", lambda x: ism.squeeze(x, (0, -2)), [C[:1]], lambda x: x.reshape(2), True),
    ("expand_dims", lambda x: ism.expand_dims(x, -1), [A], lambda x: x[..., None], True),
    ("unsqueeze_two", lambda x: ism.unsqueeze(x, (0, 3)), [A], lambda x: x[None, :, :, None], True),
    ("tile", lambda x: ism.tile(x, (2, 1, 3)), [A], lambda x: np.tile(x, (2, 1, 3)), True),
    ("broadcast_to", lambda x: ism.broadcast_to(x, (2, 3, 2)), [C[:, 0, :1]], lambda x: np.broadcast_to(x, (2, 3, 2)), True),
    ("zeros_of_shape", lambda x: ism.zeros(ism.shape(x), x.dtype) + x, [A], lambda x: x, True),
    ("shape", lambda x: ism.shape(x), [A], lambda x: np.array(x.shape, np.int32), False),
    ("shape_int64", lambda x: ism.shape(x, "int64"), [C], lambda x: np.array(x.shape, np.int64), False),
    ("one_hot", lambda i: ism.one_hot(i, 4), [IDX], lambda i: (i[..., None] == np.arange(4)).astype(np.float32), False),
    ("one_hot_f64", lambda i: ism.one_hot(i, 6, "float64"), [IDX[0]], lambda i: np.eye(6)[i], False),
]
DIFF = [c for c in TABLE if c[4]]
CASES = [c[:4] for c in DIFF]  # (name, build, inputs, ref): the shape test_gradient_coverage reads


@pytest.mark.parametrize("name,build,inputs,ref,diff", TABLE, ids=[c[0] for c in TABLE])
def test_forward(name, build, inputs, ref, diff):
    check_forward(build, inputs, ref, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name,build,inputs,ref,diff", DIFF, ids=[c[0] for c in DIFF])
def test_forward_float32(name, build, inputs, ref, diff):
    ins = [a.astype(np.float32) for a in inputs]
    check_forward(build, ins, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name,build,inputs,ref,diff", DIFF, ids=[c[0] for c in DIFF])
def test_gradient(name, build, inputs, ref, diff):
    def one(*xs):  # multi-output builders: differentiate the sum of their outputs
        y = build(*xs)
        return ism.add_n(y) if isinstance(y, list) else y
    check_gradients(one, inputs)


def _grads(build, inputs, static: bool):
    g = ism.Graph(seed=0)
    with g.as_default():
        phs = [ism.placeholder(a.dtype, a.shape if static else (None,) * a.ndim) for a in inputs]
        y = build(*phs)
        y = ism.add_n(y) if isinstance(y, list) else y
        grads = ism.gradients(y * y, phs)
        g.verify()
        return ism.Session(g).run(grads, dict(zip(phs, inputs)))


@pytest.mark.parametrize("name,build,inputs,ref,diff", DIFF, ids=[c[0] for c in DIFF])
def test_gradient_with_unknown_dims(name, build, inputs, ref, diff):
    """The backward graph over unknown dims (ReshapeLike, SplitLike, ...) gives the static answer."""
    for got, want in zip(_grads(build, inputs, False), _grads(build, inputs, True)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def _kernel_output(build, *inputs):
    g = ism.Graph()
    with g.as_default():
        out = build(*[ism.placeholder(a.dtype, a.shape) for a in inputs])
    node = (out[0] if isinstance(out, list) else out).node
    result = node.opdef.kernel(node, KernelContext(np, SessionState()))(*inputs)
    return result[0] if isinstance(result, tuple) else result


VIEW_CASES = [
    ("reshape", lambda x: ism.reshape(x, (4, -1)), A), ("transpose", ism.transpose, A),
    ("getitem", lambda x: x[1, ::-1], A), ("getitem_scalar", lambda x: x[0, 0, 0], A),
    ("slice", lambda x: ism.slice(x, (0, 1, 0), (2, 2, -1)), A), ("split", lambda x: ism.split(x, [1, 2], 1), A),
    ("flatten", ism.flatten, A), ("expand_dims", lambda x: ism.expand_dims(x, 1), A),
    ("squeeze", lambda x: ism.squeeze(x, 1), C), ("broadcast_to", lambda x: ism.broadcast_to(x, (5, 2, 3, 4)), A),
]


@pytest.mark.parametrize("name,build,x", VIEW_CASES, ids=[c[0] for c in VIEW_CASES])
def test_layout_kernels_return_views(name, build, x):
    y = _kernel_output(build, x)
    assert isinstance(y, np.ndarray) and np.shares_memory(y, x)


def test_scalar_results_are_arrays():
    y = _kernel_output(lambda x: x[1, 2, 3], A)
    assert isinstance(y, np.ndarray) and y.shape == () and y == A[1, 2, 3]


def test_static_shapes_flow_through_shape_tensors():
    with ism.Graph().as_default():
        x = ism.placeholder("float32", (None, 3, 4))
        assert ism.zeros(ism.shape(x)).shape == (None, 3, 4)
        s = ism.shape(x)
        assert ism.ones(ism.concat([s[1:], ism.expand_dims(s[0], 0), [7]], 0)).shape == (3, 4, None, 7)
        assert ism.reshape(ism.placeholder("float32", (12,)), ism.shape(x)[1:]).shape == (3, 4)
        assert ism.fill(ism.placeholder("int32", (2,)), 1.0).shape == (None, None)
        assert ism.ones((2, 3), "int32").shape == (2, 3)


def test_fill_runs_with_run_time_shape():
    (got,), _ = run_op(lambda s: ism.fill(s, 2.5, "float64"), [np.array([2, 0, 3], np.int32)])
    np.testing.assert_array_equal(got, np.full((2, 0, 3), 2.5))


def test_iteration_unpacks_a_static_first_dim():
    got, _ = run_op(lambda x: [t * 2.0 for t in x], [A])
    np.testing.assert_array_equal(got, [A[0] * 2, A[1] * 2])
    with ism.Graph().as_default():
        with pytest.raises(TypeError, match="first dimension"):
            list(ism.placeholder("float32", (None, 2)))


@pytest.mark.parametrize("build,msg", [
    (lambda x: ism.reshape(x, (5, -1), name="bad"), r"node 'bad' \(Reshape\): cannot reshape \[2,3,4\]"),
    (lambda x: ism.reshape(x, (-1, -1), name="bad"), r"node 'bad' \(Reshape\).*more than one -1"),
    (lambda x: ism.transpose(x, (0, 0, 1), name="bad"), r"node 'bad' \(Transpose\).*not a permutation"),
    (lambda x: ism.concat([x, ism.zeros((2, 3))], 0, name="bad"), r"node 'bad' \(Concat\).*differ in rank"),
    (lambda x: ism.concat([x, ism.zeros((2, 4, 4))], 2, name="bad"), r"node 'bad' \(Concat\).*off axis 2"),
    (lambda x: ism.concat([x, ism.zeros((2, 3, 4), "float64")], 0, name="bad"), r"'bad' \(Concat\).*dtype"),
    (lambda x: ism.split(x, [1, 1], axis=1, name="bad"), r"node 'bad' \(Split\).*do not add up"),
    (lambda x: ism.split(x, 3, axis=2, name="bad"), r"node 'bad' \(Split\).*does not split evenly"),
    (lambda x: ism.squeeze(x, 1, name="bad"), r"node 'bad' \(Squeeze\): cannot squeeze dim 1"),
    (lambda x: ism.pad(x, ((0, 0), (3, 0), (0, 0)), "reflect", name="bad"), r"node 'bad' \(Pad\).*reflect"),
    (lambda x: ism.pad(x, ((0, 0), (-1, 0), (0, 0)), name="bad"), r"node 'bad' \(Pad\).*negative padding"),
    (lambda x: ism.tile(x, (2, 1), name="bad"), r"node 'bad' \(Tile\).*2 multiples for rank 3"),
    (lambda x: ism.broadcast_to(x, (3, 4), name="bad"), r"node 'bad' \(BroadcastTo\).*cannot broadcast"),
    (lambda x: ism.broadcast_to(x, (5, 3, 4), name="bad"), r"node 'bad' \(BroadcastTo\).*cannot broadcast"),
    (lambda x: x[0, 5], r"node 'StridedSlice' \(StridedSlice\).*index 5 out of range"),
    (lambda x: x[::0], r"slice step of dim 0 is zero"),
    (lambda x: x[0, 0, 0, 0], r"too many indices for 'x:0' \[2,3,4\]"),
    (lambda x: ism.slice(x, (0, 2, 0), (1, 2, 1)), r"'x:0'.*axis 1 begin 2 size 2 overruns dim 3"),
    (lambda x: ism.slice(x, (0, 0), (1, 1)), r"2 begins and 2 sizes for rank 3"),
    (lambda x: ism.slice(x, (0, -1, 0), (1, 1, 1)), r"need begin >= 0"),
    (lambda x: ism.one_hot(x, 3, name="bad"), r"node 'bad' \(OneHot\).*must be integers"),
    (lambda x: ism.fill(ism.constant([2, -1]), 0.0, name="bad"), r"node 'bad' \(Fill\).*negative"),
])
def test_errors_at_construction(build, msg):
    with ism.Graph().as_default():
        x = ism.placeholder("float32", (2, 3, 4), name="x")
        with pytest.raises(ism.ShapeError, match=msg):
            build(x)


def test_unsupported_indices_are_type_errors():
    with ism.Graph().as_default():
        x = ism.placeholder("float32", (2, 3), name="x")
        for key in (True, [0, 1], x, slice(x, None)):
            with pytest.raises(TypeError):
                x[key]
        with pytest.raises(IndexError, match="single ellipsis"):
            x[..., 0, ...]


def test_fetched_views_of_variables_do_not_alias_them():
    g = ism.Graph()
    with g.as_default():
        v = ism.Variable(np.zeros(2, np.float32))
        views = [ism.reshape(v, (1, 2)), ism.expand_dims(v, 0), ism.flatten(ism.reshape(v, (2, 1))), ism.split(v, 2)[0]]
        inc = v.assign_add(np.ones(2, np.float32))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
        got = sess.run(views)
        sess.run(inc)
    for value in got:
        assert not value.any()


def test_reshape_to_a_run_time_shape():
    from .opcheck import check_forward, check_gradients
    x = np.arange(12.0).reshape(3, 4)
    check_forward(lambda a: ism.reshape_to(a, ism.shape(a)[::-1]), [x], lambda a: a.reshape(4, 3))
    check_gradients(lambda a: ism.reshape_to(a, ism.constant(np.array([2, -1], np.int32))), [x])
    g = ism.Graph()
    with g.as_default():
        a = ism.placeholder("float32", (2, 3, 4))
        s = ism.placeholder("int64", (2,))
        y = ism.reshape_to(a, s, copy_zero=True)  # ONNX: 0 keeps the input's dim
        got = ism.Session(g).run(y, {a: np.zeros((2, 3, 4), np.float32), s: np.array([0, -1])})
    assert got.shape == (2, 12) and y.shape == (None, None)


def test_run_time_slices_and_axes():
    from .opcheck import check_forward, check_gradients
    x = np.arange(24.0).reshape(2, 3, 4)
    c = lambda v: ism.constant(np.array(v, np.int64))  # noqa: E731
    check_forward(lambda a: ism.slice_dynamic(a, c([1, -3]), c([3, 100]), c([2, 1]), c([1, 1])), [x],
                  lambda a: a[:, -3:100, 1:3])
    check_forward(lambda a: ism.slice_dynamic(a, c([3]), c([-100]), c([2]), c([-2])), [x], lambda a: a[:, :, 3::-2])
    check_gradients(lambda a: ism.slice_dynamic(a, c([0, 1]), c([1, 3]), c([0, 2])), [x])
    check_forward(lambda a: ism.squeeze_dynamic(ism.expand_dynamic(a, c([0, -1])), c([0])), [x],
                  lambda a: a[..., None])
    check_gradients(lambda a: ism.squeeze_dynamic(ism.expand_dynamic(a, c([1])), c([1])) * 2.0, [x])


def test_split_by_run_time_sizes():
    from .opcheck import check_forward, check_gradients
    x = np.arange(12.0).reshape(2, 6)
    sz = lambda: ism.constant(np.array([1, 3, 2], np.int64))  # noqa: E731
    check_forward(lambda a: ism.split_sizes(a, sz(), 3, axis=1), [x], lambda a: [a[:, :1], a[:, 1:4], a[:, 4:]])
    check_gradients(lambda a: ism.split_sizes(a, sz(), 3, axis=1)[1] * 3.0, [x])
