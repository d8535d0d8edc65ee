"""The in-process Worker: register partition parts, run steps by id, RecvTensor between tasks."""
import threading

import numpy as np
import pytest

import isthmus as ism
from isthmus.cloud import graph_codec
from isthmus.cloud.worker import StepRendezvous, Worker, WorkerError
from isthmus.core.rendezvous import RendezvousAborted, RendezvousTimeout
from isthmus.partitioner.partition import partition

D0 = "/job:worker/task:0/device:CPU:0"
D1 = "/job:worker/task:1/device:CPU:0"


def two_part_graph():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (None, 3), name="x")
        w = ism.constant(np.arange(6, dtype=np.float32).reshape(3, 2), name="w")
        a = ism.matmul(x, w, name="a")
        b = ism.tanh(a, name="b")
        r = ism.reshape(b, (2, 2), name="r")
        c = ism.reduce_sum(r * 2.0, name="c")
    placement = {n.name: D0 for n in g.nodes}
    for n in ("b", "r", "c"):
        placement[n] = D1
    for n in g.nodes:
        if n.name not in placement:
            placement[n.name] = D1
    return g, partition(g, placement, outputs=["c:0"])


def make_cluster(parts):
    workers = {}
    peers = lambda dev: workers[dev]  # noqa: E731
    workers[D0] = Worker("/job:worker/task:0", peers=peers, recv_timeout=5.0)
    workers[D1] = Worker("/job:worker/task:1", peers=peers, recv_timeout=5.0)
    handles = {d: workers[d].register_graph(graph_codec.to_bytes(p.graph), d) for d, p in parts.items()}
    return workers, handles


def run_step(p, workers, handles, step, feeds):
    results, errors = {}, {}

    def go(dev):
        part = p.parts[dev]
        try:
            mine = {k: v for k, v in feeds.items() if k.split(":")[0] in part.graph}
            results[dev] = workers[dev].run_graph(handles[dev], step, mine, part.fetches)
        except Exception as e:  # noqa: BLE001
            errors[dev] = e
            for w in workers.values():
                w.abort_step(step, e)
    ts = [threading.Thread(target=go, args=(d,)) for d in p.parts]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    return results, errors


def test_two_workers_match_local_session():
    g, p = two_part_graph()
    assert set(p.parts) == {D0, D1} and p.transfers
    workers, handles = make_cluster(p.parts)
    local = ism.Session(g)
    for step, scale in ((1, 1.0), (2, -0.5), (7, 3.0)):
        xv = (np.arange(6, dtype=np.float32).reshape(2, 3) * scale / 10)
        res, err = run_step(p, workers, handles, step, {"x:0": xv})
        assert not err, err
        got = res[D1][0]
        want = local.run(g.tensor("c:0"), {g.tensor("x:0"): xv})
        assert got.tobytes() == np.asarray(want).tobytes()
    st = workers[D0].status()
    assert st["task"] == "/job:worker/task:0" and st["steps_run"] == 3 and st["pending_tensors"] == 0
    for d, w in workers.items():
        w.deregister_graph(handles[d])
        assert w.status()["handles"] == []
    with pytest.raises(WorkerError, match="no registered graph"):
        workers[D0].run_graph(handles[D0], 9, {}, [])


def test_failing_op_aborts_the_step_everywhere_and_names_the_node():
    g, p = two_part_graph()
    workers, handles = make_cluster(p.parts)
    bad = np.ones((3, 3), np.float32)  # 3 rows -> b has 6 values: reshape to (2, 2) fails on task 1
    res, err = run_step(p, workers, handles, 5, {"x:0": bad})
    assert D1 in err and "'r'" in str(err[D1])
    # the next step runs normally: the failure did not poison the workers
    res, err = run_step(p, workers, handles, 6, {"x:0": np.ones((2, 3), np.float32)})
    assert not err and res[D1][0].shape == ()


def test_recv_waits_are_bounded_and_abortable():
    t = StepRendezvous(timeout=0.2)
    with pytest.raises(RendezvousTimeout, match="'a:0' from s to d \\(step 3\\)"):
        t.take(("s", "d", "a:0", 3))
    t.put(("s", "d", "a:0", 4), 1)
    with pytest.raises(Exception, match="sent twice"):
        t.put(("s", "d", "a:0", 4), 2)
    threading.Timer(0.05, t.abort_step, args=(8, ValueError("boom"))).start()
    with pytest.raises(RendezvousAborted, match="boom"):
        t.take(("s", "d", "x", 8), timeout=5)
    assert t.take(("s", "d", "a:0", 4)) == 1


def test_register_rejects_bad_graphs_and_devices():
    w = Worker("/job:worker/task:0")
    with pytest.raises(WorkerError, match="cannot register graph"):
        w.register_graph(b"\x00garbage\xff")
    g = ism.Graph()
    with g.as_default():
        ism.constant(1.0, name="c")
    with pytest.raises(WorkerError, match="not one of this task's"):
        w.register_graph(graph_codec.to_bytes(g), "/job:ps/task:0/device:CPU:0")
    h = w.register_graph(graph_codec.to_bytes(g))
    assert w.run_graph(h, 1, {}, ["c:0"])[0] == np.float32(1.0)
    with pytest.raises(WorkerError, match="no node named 'nope'"):
        w.run_graph(h, 2, {}, ["nope:0"])
