"""How a distributed step coordinates: small values of parts that need nothing from other
tasks ride on their RunGraph answers (no RecvTensor call), Recvs of a part are fetched
concurrently, and a failure anywhere still ends the step at once with the original error."""
import time

import numpy as np
import pytest

import isthmus as ism
from isthmus.core.errors import ExecutionError

from .test_session_target import servers

W = [f"/job:worker/task:{i}" for i in range(3)]


@pytest.fixture
def tasks():
    made = servers({"worker": 3})
    yield [made[("worker", i)] for i in range(3)]
    for s in made.values():
        s.stop()


def _plan(server):
    (sess,) = server.master._sessions.values()
    return list(sess.plans.values())


def test_null_step_tokens_ride_on_run_graph_answers(tasks):
    g = ism.Graph()
    with g.as_default():
        ops = []
        for i, dev in enumerate(W):
            with ism.device(dev):
                ops.append(ism.no_op(name=f"noop_{i}"))
        with ism.device(W[0]):
            step = ism.group(*ops, name="null_step")
    with ism.Session(g, target=tasks[0].target) as sess:
        for _ in range(3):
            assert sess.run(step) is None
        (plan,) = _plan(tasks[0])
        pushed = {pr.device: [key for _, _, key in pr.pushes] for pr in plan.parts}
        assert pushed[W[0] + "/device:CPU:0"] == []
        for i in (1, 2):
            (key,) = pushed[W[i] + "/device:CPU:0"]
            assert key[1] == W[0] + "/device:CPU:0" and key[2] == f"^noop_{i}"
    st = [t.worker.status() for t in tasks]
    assert [s["pending_tensors"] for s in st] == [0, 0, 0]   # nothing was left waiting for a RecvTensor
    assert [s["steps_run"] for s in st] == [3, 3, 3]


def _two_way_graph(n_small=5, n_big=20000):
    g = ism.Graph()
    with g.as_default():
        with ism.device(W[1]):
            a = ism.placeholder(ism.float32, (n_small,), name="a")
            small = ism.identity(a * 2.0, name="small")                 # pushed: 20 bytes
            b = ism.placeholder(ism.float32, (n_big,), name="b")
            big = ism.identity(b + 1.0, name="big")                      # 80 KB: pulled with RecvTensor
        with ism.device(W[0]):
            out = ism.identity(ism.reduce_sum(small) + ism.reduce_sum(big), name="out")
            x = ism.placeholder(ism.float32, (3,), name="x")
        with ism.device(W[2]):
            y = ism.identity(x * 3.0, name="y")                          # task 2 needs x: it has a Recv
        with ism.device(W[0]):
            z = ism.identity(y - 1.0, name="z")
    return g, (a, b, x), (out, z)


def test_recv_less_parts_push_small_values_and_results_equal_local(tasks):
    g, (a, b, x), (out, z) = _two_way_graph()
    rng = np.random.default_rng(0)
    local = ism.Session(g)
    with ism.Session(g, target=tasks[0].target) as sess:
        for _ in range(3):
            feed = {a: rng.standard_normal(5).astype(np.float32), b: rng.standard_normal(20000).astype(np.float32),
                    x: rng.standard_normal(3).astype(np.float32)}
            got = sess.run([out, z], feed)
            want = local.run([out, z], feed)
            # (a sum of 20,000 floats may round differently in the local session's fused plan)
            np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
            assert np.asarray(got[1]).tobytes() == np.asarray(want[1]).tobytes()
        (plan,) = _plan(tasks[0])
        by_dev = {pr.device: pr for pr in plan.parts}
        keys = [key[2] for _, _, key in by_dev[W[1] + "/device:CPU:0"].pushes]
        assert keys == ["small:0"]                                       # the 80 KB value is not carried
        assert by_dev[W[2] + "/device:CPU:0"].pushes == []               # a part with a Recv never pushes
    assert [t.worker.status()["pending_tensors"] for t in tasks] == [0, 0, 0]


def test_a_failing_pushing_part_ends_the_step_at_once(tasks):
    g = ism.Graph()
    with g.as_default():
        with ism.device(W[1]):
            a = ism.placeholder(ism.float32, (None,), name="a")
            r = ism.reshape(a, (2, 2), name="needs_four")
            small = ism.reshape(r, (4,), name="flat")
        with ism.device(W[0]):
            out = ism.identity(small + 1.0, name="out")
    with ism.Session(g, target=tasks[0].target) as sess:
        good = sess.run(out, {a: np.arange(4, dtype=np.float32)})
        assert np.asarray(good).tolist() == [1.0, 2.0, 3.0, 4.0]
        t0 = time.monotonic()
        with pytest.raises(ExecutionError, match=r"needs_four"):
            sess.run(out, {a: np.arange(3, dtype=np.float32)})
        assert time.monotonic() - t0 < 5.0   # the receiving part was woken, not left to its 10 s wait
        assert np.asarray(sess.run(out, {a: np.ones(4, np.float32)})).tolist() == [2.0] * 4


def test_a_parts_recvs_from_other_tasks_are_in_flight_together(tasks):
    g = ism.Graph()
    with g.as_default():
        vals = []
        for i in (1, 2):
            with ism.device(W[i]):  # unknown sizes: pulled with RecvTensor, not carried by the master
                p = ism.placeholder(ism.float32, (None,), name=f"p{i}")
                vals.append(ism.identity(p * float(i), name=f"v{i}"))
        with ism.device(W[0]):
            out = ism.identity(ism.reduce_sum(vals[0]) + ism.reduce_sum(vals[1]), name="out")
    arrivals = []
    for i in (1, 2):
        w = tasks[i].worker
        for method in ("recv_wire", "recv_shared"):  # the gRPC answer, or the same-host one
            inner = getattr(w, method)

            def slow(*a, _inner=inner, **k):
                arrivals.append(time.monotonic())
                got = _inner(*a, **k)
                time.sleep(0.5)  # a slow answer: a second Recv made after it would arrive 0.5 s later
                return got
            setattr(w, method, slow)
    feed = {"p1:0": np.arange(3, dtype=np.float32), "p2:0": np.ones(4, np.float32)}
    with ism.Session(g, target=tasks[0].target) as sess:
        got = sess.run(out, {g.tensor(k): v for k, v in feed.items()})
    assert float(got) == 3.0 + 8.0
    assert len(arrivals) == 2 and abs(arrivals[1] - arrivals[0]) < 0.4


def test_only_the_recvs_a_step_runs_are_started_early():
    from isthmus.cloud.worker import Worker
    from isthmus.core.ops.comm import recv
    w = Worker("/job:worker/task:0", peers=lambda d: None)
    g = ism.Graph()
    src, dst = "/job:worker/task:1/device:CPU:0", "/job:worker/task:0/device:CPU:0"
    with g.as_default():
        a = recv(f"{src};{dst};a:0", src, dst, ism.float32, (2,), name="recv_a")
        b = recv(f"{src};{dst};b:0", src, dst, ism.float32, (2,), name="recv_b")
        c = recv(f"{src};{dst};c:0", src, dst, ism.float32, (2,), name="recv_c")
        ism.identity(a + b, name="ab")
        with ism.control_dependencies([c]):
            ism.no_op(name="after_c")
    h = w.register_graph(g)
    reg = w._graphs[h]
    assert sorted(k[2] for k in reg.remote_recvs([g.tensor("ab:0")])) == ["a:0", "b:0"]
    assert [k[2] for k in reg.remote_recvs([g.node("after_c")])] == ["c:0"]
    w.expect_pushed(h, [(src, dst, "b:0")])   # carried by the master: never asked for
    assert [k[2] for k in reg.remote_recvs([g.tensor("ab:0")])] == ["a:0"]
