"""Out-of-range class ids on a GPU: an error naming the node where the labels are known on the host.

The GPU's sparse cross-entropy kernel does not sync to check its labels (an out-of-range one gives
a NaN loss, as TensorFlow's GPU kernel does); the copy that uploads fed or host-made labels checks
them on the host instead, and a constant's value is checked when the kernel is prepared. Runs on
the stand-in GPU in CI and on a real one under `pytest -m gpu`.
"""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core import gpu
from isthmus.core.passes.copies import copies_of, insert_copies

BACKENDS = [pytest.param("simulated", id="sim"),
            pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
                not gpu.gpu_available(), reason=f"no GPU: {gpu.unavailable_reason()}")])]

rng = np.random.default_rng(0)
LOGITS = rng.standard_normal((4, 3)).astype(np.float32)


def np_xent(labels, logits):
    z = logits - logits.max(1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(1, keepdims=True))
    return -lp[np.arange(len(labels)), labels]


def _fed_graph(classes=3):
    g = ism.Graph()
    with g.as_default():
        y = ism.placeholder("int32", (None,), name="y")
        x = ism.placeholder("float32", (None, classes), name="x")
        loss = ism.sparse_softmax_cross_entropy(y, x * 1.0, name="xent")
        hits = ism.reduce_sum(ism.cast(ism.equal(ism.cast(ism.argmax(x, 1), "int32"), y), "float32"))
    return g, x, y, loss, hits


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [[0, 1, 3, 2], [0, -1, 2, 2]], ids=["too_big", "negative"])
def test_fed_label_out_of_range_names_the_node(backend, bad):
    g, x, y, loss, _ = _fed_graph()
    s = ism.Session(g, device="gpu", gpu=backend)
    with pytest.raises(ism.ExecutionError, match=r"'xent'.*label out of range \[0, 3\)"):
        s.run(loss, {x: LOGITS, y: np.array(bad, np.int32)})
    good = np.array([0, 1, 2, 2], np.int32)  # the same plan still runs, and equals numpy
    np.testing.assert_allclose(s.run(loss, {x: LOGITS, y: good}), np_xent(good, LOGITS), rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_label_copy_is_checked_once_for_all(backend):
    g, x, y, loss, hits = _fed_graph()
    rw = insert_copies(g, [n for n in g.nodes], [loss, hits], [x, y], "/device:GPU:0")
    label_copies = [n for n in rw.graph.nodes if n.op == "DeviceCopy" and n.inputs[0].node.name == "y"]
    assert len(label_copies) == 1  # one copy per tensor per destination, checks or not
    assert label_copies[0].attrs["label_checks"] == (("xent", 3),)
    assert copies_of(rw.graph)[("/device:CPU:0", "/device:GPU:0")] == 2
    s = ism.Session(g, device="gpu", gpu=backend)
    with pytest.raises(ism.ExecutionError, match=r"'xent'.*label out of range"):
        s.run([loss, hits], {x: LOGITS, y: np.array([0, 1, 2, 9], np.int32)})
    lv, hv = s.run([loss, hits], {x: LOGITS, y: np.array([0, 1, 2, 1], np.int32)})
    assert hv == float((LOGITS.argmax(1) == [0, 1, 2, 1]).sum())


@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_label_out_of_range_names_the_node(backend):
    g = ism.Graph()
    with g.as_default():
        loss = ism.sparse_softmax_cross_entropy(ism.constant(np.array([0, 7], np.int32)),
                                                ism.constant(LOGITS[:2]), name="xent")
    with pytest.raises(ism.ExecutionError, match=r"'xent'.*label out of range \[0, 3\): min 0, max 7"):
        ism.Session(g, device="gpu", gpu=backend).run(loss)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unknown_class_count_still_refuses_negative_labels(backend):
    g = ism.Graph()
    with g.as_default():
        y = ism.placeholder("int32", (None,), name="y")
        x = ism.placeholder("float32", (None, None), name="x")
        loss = ism.sparse_softmax_cross_entropy(y, x, name="xent")
    s = ism.Session(g, device="gpu", gpu=backend)
    with pytest.raises(ism.ExecutionError, match=r"'xent'.*label out of range \[0, \?\): min -2"):
        s.run(loss, {x: LOGITS, y: np.array([0, -2, 1, 1], np.int32)})


@pytest.mark.parametrize("backend", BACKENDS)
def test_labels_made_on_the_gpu_give_nan_without_a_sync(backend):
    """Labels computed on the device are not checked (that would sync): the bad row's loss is NaN,
    its gradient row the plain softmax, the other rows exact (the RawKernel's semantics)."""
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (4, 3), name="x")
        f = ism.placeholder("float32", (4,), name="f")
        y = ism.cast(f * 1.0, "int32")  # made on the GPU
        loss = ism.sparse_softmax_cross_entropy(y, x, name="xent")
        dx, = ism.gradients(ism.reduce_sum(loss), [x])
    lv, dv = ism.Session(g, device="gpu", gpu=backend).run([loss, dx], {x: LOGITS, f: np.array([0, 1, 5, 2], np.float32)})
    labels = np.array([0, 1, 0, 2])
    want = np_xent(labels, LOGITS)
    assert np.isnan(lv[2]) and not np.isnan(lv[[0, 1, 3]]).any()
    np.testing.assert_allclose(lv[[0, 1, 3]], want[[0, 1, 3]], rtol=1e-5)
    soft = np.exp(LOGITS - LOGITS.max(1, keepdims=True))
    soft /= soft.sum(1, keepdims=True)
    onehot = np.eye(3, dtype=np.float32)[labels]
    onehot[2] = 0
    np.testing.assert_allclose(dv, soft - onehot, rtol=1e-5, atol=1e-6)
