"""Checkpoints: round trip with optimizer slots, corruption, mismatch, atomicity, keep-last-N."""
import os

import numpy as np
import pytest

import isthmus as ism
from isthmus.core.checkpoint import Saver, latest_checkpoint
from isthmus.core.errors import CheckpointError


def _model(width=3):
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 2), name="x")
        y = ism.nn.Dense(width, name="fc")(x)
        step = ism.optimizers.Adam(0.1).minimize(ism.reduce_mean(y * y))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return g, sess, x, step


def test_round_trip_includes_slots(tmp_path):
    g, sess, x, step = _model()
    for _ in range(3):
        sess.run(step, {x: np.ones((4, 2), np.float32)})
    path = Saver(graph=g).save(sess, str(tmp_path / "model"), global_step=3)
    assert path.endswith("model-3.npz") and latest_checkpoint(str(tmp_path)) == path
    g2, sess2, _, _ = _model()
    Saver(graph=g2).restore(sess2, str(tmp_path))
    names = [v.node.name for v in ism.global_variables(g)]
    assert any("/Adam/m" in n for n in names)
    for v, v2 in zip(ism.global_variables(g), ism.global_variables(g2)):
        np.testing.assert_array_equal(sess.run(v), sess2.run(v2))


def test_flipped_byte_is_detected(tmp_path):
    g, sess, _, _ = _model()
    path = Saver(graph=g).save(sess, str(tmp_path / "m"))
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 2] ^= 0x40
    open(path, "wb").write(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupt"):
        Saver(graph=g).restore(sess, path)


def test_other_graph_names_the_variables(tmp_path):
    g, sess, _, _ = _model(width=3)
    path = Saver(graph=g).save(sess, str(tmp_path / "m"))
    g2, sess2, _, _ = _model(width=4)
    with pytest.raises(CheckpointError, match=r"'fc/kernel': graph has float32\[2, 4\], checkpoint has float32\[2, 3\]"):
        Saver(graph=g2).restore(sess2, path)
    g3 = ism.Graph()
    with g3.as_default():
        ism.Variable(np.zeros(2, np.float32), name="other")
    with pytest.raises(CheckpointError, match="'other' is missing"):
        Saver(graph=g3).restore(ism.Session(g3), path)


def test_crash_mid_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    g, sess, x, step = _model()
    saver = Saver(graph=g)
    good = saver.save(sess, str(tmp_path / "m"), global_step=1)
    before = [sess.run(v) for v in ism.global_variables(g)]
    sess.run(step, {x: np.ones((4, 2), np.float32)})

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError, match="disk full"):
        saver.save(sess, str(tmp_path / "m"), global_step=2)
    monkeypatch.undo()
    assert latest_checkpoint(str(tmp_path)) == good
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]
    g2, sess2, _, _ = _model()
    Saver(graph=g2).restore(sess2, str(tmp_path))
    for b, v in zip(before, ism.global_variables(g2)):
        np.testing.assert_array_equal(b, sess2.run(v))


def test_keep_last_n(tmp_path):
    g, sess, _, _ = _model()
    saver = Saver(graph=g, max_to_keep=2)
    for s in range(4):
        saver.save(sess, str(tmp_path / "m"), global_step=s)
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".npz")) == ["m-2.npz", "m-3.npz"]


def test_unsafe_variable_names_are_refused(tmp_path):
    g = ism.Graph()
    with g.as_default():
        ism.Variable(np.zeros(1, np.float32), name="../../evil")  # as if a hostile graph had been loaded
    sess = ism.Session(g)
    sess.run(ism.global_variables_initializer(g))
    with pytest.raises(CheckpointError, match="cannot be stored safely"):
        Saver(graph=g).save(sess, str(tmp_path / "m"))
