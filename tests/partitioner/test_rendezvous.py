"""The in-process rendezvous and the Send/Recv ops over it."""
import threading
import time

import numpy as np
import pytest

import isthmus as ism
from isthmus.core.ops.comm import recv, send
from isthmus.core.rendezvous import InProcessRendezvous, RendezvousAborted, RendezvousError, RendezvousTimeout


def test_values_meet_by_key_and_waits_are_bounded():
    rv = InProcessRendezvous(timeout=5)
    threading.Timer(0.05, rv.send, args=(("k", 0), 41)).start()
    assert rv.recv(("k", 0)) == 41  # waited for it
    rv.send(("k", 1), 42)
    with pytest.raises(RendezvousError, match="sent twice"):
        rv.send(("k", 1), 43)
    assert rv.recv(("k", 1)) == 42
    t0 = time.perf_counter()
    with pytest.raises(RendezvousTimeout, match="'a;b;x:0' \\(step 7\\)"):
        rv.recv(("a;b;x:0", 7), timeout=0.05)
    assert time.perf_counter() - t0 < 1


def test_abort_wakes_every_waiter():
    rv = InProcessRendezvous(timeout=30)
    errors = []

    def wait():
        try:
            rv.recv(("never", 0))
        except RendezvousAborted as e:
            errors.append(e)
    threads = [threading.Thread(target=wait) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.02)
    rv.abort(ValueError("a part failed"))
    for t in threads:
        t.join(2)
    assert len(errors) == 3 and "a part failed" in str(errors[0])


def test_emulated_link_delays_delivery():
    rv = InProcessRendezvous(timeout=5, delay=lambda key, v: 0.05)
    t0 = time.perf_counter()
    rv.send(("k", 0), 1)
    assert rv.recv(("k", 0)) == 1
    assert time.perf_counter() - t0 >= 0.05


def test_send_and_recv_ops_pair_steps_in_order():
    rv = InProcessRendezvous(timeout=5)
    a, b = ism.Graph(), ism.Graph()
    with a.as_default():
        x = ism.placeholder("float32", (2,), name="x")
        s = send(ism.tanh(x), "a;b;t:0", "a", "b")
    with b.as_default():
        y = recv("a;b;t:0", "a", "b", "float32", (2,)) * 2.0
        bad = recv("a;b;u:0", "a", "b", "int32", (2,))
    sa, sb = ism.Session(a, rendezvous=rv), ism.Session(b, rendezvous=rv)
    for i in range(3):
        sa.run(s, {x: np.full(2, i, np.float32)})
    for i in range(3):
        np.testing.assert_allclose(sb.run(y), 2 * np.tanh(np.full(2, i, np.float32)), rtol=1e-6)
    rv.send(("a;b;u:0", 0), np.zeros(2, np.float32))
    with pytest.raises(ism.ExecutionError, match="carried float32\\[2\\]; expected int32\\[2\\]"):
        sb.run(bad)
    with pytest.raises(ism.ExecutionError, match="needs a rendezvous for key 'a;b;t:0'"):
        ism.Session(b).run(y)


def test_an_emulated_link_delays_each_transfer_by_its_size():
    from isthmus.partitioner import CLOUD_DEVICE, EDGE_DEVICE, LinkModel, partition
    from isthmus.partitioner.runner import SplitSession, emulated_link
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (25_000,), name="x")  # 100 KB
        y = ism.tanh(x, name="y")
    P = partition(g, {"x": EDGE_DEVICE, "y": CLOUD_DEVICE}, [y], return_to=EDGE_DEVICE)
    link = LinkModel(8e6, 16e6, 0.02)  # 100 KB: 0.1 s up + 0.05 s down + one round trip
    rv = InProcessRendezvous(timeout=5, delay=emulated_link(link, EDGE_DEVICE))
    with SplitSession(P, rendezvous=rv) as s:
        t0 = time.perf_counter()
        s.run({"x": np.zeros(25_000, np.float32)})
        assert 0.17 <= time.perf_counter() - t0 < 2.0  # generous: the CPUs are shared
