"""Same-host tensor transfer through /dev/shm (cloud/shm.py): the bytes, the fallbacks,
the segments' lifetime and the descriptor checks, over real gRPC servers on 127.0.0.1."""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

from isthmus.cloud import recv_layout, rpc, shm  # noqa: E402
from isthmus.cloud.server import serve_worker  # noqa: E402
from isthmus.cloud.worker import Worker  # noqa: E402
from isthmus.proto import tensor_pb2, worker_pb2  # noqa: E402

pytestmark = pytest.mark.skipif(not shm.host_identity(), reason="no writable /dev/shm on this host")

D0, D1 = "/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"


def _settle(lender, timeout=5.0):
    """Wait (bounded) until the sender has seen every lent segment taken."""
    deadline = time.monotonic() + timeout
    while lender.outstanding() and time.monotonic() < deadline:
        time.sleep(0.01)
    return lender.outstanding()


WAIT = 30.0   # the deadline of a receive whose value is there: generous, for a loaded machine (pytest -n, a CPU hog)


@pytest.fixture
def sender():
    """A sending task on a free port (its Worker laid out as a cluster task's); at the end no
    segment of this process is left (others' may come and go: tests run side by side)."""
    w = Worker("/job:worker/task:0", wire=True, shm_enabled=True, shm_min_bytes=1, recv_timeout=5.0)
    server, port = serve_worker(w)
    clients = []

    def client(**kw):
        kw.setdefault("shm_enabled", True)   # whatever $ISTHMUS_SHM says where the suite runs
        c = rpc.WorkerClient(f"127.0.0.1:{port}", timeout=10.0, name="/job:worker/task:0", **kw)
        clients.append(c)
        return c
    yield w, client
    for c in clients:
        c.close()
    server.stop(grace=None).wait(5)
    w.close()
    assert shm.segments([os.getpid()]) == []


def _spy(monkeypatch):
    reads = []
    inner = shm.read_segment

    def spy(name, *a, **k):
        reads.append(name)
        return inner(name, *a, **k)
    monkeypatch.setattr(shm, "read_segment", spy)
    return reads


VALUES = [
    ("float32", np.random.default_rng(0).standard_normal((64, 33)).astype(np.float32)),
    ("float64 0-d", np.array(3.25)),
    ("float16", np.arange(-8, 8, dtype=np.float16) / 3),
    ("int8", np.arange(-128, 128, dtype=np.int8).reshape(16, 16)),
    ("int64", np.arange(1000, dtype=np.int64) * -7),
    ("uint8", np.arange(256, dtype=np.uint8)),
    ("bool", np.array([True, False, True])),
    ("strided", np.arange(240, dtype=np.float32).reshape(12, 20)[::3, 1::2]),
    ("transposed", np.arange(60, dtype=np.int32).reshape(5, 12).T),
    ("big-endian", np.arange(7, dtype=">f8") - 2.5),
]


@pytest.mark.parametrize("label,value", VALUES, ids=[v[0] for v in VALUES])
def test_shm_transfer_gives_identical_bytes(sender, monkeypatch, label, value):
    w, client = sender
    c = client()
    reads = _spy(monkeypatch)
    for step in (1, 2):  # the first answer teaches the sender; the second is laid out at Send time
        w._deposit((D0, D1, "x:0", step), value)
        got = c.recv_tensor(D0, D1, "x:0", step, timeout=WAIT)
        assert got.shape == value.shape and got.dtype == value.dtype.newbyteorder("=")
        assert got.tobytes() == np.ascontiguousarray(value, got.dtype).tobytes()
        assert not got.flags.writeable   # a view of the mapped segment
    assert len(reads) == 2 and w.shm.lent_total == 2 and D1 in w.shm.peers
    assert _settle(w.shm) == 0 and not shm.segments([os.getpid()])


def test_empty_and_small_tensors_stay_inline(sender, monkeypatch):
    w, client = sender
    w.shm.min_bytes = 1024
    c = client()
    reads = _spy(monkeypatch)
    for step, v in enumerate([np.zeros((0, 3), np.float32), np.ones(255, np.float32), np.ones(256, np.float32)]):
        w._deposit((D0, D1, "x:0", step), v)
        got = c.recv_tensor(D0, D1, "x:0", step, timeout=WAIT)
        assert got.shape == v.shape and got.tobytes() == v.tobytes()
    assert len(reads) == 1 and w.shm.lent_total == 1   # only the 1024-byte one


def test_a_registered_send_goes_through_shm(sender, monkeypatch):
    import isthmus as ism
    from isthmus.core.ops.comm import send
    w, client = sender
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (None, None), name="x")
        send(ism.transpose(x * 2.0), f"{D0};{D1};y:0", D0, D1, name="send_y")
    c = client()
    reads = _spy(monkeypatch)
    h = c.register_graph(g, D0)
    rng = np.random.default_rng(3)
    for step in range(1, 4):
        v = rng.standard_normal((300, 7)).astype(np.float32)
        c.run_graph(h, step, {"x:0": v}, ["send_y"])
        got = c.recv_tensor(D0, D1, "y:0", step, timeout=WAIT)
        assert got.tobytes() == np.ascontiguousarray((v * 2.0).T).tobytes()
    assert len(reads) == 3


@pytest.mark.parametrize("where", ["receiver", "sender", "env"])
def test_disabled_means_grpc(sender, monkeypatch, where):
    w, client = sender
    if where == "env":
        monkeypatch.setenv("ISTHMUS_SHM", "0")
        assert Worker("/job:worker/task:5", wire=True).shm is None
        c = client(shm_enabled=None)
        assert c.shm_host == ""
    elif where == "receiver":
        c = client(shm_enabled=False)
    else:
        w.shm = None
        c = client(shm_enabled=True)
    reads = _spy(monkeypatch)
    v = np.arange(5000, dtype=np.float32)
    w._deposit((D0, D1, "x:0", 7), v)
    got = c.recv_tensor(D0, D1, "x:0", 7, timeout=WAIT)
    assert got.tobytes() == v.tobytes() and reads == []
    assert w.shm is None or w.shm.lent_total == 0


def test_another_hosts_identity_gets_grpc(sender):
    w, client = sender
    c = client()
    c.shm_host = "00000000-0000-0000-0000-000000000000/1/" + str(os.getuid())  # another boot
    v = np.arange(5000, dtype=np.float32)
    w._deposit((D0, D1, "x:0", 1), v)
    assert c.recv_tensor(D0, D1, "x:0", 1, timeout=WAIT).tobytes() == v.tobytes()
    assert w.shm.lent_total == 0 and not w.shm.peers


@pytest.mark.parametrize("how", ["missing", "not a file"])
def test_an_unreadable_segment_falls_back_to_grpc(sender, monkeypatch, how):
    w, client = sender
    c = client()
    inner = shm.read_segment

    def vanish(name, *a, **k):  # someone removed (or replaced) it between the answer and the read
        os.unlink(os.path.join(shm.SHM_DIR, name))
        if how == "not a file":
            os.mkfifo(os.path.join(shm.SHM_DIR, name), 0o600)
        try:
            return inner(name, *a, **k)
        finally:
            if how == "not a file":
                os.unlink(os.path.join(shm.SHM_DIR, name))
    monkeypatch.setattr(shm, "read_segment", vanish)
    for step, n in ((1, 5000), (2, 3 << 18)):   # the fallback's answer inline, then streamed
        v = np.random.default_rng(step).standard_normal(n).astype(np.float32)
        w._deposit((D0, D1, "x:0", step), v)
        got = c.recv_tensor(D0, D1, "x:0", step, timeout=WAIT)
        assert got.tobytes() == v.tobytes()
        assert w.shm.outstanding() == 0
    assert c.shm_failures == 2 and c.shm_host   # still offered (three failures turn it off)
    monkeypatch.setattr(shm, "read_segment", inner)
    w._deposit((D0, D1, "x:0", 3), np.ones(9))
    assert c.recv_tensor(D0, D1, "x:0", 3, timeout=WAIT).tolist() == [1.0] * 9
    assert w.shm.lent_total == 3


def test_full_dev_shm_falls_back_to_grpc(sender, monkeypatch):
    import errno
    w, client = sender
    c = client()

    def full(fd, off, n):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)          # the strided path's
    monkeypatch.setattr(os, "pwrite", lambda fd, data, off: full(fd, off, len(data)))  # the contiguous one's
    for v in (np.arange(4096, dtype=np.int32), np.arange(8192, dtype=np.int32)[::2]):
        for step in (1, 2):
            w._deposit((D0, D1, "x:0", step), v)
            assert c.recv_tensor(D0, D1, "x:0", step, timeout=WAIT).tobytes() == v.tobytes()
        assert w.shm.lent_total == 0 and not shm.segments([os.getpid()])


def test_no_segment_outlives_an_aborted_step_or_a_stopped_task(sender):
    from isthmus.core.rendezvous import RendezvousAborted
    w, client = sender
    c = client()
    w._deposit((D0, D1, "x:0", 1), np.ones(100))
    c.recv_tensor(D0, D1, "x:0", 1, timeout=WAIT)     # D1 now known to share the host
    assert _settle(w.shm) == 0
    w._deposit((D0, D1, "x:0", 2), np.ones(100))
    w._deposit((D0, D1, "z:0", 2), np.ones(100))
    assert len(shm.segments([os.getpid()])) == 2   # laid out at Send time
    w.abort_step(2, RuntimeError("failed elsewhere"))
    assert shm.segments([os.getpid()]) == []
    with pytest.raises(RendezvousAborted):
        w._deposit((D0, D1, "late:0", 2), np.ones(100))   # refused: its segment is not kept
    w._deposit((D0, D1, "x:0", 5), np.ones(100))
    w.shm.lend(w.table.take((D0, D1, "x:0", 5)), (D0, D1, "x:0", 5))  # answered; its caller gave up
    assert len(shm.segments([os.getpid()])) == 1
    w.abort_step(5, RuntimeError("the receiving part failed"))
    assert shm.segments([os.getpid()]) == [] and w.shm.outstanding() == 0
    w._deposit((D0, D1, "x:0", 3), np.ones(100))
    w.shm.lend(w.table.take((D0, D1, "x:0", 3)), (D0, D1, "x:0", 3))  # lent, never read
    w._deposit((D0, D1, "x:0", 4), np.ones(100))                      # pending
    assert len(shm.segments([os.getpid()])) == 2
    w.close()
    assert shm.segments([os.getpid()]) == []


def test_a_segment_never_taken_is_unlinked_when_its_lease_ends():
    lender = shm.Lender(min_bytes=1, lease_s=0.2)
    seg = shm.Segment(np.ones(10))
    lender.lend(seg, ("a", "b", "t", 1))
    assert seg.name in shm.segments()
    deadline = time.monotonic() + 5
    while seg.name in shm.segments() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seg.name not in shm.segments() and lender.outstanding() == 0
    lender.close()


def test_a_killed_tasks_segments_are_swept():
    code = ("import sys, numpy as np; from isthmus.cloud import shm\n"
            "segs = [shm.Segment(np.ones(1000)) for _ in range(3)]\n"
            "print(' '.join(s.name for s in segs), flush=True); sys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = [None]
        t = threading.Thread(target=lambda: line.__setitem__(0, p.stdout.readline()), daemon=True)
        t.start()
        t.join(30)
        names = (line[0] or "").split()
        assert len(names) == 3 and set(names) <= set(shm.segments([p.pid]))
        shm.sweep()
        assert set(names) <= set(shm.segments([p.pid]))   # its owner lives: nothing is taken from it
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    assert shm.sweep() >= 3 and shm.segments([p.pid]) == []


def test_a_forgotten_segment_or_a_normal_exit_leaves_nothing():
    import gc
    seg = shm.Segment(np.ones(10))
    name = seg.name
    del seg
    gc.collect()
    assert name not in shm.segments([os.getpid()])
    code = ("import numpy as np; from isthmus.cloud import shm\n"
            "keep = [shm.Segment(np.ones(1000)) for _ in range(2)]\n"
            "print(' '.join(s.name for s in keep))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    names = out.stdout.split()
    assert len(names) == 2 and not set(names) & set(shm.segments())


def _fake_sender(answer: bytes):
    """A server whose RecvTensor answers `answer` whatever is asked (a sender gone wrong)."""
    handler = grpc.method_handlers_generic_handler("isthmus.Worker", {
        "RecvTensor": grpc.unary_unary_rpc_method_handler(lambda req, ctx: answer, request_deserializer=None,
                                                          response_serializer=None)})
    from isthmus.cloud.server import start_grpc_server
    return start_grpc_server([handler], "127.0.0.1", 0, 2, health=False)


def _answer(name, nbytes, dtype=tensor_pb2.DT_FLOAT32, shape=(4, 4)):
    t = tensor_pb2.TensorProto(dtype=dtype, shape=shape)
    return worker_pb2.RecvTensorResponse(tensor=t, shm_name=name, shm_bytes=nbytes).SerializeToString()


def test_a_bad_descriptor_is_refused_naming_the_tensor():
    good = "isthmus-1-2-" + "ab" * 16
    wrong_size = f"isthmus-1-2-{os.urandom(16).hex()}"
    with open(os.path.join(shm.SHM_DIR, wrong_size), "wb") as f:   # a file of that name, 10 bytes
        f.write(b"\0" * 10)
    cases = [
        (_answer("../../etc/passwd", 64), "malformed shared-memory segment name"),
        (_answer("isthmus-1-2-XYZ", 64), "malformed shared-memory segment name"),
        (_answer(good, 65), "declares 65 bytes; the announced tensor needs 64"),
        (_answer(good, 1 << 40, shape=(1 << 38,)), "over the limit"),
        (_answer(good, 0, shape=(0, 4)), "empty tensor"),
        (_answer(wrong_size, 64), "holds 10 bytes; the descriptor needs 64 and the mark byte"),
    ]
    try:
        for answer, message in cases:
            server, port = _fake_sender(answer)
            c = rpc.WorkerClient(f"127.0.0.1:{port}", timeout=5.0, shm_enabled=True)
            try:
                with pytest.raises(recv_layout.TensorCodecError, match=message) as e:
                    c.recv_tensor(D0, D1, "weights:0", 5, timeout=2)
                assert "'weights:0'" in str(e.value) and isinstance(e.value, shm.ShmDescriptorError)
            finally:
                c.close()
                server.stop(None).wait(5)
        assert os.path.exists(os.path.join(shm.SHM_DIR, wrong_size))   # a refused segment is not touched
    finally:
        os.unlink(os.path.join(shm.SHM_DIR, wrong_size))


def test_recv_requests_with_shm_are_protobufs_own_bytes():
    c = rpc.WorkerClient("127.0.0.1:1", timeout=1.0, shm_enabled=True)
    try:
        want = worker_pb2.RecvTensorRequest(src_device=D0, dst_device=D1, tensor="x:0", step_id=9, timeout_s=2.0,
                                            shm_host=shm.host_identity()).SerializeToString(deterministic=True)
        assert c.recv_request((D0, D1, "x:0"), 9, 2.0) == want
    finally:
        c.close()


def test_a_distributed_step_through_shm_equals_the_grpc_path(monkeypatch):
    import isthmus as ism
    from isthmus.cloud.cluster import ClusterSpec
    from isthmus.cloud.server import Server
    g = ism.Graph(seed=7)
    with g.as_default():
        with ism.device("/job:worker/task:1"):
            x = ism.placeholder(ism.float32, (None, 256), name="x")
            wgt = ism.Variable(np.random.default_rng(2).standard_normal((256, 512)).astype(np.float32), name="w")
            h = ism.relu(ism.matmul(x, wgt), name="h")          # 128 KiB per 64 rows: to task 0
        with ism.device("/job:worker/task:0"):
            out = ism.reduce_sum(h * h, axis=1, name="out")
            grad = ism.gradients(ism.reduce_sum(out), [wgt])[0]   # and back to task 1
        init = ism.global_variables_initializer()
    xv = np.random.default_rng(4).standard_normal((96, 256)).astype(np.float32)
    results = {}
    for on in (True, False):
        made = [Server(None, "worker", i, port=0, step_timeout=20.0, recv_timeout=10.0, shm_enabled=on)
                for i in range(2)]
        spec = ClusterSpec({"worker": [f"127.0.0.1:{s.port}" for s in made]})
        for s in made:
            s.set_cluster(spec)
            s.worker.shm is None or setattr(s.worker.shm, "min_bytes", 64 << 10)
        try:
            with ism.Session(g, target=made[0].target) as sess:
                sess.run(init)
                results[on] = [sess.run([out, grad], {x: xv}) for _ in range(3)]
            lent = sum(s.worker.shm.lent_total for s in made if s.worker.shm is not None)
            assert (lent >= 3) if on else lent == 0
        finally:
            for s in made:
                s.stop()
    with ism.Session(g) as local:
        local.run(init)
        want = local.run([out, grad], {x: xv})
    for a, b in zip(results[True], results[False]):
        for u, v in zip(a, b):
            assert np.asarray(u).tobytes() == np.asarray(v).tobytes()
    np.testing.assert_allclose(results[True][0][0], want[0], rtol=1e-5)
    np.testing.assert_allclose(results[True][0][1], want[1], rtol=1e-4, atol=1e-4)
    assert shm.segments([os.getpid()]) == []   # both tasks ran in this process


def test_tasks_in_their_own_processes_use_shm_and_a_killed_one_leaves_no_segment():
    import isthmus as ism
    from isthmus.cloud.local_cluster import LocalCluster
    from isthmus.core.ops.comm import send
    W0, W1 = "/job:worker/task:0", "/job:worker/task:1"
    g = ism.Graph(seed=5)
    with g.as_default():
        with ism.device(W1):
            x = ism.placeholder(ism.float32, (None, 512), name="x")
            h = ism.tanh(x * 3.0, name="h")                       # 1 MiB at 512 rows: worker 1 -> worker 0
        with ism.device(W0):
            out = ism.reduce_sum(h * h + 1.0, axis=0, name="out")
    xv = np.random.default_rng(6).standard_normal((512, 512)).astype(np.float32)
    with ism.Session(g) as local:
        want = local.run(out, {x: xv})
    with LocalCluster({"worker": 2}, recv_timeout=10.0, shm_enabled=True) as c:
        with ism.Session(g, target=c.target) as sess:
            for _ in range(3):
                np.testing.assert_allclose(sess.run(out, {x: xv}), want, rtol=1e-5)
        w1 = rpc.WorkerClient(c.address("worker", 1), timeout=10.0, name=W1)
        try:
            assert w1.status()["shm_lent"] >= 3   # the receiving task (its own process) read segments
            # a value waiting for its Recv when its task dies: worker 1 has learned that worker 0
            # shares the host, so its Send lays it out in a segment
            pg = ism.Graph()
            with pg.as_default():
                v = ism.placeholder(ism.float32, (None,), name="v")
                send(v, f"{W1}/device:CPU:0;{W0}/device:CPU:0;v:0", f"{W1}/device:CPU:0", f"{W0}/device:CPU:0",
                     name="send_v")
            w1.run_graph(w1.register_graph(pg, f"{W1}/device:CPU:0"), 99, {"v:0": np.ones(1 << 18, np.float32)},
                         ["send_v"])
        finally:
            w1.close()
        pid = c.tasks[next(t for t in c.tasks if t.index == 1)].proc.pid
        assert len(shm.segments([pid])) == 1
        c.kill("worker", 1)
        assert shm.segments([pid]) == []


def test_concurrent_receives_through_shm(sender):
    w, client = sender
    c = client()
    rng = np.random.default_rng(11)
    values = {f"t{k}:0": rng.standard_normal(1000 + 37 * k).astype(np.float32) for k in range(8)}
    for step in (1, 2):
        for name, v in values.items():
            w._deposit((D0, D1, name, step), v + step)
        got, errors = {}, []

        def take(name):
            try:
                got[name] = c.recv_tensor(D0, D1, name, step, timeout=WAIT)
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=take, args=(n,)) for n in values]
        [t.start() for t in threads]
        [t.join(20) for t in threads]
        assert not errors and sorted(got) == sorted(values)
        assert all(got[n].tobytes() == (v + step).tobytes() for n, v in values.items())
    assert w.shm.lent_total == 16 and _settle(w.shm) == 0


def test_a_receiver_that_stops_offering_gets_values_laid_out_for_grpc(sender, monkeypatch):
    w, client = sender
    c = client()
    made = []
    inner = shm.Segment.__init__

    def counting(self, *a, **k):
        made.append(1)
        inner(self, *a, **k)
    monkeypatch.setattr(shm.Segment, "__init__", counting)
    v = np.arange(3000, dtype=np.float64)
    w._deposit((D0, D1, "x:0", 1), v)
    assert c.recv_tensor(D0, D1, "x:0", 1, timeout=WAIT).tobytes() == v.tobytes()
    w._deposit((D0, D1, "x:0", 2), v)       # laid out in a segment: D1 offered
    assert len(made) == 2
    c.shm_host = ""                          # as after three unreadable segments
    assert c.recv_tensor(D0, D1, "x:0", 2, timeout=WAIT).tobytes() == v.tobytes()   # read back for gRPC
    w._deposit((D0, D1, "x:0", 3), v)
    assert c.recv_tensor(D0, D1, "x:0", 3, timeout=WAIT).tobytes() == v.tobytes()
    assert len(made) == 2 and D1 not in w.shm.peers   # no segment for a caller that stopped offering
