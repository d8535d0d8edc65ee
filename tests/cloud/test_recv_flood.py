"""Bounded under abuse (issue 23): RecvTensor's wait is capped by the server, waiting calls
are limited per connection and in all, and a flood of hanging calls does not stall another
client's step (cloud/limits.py, cloud/flood.py)."""
import time

import pytest

grpc = pytest.importorskip("grpc")

from isthmus.cloud import rpc  # noqa: E402
from isthmus.cloud.errors import TooManyWaiting  # noqa: E402
from isthmus.cloud.flood import measure  # noqa: E402
from isthmus.cloud.limits import WaitLimits  # noqa: E402
from isthmus.cloud.server import start_grpc_server  # noqa: E402
from isthmus.cloud.worker import Worker  # noqa: E402
from isthmus.core.rendezvous import RendezvousTimeout  # noqa: E402
from isthmus.proto import worker_pb2  # noqa: E402

SRC, DST = "/job:worker/task:0/device:CPU:0", "/job:x/task:0/device:CPU:0"


def _request(timeout_s):
    return worker_pb2.RecvTensorRequest(src_device=SRC, dst_device=DST, tensor="never", step_id=7,
                                        timeout_s=timeout_s).SerializeToString()


def test_a_flood_of_80_hanging_recvs_delays_another_clients_step_by_under_100_ms():
    got = measure(flood=80, channels=4, steps=40)
    assert got["waiting"] == got["total"] and got["refused"] == 80 - got["total"], got
    # medians of 40 steps each; the unloaded one is measured in the same run, on the same server
    assert got["delta_ms"] <= 100.0, got


def test_without_the_bounds_the_flood_stalls_the_step():
    """The control: the same flood with the admission bounds lifted takes every thread, and a
    step waits until the flood's waits hit their cap (2 s here)."""
    got = measure(flood=80, channels=4, steps=2, unbounded=True, max_wait_s=2.0)
    assert got["loaded_max_ms"] >= 1000.0, got


def test_the_caller_cannot_choose_an_unbounded_wait():
    w = Worker("/job:worker/task:0", recv_timeout=0.5, wire=True)
    server, port = start_grpc_server([rpc.worker_handler(w, WaitLimits(max_wait_s=0.5))])
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary(f"/{rpc.SERVICE}/RecvTensor", request_serializer=None, response_deserializer=None)
            t0 = time.monotonic()
            with pytest.raises(grpc.RpcError) as e:
                call(_request(1e9), timeout=30.0)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "within 0.5 s" in e.value.details()
            assert time.monotonic() - t0 < 10.0
    finally:
        w.table.close()
        server.stop(None).wait(5)


def test_one_connection_may_hold_only_so_many_waiting_calls():
    w = Worker("/job:worker/task:0", recv_timeout=5.0, wire=True)
    limits = WaitLimits(max_wait_s=5.0, per_peer=3, threads=64)
    server, port = start_grpc_server([rpc.worker_handler(w, limits)])
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary(f"/{rpc.SERVICE}/RecvTensor", request_serializer=None, response_deserializer=None)
            futs = [call.future(_request(5.0), timeout=20.0) for _ in range(5)]
            deadline = time.monotonic() + 20
            while (limits.status()["refused"] < 2 or sum(f.done() for f in futs) < 2) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert limits.status() == {"waiting": 3, "peers": 1, "refused": 2}
            refused = [f for f in futs if f.done()]
            assert len(refused) == 2
            for f in refused:
                assert f.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "3 waiting calls from" in f.details()
            w.table.close()   # the task stops: the waiting ones end at once
            for f in futs:
                assert f.exception(timeout=10) is not None
    finally:
        server.stop(None).wait(5)


def test_wait_limits_in_process():
    lim = WaitLimits(max_wait_s=2.0, per_peer=1, total=2)
    assert lim.cap(None, 1.0) == 1.0 and lim.cap(1e9) == 2.0 and lim.cap(0.25) == 0.25 and lim.cap(-1) == 2.0
    with lim.waiting("a", "RecvTensor"), lim.waiting("b", "RecvTensor"):
        with pytest.raises(TooManyWaiting, match="1 waiting calls from a"):
            with lim.waiting("a", "RecvTensor"):
                pass
        with pytest.raises(TooManyWaiting, match="2 waiting calls in all"):
            with lim.waiting("c", "RecvTensor"):
                pass
    assert lim.status() == {"waiting": 0, "peers": 0, "refused": 2}


def test_a_stopping_task_ends_its_waits():
    w = Worker("/job:worker/task:0", recv_timeout=30.0)
    import threading
    errs = []
    t = threading.Thread(target=lambda: errs.append(_take(w)))
    t.start()
    time.sleep(0.1)
    w.close()
    t.join(5)
    assert not t.is_alive() and "stopped" in str(errs[0])


def _take(w):
    try:
        w.recv_tensor(SRC, DST, "never", 1, 30.0)
    except Exception as e:  # noqa: BLE001
        return e
    return None


def test_rendezvous_timeout_is_still_a_timeout():
    w = Worker("/job:worker/task:0", recv_timeout=0.05)
    with pytest.raises(RendezvousTimeout):
        w.recv_tensor(SRC, DST, "never", 1)
