"""The offload service's request path: answers built as raw bytes, no fixed batch wait, the
per-request overhead it measures and publishes, and traced requests (InferResponse.trace).

Servers listen on 127.0.0.1:0 and stop at the end of each test; every RPC has a deadline.
"""
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import isthmus as ism  # noqa: E402
from isthmus.cloud import tracing  # noqa: E402
from isthmus.wire import tensor_codec  # noqa: E402
from isthmus.cloud.offload import InferResult, OffloadServer, response_bytes  # noqa: E402
from isthmus.cloud.offload_model import CloudModel, cloud_part  # noqa: E402
from isthmus.core.trace import RunMetadata  # noqa: E402
from isthmus.proto import offload_pb2, offload_pb2_grpc  # noqa: E402

W = np.random.default_rng(3).integers(-2, 3, (8, 4)).astype(np.float32)


@pytest.fixture(scope="module")
def model():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 8), name="x")
        y = ism.relu(ism.matmul(x, ism.constant(W, name="w"), name="mm"), name="y")
    return CloudModel("small", {"dense": cloud_part(g, [x], [y], "dense")})


def _request(xv, trace=False):
    req = offload_pb2.InferRequest(part="dense", request_id="q7", trace=trace)
    tensor_codec.encode(xv, out=req.inputs.add(name="x:0").tensor)
    return req


def _rows(n, seed=0):
    return np.random.default_rng(seed).integers(-3, 4, (n, 8)).astype(np.float32)


@pytest.mark.parametrize("outputs", [
    [("y:0", np.arange(12, dtype=np.float32).reshape(3, 4))],
    [("a", np.zeros((0, 5), np.float32)), ("b/é:1", np.array([1, -2, 3], np.int64))],
    [("s", np.float64(2.5)), ("big", np.arange(70000, dtype=np.int16).reshape(2, 35000)[:, ::1])],
    [("bool", np.array([[True, False]])), ("u8", np.arange(200, dtype=np.uint8))],
])
def test_answers_are_the_bytes_protobuf_writes(outputs):
    res = InferResult([v for _, v in outputs], 1.25, 3.5, 17)
    want = offload_pb2.InferResponse(request_id="rid-1", queue_ms=1.25, compute_ms=3.5, batch_size=17)
    for name, v in outputs:
        tensor_codec.encode(np.asarray(v), out=want.outputs.add(name=name).tensor)
    got = response_bytes("rid-1", res, outputs)
    assert got == want.SerializeToString()
    back = offload_pb2.InferResponse.FromString(got)
    for (name, v), nt in zip(outputs, back.outputs):
        assert nt.name == name
        np.testing.assert_array_equal(tensor_codec.decode(nt.tensor), v)


def test_a_lone_request_does_not_wait_for_its_batch_to_fill(model):
    # a batch waits to fill only while more requests are on their way in; alone, it runs at once
    with OffloadServer(model, max_batch_size=64, max_queue_delay_ms=3000) as srv:
        with grpc.insecure_channel(srv.address) as ch:
            stub = offload_pb2_grpc.OffloadStub(ch)
            stub.Infer(_request(_rows(1)), timeout=10)  # connected, plan compiled
            t0 = time.monotonic()
            r = stub.Infer(_request(_rows(2, 1)), timeout=10)
            assert time.monotonic() - t0 < 1.5 and r.queue_ms < 1500  # far below the 3 s max delay
            np.testing.assert_array_equal(tensor_codec.decode(r.outputs[0].tensor), np.maximum(_rows(2, 1) @ W, 0))
            assert r.request_id == "q7" and r.batch_size == 2 and not r.HasField("trace")


@pytest.mark.cpu  # names the CPU plan's kernels
def test_a_traced_request_answers_its_service_spans_on_the_callers_timeline(model):
    with OffloadServer(model, max_batch_size=64, max_queue_delay_ms=2) as srv:
        with grpc.insecure_channel(srv.address) as ch:
            stub = offload_pb2_grpc.OffloadStub(ch)
            stub.Infer(_request(_rows(1)), timeout=10)
            client = RunMetadata()
            t_send = time.time()
            r = stub.Infer(_request(_rows(3, 2), trace=True), timeout=10)
            t_recv = time.time()
    np.testing.assert_array_equal(tensor_codec.decode(r.outputs[0].tensor), np.maximum(_rows(3, 2) @ W, 0))
    md = tracing.decode(r.trace, where="offload")           # strict: a malformed trace would raise
    spans = [e for e in md.events if e.op.startswith("Offload")]
    assert [e.op for e in spans] == ["OffloadDecode", "OffloadQueue", "OffloadBatch", "OffloadHandoff",
                                     "OffloadEncode"]
    for a, b in zip(spans, spans[1:]):                    # back to back, in order
        assert a.end_us <= b.start_us + 1e-3 and a.start_us <= a.end_us
    batch = spans[2]
    assert "3 rows, 1 requests" in batch.node and spans[0].bytes_out == 3 * 8 * 4
    nodes = [e for e in md.events if not e.op.startswith("Offload")]
    assert [e.node for e in nodes] == ["mm", "y"]         # the part's nodes, traced
    for e in nodes:                                       # the part's nodes ran inside the batch span
        assert batch.start_us - 1 <= e.start_us <= e.end_us <= batch.end_us + 1
        assert e.device == srv.service.trace_device and e.thread == batch.thread
    # merged onto a client's timeline, the service's time falls inside the client's call
    client.origin_s = t_send
    client.merge(md)
    lo, hi = min(e.start_us for e in client.events), max(e.end_us for e in client.events)
    assert 0 <= lo and hi <= (t_recv - t_send) * 1e6 + 1e3
    assert spans[-1].end_us - spans[0].start_us <= (t_recv - t_send) * 1e6 + 1e3
    chrome = client.to_chrome_trace()
    assert any(ev.get("name", "").endswith("/encode") for ev in chrome["traceEvents"])


def test_stats_and_describe_publish_the_per_request_overhead(model):
    with OffloadServer(model, max_batch_size=64, max_queue_delay_ms=2) as srv:
        with grpc.insecure_channel(srv.address) as ch:
            stub = offload_pb2_grpc.OffloadStub(ch)
            assert stub.Describe(offload_pb2.DescribeRequest(), timeout=10).overhead_ms == 0.0  # not measured yet
            m = srv.measure_overhead(requests=20)
            assert m["part"] == "dense" and m["rows"] == 1 and m["requests"] == 20
            assert 0 < m["compute_ms"] < m["rtt_ms"] and 0 < m["overhead_ms"] < m["rtt_ms"]
            assert m["overhead_ms"] == pytest.approx(m["rtt_ms"] - m["compute_ms"], rel=0.5)
            assert 0 < m["server_ms"] < m["rtt_ms"]
            assert stub.Describe(offload_pb2.DescribeRequest(), timeout=10).overhead_ms == m["overhead_ms"]
            st = stub.Stats(offload_pb2.StatsRequest(), timeout=10)
            assert st.requests == 25 and 0 < st.overhead_p50_ms and 0 < st.compute_p50_ms
            assert 0 <= st.queue_p50_ms <= st.overhead_p50_ms


def test_measuring_a_secured_server_needs_the_clients_credentials(model):
    from isthmus.wire.security import ClientSecurity, ServerSecurity
    with OffloadServer(model, security=ServerSecurity(token="tok-123456")) as srv:
        with pytest.raises(ValueError, match="client_security"):
            srv.measure_overhead(requests=2)
        m = srv.measure_overhead(requests=3, client_security=ClientSecurity(token="tok-123456", tls=False))
        assert m["overhead_ms"] > 0


def test_warm_up_runs_every_batch_size_without_touching_the_counters(model):
    from isthmus.cloud.offload import OffloadService
    svc = OffloadService(model, max_batch_size=5)
    try:
        assert svc.warm_up() == 6 and svc.warm_up([2, 64]) == 2   # 1, 2, 4, 5, 5, 5
        s = svc.stats()
        assert (s["requests"], s["batches"]) == (0, 0)
        r = svc.infer("dense", {"x:0": _rows(2, 4)}, timeout=10)
        np.testing.assert_array_equal(r.outputs[0], np.maximum(_rows(2, 4) @ W, 0))
    finally:
        svc.close()
