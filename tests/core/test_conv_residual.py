"""FusedConv2DAdd: the fusion pass turns a residual block's Conv2D -> BiasAdd -> Add(r) (-> Relu/Relu6)
into one node (either Add operand order), leaves it alone where the pieces are used elsewhere or r
broadcasts, and the fused kernel's paths and gradient match a float64 numpy reference and finite
differences."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core.executor import prune
from isthmus.core.ops import conv as conv_ops
from isthmus.core.ops.base import make
from isthmus.core.passes import SESSION_PASSES, optimize

from .opcheck import check_gradients
from .test_conv_forward import ACTS, ref_conv


def _rewrite(g, fetches, feeds):
    nodes = prune([f.node for f in fetches], set(feeds))
    rw = optimize(g, nodes, list(fetches), list(feeds), SESSION_PASSES)
    rw.graph.verify()
    return rw


def test_default_passes_leave_the_residual_add_for_the_edge_and_the_exporters():
    g, x, r, y, feed, _ = _residual_graph("relu", False)
    rw = optimize(g, prune([y.node], {x, r}), [y], [x, r])
    assert sorted(n.op for n in rw.graph.nodes if n.op not in ("Const", "Placeholder")) == ["Add", "FusedConv2D", "Relu"]


def _residual_graph(act, r_first, n=2, c=8, o=8, hw=6, r_shape=None, extra_use=False):
    rng = np.random.default_rng(3)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (n, c, hw, hw), name="x")
        r = ism.placeholder("float32", r_shape or (n, o, hw, hw), name="r")
        w = ism.constant(rng.standard_normal((o, c, 3, 3)).astype(np.float32))
        b = ism.constant(rng.standard_normal(o).astype(np.float32))
        z = ism.bias_add(ism.conv2d(x, w, padding="SAME"), b, axis=1)
        s = r + z if r_first else z + r
        y = getattr(ism, act)(s) if act else s
        if extra_use:
            y = y + ism.exp(z)
    feed = {x: rng.standard_normal((n, c, hw, hw)).astype(np.float32),
            r: rng.standard_normal(r_shape or (n, o, hw, hw)).astype(np.float32)}
    return g, x, r, y, feed, (w.node.attrs["value"], b.node.attrs["value"])


@pytest.mark.parametrize("r_first", [False, True])
@pytest.mark.parametrize("act", ["relu", "relu6", None])
def test_residual_add_fuses_into_the_convolution(act, r_first):
    g, x, r, y, feed, (w, b) = _residual_graph(act, r_first)
    rw = _rewrite(g, [y], [x, r])
    ops = [n.op for n in rw.graph.nodes if n.op not in ("Const", "Placeholder")]
    assert ops == ["FusedConv2DAdd"], ops
    fused = [n for n in rw.graph.nodes if n.op == "FusedConv2DAdd"][0]
    assert fused.attrs["activation"] == (act or "none")
    assert fused.inputs[3].node.name == "r"
    got = ism.Session(g).run(y, feed)
    want = ref_conv(feed[x], w, (1, 1), ((1, 1), (1, 1)), (1, 1), 1) + b.reshape(1, -1, 1, 1) + feed[r]
    np.testing.assert_allclose(got, ACTS[act or "none"](want), rtol=2e-5, atol=2e-5)


def test_tanh_after_the_residual_stays_a_node():
    g, x, r, y, feed, _ = _residual_graph("tanh", False)
    rw = _rewrite(g, [y], [x, r])
    ops = sorted(n.op for n in rw.graph.nodes if n.op not in ("Const", "Placeholder"))
    assert ops == ["FusedConv2DAdd", "Tanh"], ops
    np.testing.assert_allclose(ism.Session(g).run(y, feed), ism.Session(g, optimize=False).run(y, feed),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["broadcast", "extra_use"])
def test_no_residual_fusion_when_r_broadcasts_or_the_sum_is_used_elsewhere(case):
    kw = {"r_shape": (1, 8, 6, 6)} if case == "broadcast" else {"extra_use": True}
    g, x, r, y, feed, _ = _residual_graph("relu", False, **kw)
    rw = _rewrite(g, [y], [x, r])
    assert not any(n.op == "FusedConv2DAdd" for n in rw.graph.nodes)
    np.testing.assert_allclose(ism.Session(g).run(y, feed), ism.Session(g, optimize=False).run(y, feed),
                               rtol=1e-5, atol=1e-6)


def test_two_convolutions_into_one_add_fuse_once():
    """A projection shortcut: both Add operands are convolutions; one becomes the other's addend."""
    rng = np.random.default_rng(4)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (2, 4, 8, 8), name="x")
        branch = [ism.bias_add(ism.conv2d(x, ism.constant(rng.standard_normal((8, 4, k, k)).astype(np.float32)),
                                          padding="SAME"), ism.constant(rng.standard_normal(8).astype(np.float32)),
                               axis=1) for k in (1, 3)]
        y = ism.relu(branch[0] + branch[1])
    rw = _rewrite(g, [y], [x])
    ops = sorted(n.op for n in rw.graph.nodes if n.op not in ("Const", "Placeholder"))
    assert ops == ["FusedConv2D", "FusedConv2DAdd"], ops
    xv = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(ism.Session(g).run(y, {x: xv}), ism.Session(g, optimize=False).run(y, {x: xv}),
                               rtol=1e-5, atol=1e-5)


def _fused(x, w, b, r, act, strides=1, padding="SAME", groups=1):
    node = ism.conv2d(x, w, strides=strides, padding=padding, groups=groups).node
    attrs = {k: node.attrs[k] for k in ("strides", "dilations", "pads", "groups")}
    return make("FusedConv2DAdd", (x, w, b, r), {**attrs, "activation": act}).outputs[0]


@pytest.mark.parametrize("act", ["none", "relu", "relu6"])
def test_fused_conv_add_gradient_matches_finite_differences(act):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 5, 5))
    w = rng.standard_normal((4, 3, 3, 3)) * 0.5
    b = rng.standard_normal(4)
    r = rng.standard_normal((2, 4, 3, 3)) * 2
    check_gradients(lambda x_, w_, b_, r_: _fused(x_, w_, b_, r_, act, strides=2, padding="SAME") * 1.0,
                    [x, w, b, r])


# (batch, channels in, out, plane, kernel, strides, groups): the conv paths a FusedConv2DAdd can take
PATH_CASES = [
    (1, 16, 32, 8, 1, 1, 1),     # batch-1 1x1: packed GEMM
    (4, 16, 64, 8, 1, 1, 1),     # 1x1 expansion at a batch: packed per image
    (4, 64, 16, 8, 1, 1, 1),     # 1x1 projection at a batch: BLAS + finish
    (2, 32, 32, 2, 1, 1, 1),     # few pixels: pixel rows
    (1, 8, 16, 9, 3, 1, 1),      # batch-1 3x3: one image
    (3, 16, 16, 12, 3, 1, 1),    # 3x3 at a batch: row taps / per image
    (2, 8, 16, 9, 1, 2, 1),      # strided 1x1 (a projection shortcut)
    (2, 8, 8, 7, 3, 1, 8),       # depthwise
    (2, 8, 8, 7, 3, 1, 2),       # grouped
    (2, 6, 10, 7, 3, 2, 1),      # O not a multiple of 4, strided
]


@pytest.mark.parametrize("jit", ["compiled", "numpy"])
@pytest.mark.parametrize("act", ["none", "relu", "relu6"])
@pytest.mark.parametrize("n,c,o,hw,k,s,groups", PATH_CASES)
def test_fused_conv_add_paths_against_reference(n, c, o, hw, k, s, groups, act, jit, monkeypatch):
    """Every path but depthwise adds the addend where it finishes the output (no pass of its own)."""
    _check_path(monkeypatch, (n, c, o, hw, k, s, groups), act, jit, fed=False)


@pytest.mark.parametrize("jit", ["compiled", "numpy"])
@pytest.mark.parametrize("n,c,o,hw,k,s,groups", PATH_CASES + [(2, 32, 16, 8, 3, 1, 1)])
def test_fused_conv_add_with_fed_weights(n, c, o, hw, k, s, groups, jit, monkeypatch):
    """Weights fed at run time (training): no packed kernels; BLAS, the row taps' finisher, the
    per-image finish."""
    _check_path(monkeypatch, (n, c, o, hw, k, s, groups), "relu", jit, fed=True)


def _check_path(monkeypatch, case, act, jit, fed):
    n, c, o, hw, k, s, groups = case
    monkeypatch.setenv("ISTHMUS_JIT", "1" if jit == "compiled" else "0")
    after = []
    original = conv_ops._AddAfter.__call__
    monkeypatch.setattr(conv_ops._AddAfter, "__call__", lambda self, *a: after.append(1) or original(self, *a))
    images, images_original = [], conv_ops._images_compiled
    monkeypatch.setattr(conv_ops, "_images_compiled", lambda *a: images.append(1) or images_original(*a))
    rng = np.random.default_rng(6)
    xv = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    wv = rng.standard_normal((o, c // groups, k, k)).astype(np.float32) * 0.3
    bv = rng.standard_normal(o).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", xv.shape, name="x")
        wt = ism.placeholder("float32", wv.shape, name="w") if fed else ism.constant(wv)
        y0 = ism.conv2d(x, wt, strides=s, padding="SAME", groups=groups)
        rv = (rng.standard_normal(tuple(y0.shape)) * 3).astype(np.float32)
        r = ism.placeholder("float32", rv.shape, name="r")
        y = _fused(x, wt, ism.constant(bv), r, act, strides=s, groups=groups)
    feed = {x: xv, r: rv, **({wt: wv} if fed else {})}
    r_before = rv.copy()
    pads = y0.node.attrs["pads"]
    for _ in range(2):  # the second run reuses what the first cached (packed weights, plans)
        got = ism.Session(g, optimize=False).run(y, feed)
        want = ref_conv(xv, wv, (s, s), pads, (1, 1), groups) + bv.reshape(1, -1, 1, 1) + rv
        np.testing.assert_allclose(got, ACTS[act](want), rtol=2e-5, atol=3e-5)
    np.testing.assert_array_equal(rv, r_before)  # the addend is read, never written
    # only depthwise and jit.conv_images (fed weights at a batch) add the addend in a pass of their own
    assert bool(after) == (groups == c or bool(images))


def test_fused_conv_add_on_the_stand_in_gpu_matches_the_host():
    """GPU devices run core.gpu_kernels' FusedConv2DAdd (the stand-in runs the same code)."""
    from isthmus.core import registry
    from isthmus.core.gpu_kernels import conv as gpu_conv
    g, x, r, y, feed, _ = _residual_graph("relu6", False)
    got = ism.Session(g, device="gpu", gpu="simulated").run(y, feed)
    assert getattr(registry.get("FusedConv2DAdd").kernel, "gpu", None) is gpu_conv.KERNELS["FusedConv2DAdd"]
    np.testing.assert_allclose(got, ism.Session(g, optimize=False).run(y, feed), rtol=1e-5, atol=1e-5)
