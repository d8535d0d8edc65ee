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


def _values(sess, g):
    return {v.node.name: sess.run(v) for v in ism.global_variables(g)}


def test_subset_save_and_restore_leave_other_variables_alone(tmp_path):
    g, sess, x, step = _model()
    kernel = g.node("fc/kernel").outputs[0]
    path = Saver([kernel], graph=g).save(sess, str(tmp_path / "k"))
    saved = sess.run(kernel)
    sess.run(step, {x: np.ones((4, 2), np.float32)})
    bias_after = sess.run(g.node("fc/bias").outputs[0])
    Saver([kernel]).restore(sess, path)
    np.testing.assert_array_equal(sess.run(kernel), saved)
    np.testing.assert_array_equal(sess.run(g.node("fc/bias").outputs[0]), bias_after)


def test_global_step_variable_names_the_file(tmp_path):
    g, sess, x, step = _model()
    with g.as_default():
        gs = ism.optimizers.get_or_create_global_step()
        inc = gs.assign_add(np.int64(7))
    sess.run(gs.initializer)
    sess.run(inc)
    assert Saver(graph=g).save(sess, str(tmp_path / "m"), global_step=gs).endswith("m-7.npz")


def test_overwriting_a_listed_file_survives_a_crash_at_every_point(tmp_path, monkeypatch):
    from isthmus.core import checkpoint as ck
    g, sess, x, step = _model()
    saver = Saver(graph=g)
    path = saver.save(sess, str(tmp_path / "m"))
    old = _values(sess, g)
    sess.run(step, {x: np.ones((4, 2), np.float32)})
    new = _values(sess, g)
    real_write_index = ck._write_index

    # crash while the data file is written: the old file stays, loadable by path
    monkeypatch.setattr(np, "savez", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        saver.save(sess, str(tmp_path / "m"))
    monkeypatch.undo()
    g2, sess2, _, _ = _model()
    Saver(graph=g2).restore(sess2, path)
    assert all(np.array_equal(old[k], v) for k, v in _values(sess2, g2).items())

    # crash after the new data is in place but before the index lists it: the new file verifies itself
    calls = []

    def flaky(directory, entries):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("power cut")
        real_write_index(directory, entries)
    monkeypatch.setattr(ck, "_write_index", flaky)
    saver.save(sess, str(tmp_path / "m"))  # re-list the file first (the crash above unlisted it)
    with pytest.raises(OSError, match="power cut"):
        saver.save(sess, str(tmp_path / "m"))
    monkeypatch.undo()
    Saver(graph=g2).restore(sess2, path)
    assert all(np.array_equal(new[k], v) for k, v in _values(sess2, g2).items())


def _data_offset(path, member):
    """Where `member`'s array bytes start in the zip file (after its local and .npy headers)."""
    import struct
    import zipfile
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
        with zf.open(info) as f:
            np.lib.format.read_magic(f)
            np.lib.format.read_array_header_1_0(f)
            npy_header = f.tell() if f.seekable() else None
    raw = open(path, "rb").read()
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    return info.header_offset + 30 + name_len + extra_len + npy_header


def test_unlisted_copy_verifies_itself(tmp_path):
    import shutil
    g, sess, _, _ = _model()
    path = Saver(graph=g).save(sess, str(tmp_path / "a" / "m"))
    copy = tmp_path / "b" / "m.npz"
    copy.parent.mkdir()
    shutil.copy(path, copy)
    g2, sess2, _, _ = _model()
    Saver(graph=g2).restore(sess2, str(copy))  # no index there: the manifest vouches for it
    raw = bytearray(copy.read_bytes())
    raw[_data_offset(copy, "fc/kernel.npy") + 5] ^= 0x01  # one bit of fc/kernel's values
    copy.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupt"):
        Saver(graph=g2).restore(sess2, str(copy))


def test_hostile_files_are_refused_without_unpickling_or_large_allocations(tmp_path):
    import json
    g, sess, _, _ = _model()
    ran = []

    class Payload:
        def __reduce__(self):
            return (ran.append, ("pickle ran",))
    variables = ism.global_variables(g)
    manifest = {"format": "isthmus-checkpoint-1", "step": None,  # a manifest that fits the graph...
                "variables": {v.node.name: {"dtype": v.dtype.str, "shape": list(v.shape), "sha256": "0"}
                              for v in variables}}
    evil = {v.node.name: np.array([Payload()], dtype=object) for v in variables}  # ...over pickled members
    evil["#manifest"] = np.frombuffer(json.dumps(manifest).encode(), np.uint8)
    bad = tmp_path / "evil.npz"
    np.savez(bad, allow_pickle=True, **evil)
    with pytest.raises(CheckpointError, match="object arrays are refused"):
        Saver(graph=g).restore(sess, str(bad))
    assert not ran

    # the manifest claims the right shape; the member's header claims 10^12 elements
    import io
    import zipfile
    kernel = g.node("fc/kernel").outputs[0]
    manifest = {"format": "isthmus-checkpoint-1", "step": None,
                "variables": {"fc/kernel": {"dtype": "<f4", "shape": [2, 3], "sha256": "0"}}}
    liar = tmp_path / "liar.npz"
    with zipfile.ZipFile(liar, "w") as zf:
        body = io.BytesIO()
        np.lib.format.write_array_header_1_0(body, {"descr": "<f4", "fortran_order": False,
                                                    "shape": (10 ** 12,)})
        body.write(b"\0" * 24)
        zf.writestr("fc/kernel.npy", body.getvalue())  # the header writer writes the magic too
        m = io.BytesIO()
        np.lib.format.write_array(m, np.frombuffer(json.dumps(manifest).encode(), np.uint8))
        zf.writestr("#manifest.npy", m.getvalue())
    with pytest.raises(CheckpointError, match=r"'fc/kernel' is stored as float32\[1000000000000\]"):
        Saver([kernel]).restore(sess, str(liar))

    # an index naming a file outside the directory is refused, and nothing is deleted
    outside = tmp_path / "precious.npz"
    outside.write_bytes(b"keep me")
    d = tmp_path / "ck"
    d.mkdir()
    (d / "checkpoint.json").write_text(json.dumps({"checkpoints": [{"file": "../precious.npz", "sha256": "x"}]}))
    with pytest.raises(CheckpointError, match="unsafe file name"):
        Saver(graph=g, max_to_keep=1).save(sess, str(d / "m"))
    with pytest.raises(CheckpointError, match="unsafe file name"):
        Saver(graph=g).restore(sess, str(d))
    assert outside.read_bytes() == b"keep me"


def test_mismatch_lists_every_problem_before_assigning_anything(tmp_path):
    g, sess, _, _ = _model(width=3)
    path = Saver(graph=g).save(sess, str(tmp_path / "m"))
    g2 = ism.Graph()
    with g2.as_default():
        a = ism.Variable(np.zeros((2, 3), np.float32), name="fc/kernel")
        ism.Variable(np.zeros(3, np.float64), name="fc/bias")
        ism.Variable(np.zeros(1, np.float32), name="extra")
    sess2 = ism.Session(g2)
    sess2.run(ism.global_variables_initializer(g2))
    with pytest.raises(CheckpointError) as e:
        Saver(graph=g2).restore(sess2, path)
    msg = str(e.value)
    assert "'fc/bias': graph has float64[3], checkpoint has float32[3]" in msg
    assert "'extra' is missing (graph has float32[1])" in msg and "(2 variable(s))" in msg
    assert not sess2.run(a).any()  # fc/kernel fitted, but nothing is assigned on failure


def test_restore_latest_after_several_saves(tmp_path):
    from isthmus.core.checkpoint import list_checkpoints
    g, sess, x, step = _model()
    saver = Saver(graph=g, max_to_keep=3)
    for s in range(3):
        sess.run(step, {x: np.ones((4, 2), np.float32)})
        saver.save(sess, str(tmp_path / "m"), global_step=s)
    final = _values(sess, g)
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path))] == ["m-0.npz", "m-1.npz", "m-2.npz"]
    g2, sess2, _, _ = _model()
    assert Saver(graph=g2).restore(sess2, str(tmp_path)).endswith("m-2.npz")
    assert all(np.array_equal(final[k], v) for k, v in _values(sess2, g2).items())


def test_restore_latest_valid_falls_back_past_a_corrupt_newest(tmp_path):
    g, sess, x, step = _model()
    saver = Saver(graph=g, max_to_keep=3)
    saver.save(sess, str(tmp_path / "m"), global_step=0)
    sess.run(step, {x: np.ones((4, 2), np.float32)})
    good = saver.save(sess, str(tmp_path / "m"), global_step=1)
    want = _values(sess, g)
    sess.run(step, {x: np.ones((4, 2), np.float32)})
    bad = saver.save(sess, str(tmp_path / "m"), global_step=2)
    data = bytearray(open(bad, "rb").read())
    data[len(data) // 2] ^= 0x40
    open(bad, "wb").write(bytes(data))

    g2, sess2, _, _ = _model()
    with pytest.raises(ism.CheckpointError, match="corrupt"):
        Saver(graph=g2).restore(sess2, str(tmp_path))  # the plain restore refuses the newest
    warnings = []
    used = Saver(graph=g2).restore_latest_valid(sess2, str(tmp_path), warn=warnings.append)
    assert used == good
    assert len(warnings) == 1 and "m-2.npz" in warnings[0] and "corrupt" in warnings[0]
    assert all(np.array_equal(want[k], v) for k, v in _values(sess2, g2).items())


def test_restore_latest_valid_lists_every_problem_when_none_verifies(tmp_path):
    g, sess, x, step = _model()
    saver = Saver(graph=g)
    paths = [saver.save(sess, str(tmp_path / "m"), global_step=s) for s in range(2)]
    for p in paths:
        open(p, "r+b").truncate(100)
    with pytest.raises(ism.CheckpointError, match=r"no checkpoint in .* verifies:\n  .*m-1.npz.*\n  .*m-0.npz"):
        Saver(graph=g).restore_latest_valid(sess, str(tmp_path), warn=lambda m: None)
