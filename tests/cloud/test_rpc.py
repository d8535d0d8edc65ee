"""The Worker over gRPC on 127.0.0.1: every RPC with a deadline, servers stopped per test."""
import socket
import threading

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

from isthmus.cloud import graph_codec, rpc  # noqa: E402
from isthmus.cloud.server import serve_worker  # noqa: E402
from isthmus.wire import tensor_codec  # noqa: E402
from isthmus.cloud.errors import HandleNotFound, TaskUnavailable  # noqa: E402
from isthmus.cloud.worker import Worker, WorkerError  # noqa: E402
from isthmus.core.errors import ExecutionError  # noqa: E402
from isthmus.core.rendezvous import RendezvousTimeout  # noqa: E402
from isthmus.proto import tensor_pb2, worker_pb2, worker_pb2_grpc  # noqa: E402

from .test_worker import D0, D1, two_part_graph  # noqa: E402


@pytest.fixture
def cluster():
    clients, servers = {}, []
    peers = lambda dev: clients[dev]  # noqa: E731
    for dev, task in ((D0, "/job:worker/task:0"), (D1, "/job:worker/task:1")):
        w = Worker(task, peers=peers, recv_timeout=5.0, wire=True, inline_bytes=1 << 20, chunk_bytes=1 << 20)
        server, port = serve_worker(w)
        servers.append(server)
        # the gRPC path itself (same-host shared memory: tests/cloud/test_shm.py)
        clients[dev] = rpc.WorkerClient(f"127.0.0.1:{port}", timeout=10.0, name=task, shm_enabled=False)
    yield clients
    for c in clients.values():
        c.close()
    for s in servers:
        s.stop(grace=None).wait(5)


def test_partition_runs_across_two_servers(cluster):
    import isthmus as ism
    g, p = two_part_graph()
    handles = {d: cluster[d].register_graph(graph_codec.to_bytes(part.graph), d) for d, part in p.parts.items()}
    local = ism.Session(g)
    for step in (11, 12):
        xv = np.random.default_rng(step).standard_normal((2, 3)).astype(np.float32)
        out, err = {}, []

        def go(d):
            part = p.parts[d]
            feeds = {"x:0": xv} if "x" in part.graph else {}
            try:
                out[d] = cluster[d].run_graph(handles[d], step, feeds, part.fetches, timeout=10)
            except Exception as e:  # noqa: BLE001
                err.append(e)
        ts = [threading.Thread(target=go, args=(d,)) for d in p.parts]
        [t.start() for t in ts]
        [t.join(20) for t in ts]
        assert not err, err
        want = local.run(g.tensor("c:0"), {g.tensor("x:0"): xv})
        assert out[D1][0].tobytes() == np.asarray(want).tobytes()
    st = cluster[D0].status()
    assert st["steps_run"] == 2 and st["handles"] == [handles[D0]]
    cluster[D0].deregister_graph(handles[D0])
    with pytest.raises(HandleNotFound, match=r"no registered graph .*\[on /job:worker/task:0\]"):
        cluster[D0].deregister_graph(handles[D0])


def test_large_tensor_streams_in_chunks(cluster):
    import isthmus as ism
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (None,), name="x")
        from isthmus.core.ops.comm import send
        send(x, f"{D0};{D1};x:0", D0, D1, name="send_x")
    h = cluster[D0].register_graph(g, D0)
    big = np.random.default_rng(0).standard_normal(3 << 20).astype(np.float32)  # 12 MiB
    cluster[D0].run_graph(h, 1, {"x:0": big}, ["send_x"])
    req = worker_pb2.RecvTensorRequest(src_device=D0, dst_device=D1, tensor="x:0", step_id=1, timeout_s=5)
    stub = worker_pb2_grpc.WorkerStub(cluster[D0].channel)  # a plain protobuf client reads the same bytes
    head = stub.RecvTensor(req, timeout=10)
    assert head.streamed and list(head.tensor.shape) == [3 << 20] and not head.tensor.content
    chunks = list(stub.RecvTensorStream(req, timeout=10))
    assert len(chunks) == 12 and all(len(c.data) <= 1 << 20 for c in chunks)
    assert tensor_codec.decode_chunks(chunks).tobytes() == big.tobytes()
    for step, value in ((2, big[:10]), (3, big)):
        cluster[D0].run_graph(h, step, {"x:0": value}, ["send_x"])
        got = cluster[D0].recv_tensor(D0, D1, "x:0", step, timeout=5)
        assert got.dtype == np.float32 and got.tobytes() == value.tobytes()
    small = worker_pb2.RecvTensorRequest(src_device=D0, dst_device=D1, tensor="x:0", step_id=4, timeout_s=5)
    cluster[D0].run_graph(h, 4, {"x:0": big[:3]}, ["send_x"])
    whole = stub.RecvTensor(small, timeout=10)
    assert not whole.streamed and tensor_codec.decode(whole.tensor).tolist() == big[:3].tolist()


def test_malformed_requests_rejected_and_server_keeps_serving(cluster):
    import isthmus as ism
    c = cluster[D0]
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (2,), name="x")
        ism.identity(x * 2.0, name="y")
    h = c.register_graph(g)
    bad = worker_pb2.RunGraphRequest(handle=h, step_id=1, fetches=["y:0"])
    bad.feeds.add(name="x:0", tensor=tensor_pb2.TensorProto(dtype=tensor_pb2.DT_FLOAT32, shape=[2], content=b"123"))
    stub = worker_pb2_grpc.WorkerStub(c.channel)
    with pytest.raises(grpc.RpcError) as ei:
        stub.RunGraph(bad, timeout=5)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "needs 8 payload bytes" in ei.value.details()
    bad.feeds[0].tensor.CopyFrom(tensor_pb2.TensorProto(dtype=99, shape=[2], content=b"\0" * 8))
    with pytest.raises(grpc.RpcError, match="unknown dtype"):
        stub.RunGraph(bad, timeout=5)
    bad.feeds[0].tensor.CopyFrom(tensor_pb2.TensorProto(dtype=1, shape=[-2], content=b""))
    with pytest.raises(grpc.RpcError, match="negative"):
        stub.RunGraph(bad, timeout=5)
    bad.feeds[0].tensor.CopyFrom(tensor_pb2.TensorProto(dtype=2, shape=[1 << 40, 1 << 20], content=b""))
    with pytest.raises(grpc.RpcError, match="over the limit"):
        stub.RunGraph(bad, timeout=5)
    with pytest.raises(WorkerError, match="cannot register"):
        c._call("RegisterGraph", worker_pb2.RegisterGraphRequest(
            graph=graph_codec.graph_pb2.GraphDef(version=42)))
    with pytest.raises(RendezvousTimeout, match="nothing arrived"):
        c.recv_tensor(D0, D1, "nothing:0", 3, timeout=0.2)
    # still serving
    assert c.run_graph(h, 2, {"x:0": np.array([1, 2], np.float32)}, ["y:0"])[0].tolist() == [2.0, 4.0]


def test_failing_op_reaches_the_client_with_the_node_name(cluster):
    import isthmus as ism
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (None,), name="x")
        ism.reshape(x, (2, 2), name="needs_four")
    h = cluster[D0].register_graph(g)
    with pytest.raises(ExecutionError, match=r"node 'needs_four' \(Reshape\).*\[on /job:worker/task:0\]") as ei:
        cluster[D0].run_graph(h, 1, {"x:0": np.ones(3, np.float32)}, ["needs_four:0"])
    assert ei.value.node_name == "needs_four" and ei.value.op == "Reshape"


def test_unreachable_task_named_with_its_address():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with rpc.WorkerClient(f"127.0.0.1:{port}", timeout=0.5, name="/job:ps/task:3") as c:
        with pytest.raises(TaskUnavailable, match=rf"/job:ps/task:3 at 127.0.0.1:{port} is unreachable"):
            c.status()


def test_health_service(cluster):
    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    from grpc_health.v1 import health_pb2_grpc
    stub = health_pb2_grpc.HealthStub(cluster[D0].channel)
    for service in ("", "isthmus.Worker"):
        r = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert r.status == health_pb2.HealthCheckResponse.SERVING


def test_a_key_that_streamed_asks_for_the_stream_at_once(cluster):
    import isthmus as ism
    from isthmus.core.ops.comm import send
    from isthmus.core.rendezvous import RendezvousAborted
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (None,), name="x")
        send(x, f"{D0};{D1};x:0", D0, D1, name="send_x")
    c = cluster[D0]
    h = c.register_graph(g, D0)
    calls = []
    unary, stream = c._recv, c._recv_stream
    c._recv = lambda *a, **k: calls.append("unary") or unary(*a, **k)
    c._recv_stream = lambda *a, **k: calls.append("stream") or stream(*a, **k)
    rng = np.random.default_rng(5)
    big = rng.standard_normal(3 << 18).astype(np.float32)           # 3 MiB: three 1 MiB chunks
    one = rng.standard_normal(1 << 18).astype(np.float32)           # exactly one chunk
    small = rng.standard_normal(5).astype(np.float32)
    expect = [(big, ["unary", "stream"]), (big * 2, ["stream"]), (one, ["stream"]), (small, ["stream"]),
              (small + 1, ["unary"])]
    for step, (value, want_calls) in enumerate(expect, start=1):
        c.run_graph(h, step, {"x:0": value}, ["send_x"])
        calls.clear()
        got = c.recv_tensor(D0, D1, "x:0", step, timeout=5)
        assert calls == want_calls, (step, calls)
        assert got.dtype == np.float32 and got.shape == value.shape and got.tobytes() == value.tobytes()
    assert not got.flags.writeable or got.size == 0  # small: a view of the message
    # the stream asked for directly waits for its Send, and fails as the unary call would
    c.run_graph(h, 10, {"x:0": big}, ["send_x"])
    c.recv_tensor(D0, D1, "x:0", 10, timeout=5)  # streamed again: the key asks for the stream
    calls.clear()
    later = threading.Timer(0.3, lambda: c.run_graph(h, 11, {"x:0": big[:5]}, ["send_x"]))
    later.start()
    got = c.recv_tensor(D0, D1, "x:0", 11, timeout=5)
    later.join(5)
    assert calls == ["stream"] and got.tobytes() == big[:5].tobytes()
    c.run_graph(h, 12, {"x:0": big}, ["send_x"])
    c.recv_tensor(D0, D1, "x:0", 12, timeout=5)
    with pytest.raises(RendezvousTimeout, match=r"nothing arrived for 'x:0'.*step 13"):
        c.recv_tensor(D0, D1, "x:0", 13, timeout=0.2)
    threading.Timer(0.2, lambda: c.abort_step(14, RuntimeError("boom elsewhere"))).start()
    with pytest.raises(RendezvousAborted, match="boom elsewhere"):
        c.recv_tensor(D0, D1, "x:0", 14, timeout=5)


def test_recv_requests_are_protobufs_own_bytes():
    c = rpc.WorkerClient("127.0.0.1:1", timeout=1.0, shm_enabled=False)
    try:
        for step, t in ((0, 0.0), (1, 30.0), ((1 << 62) - 1, 1.5), (-7, 2.0), (12345, 0.0)):
            key = (D0, D1, "x:0")
            want = worker_pb2.RecvTensorRequest(src_device=D0, dst_device=D1, tensor="x:0", step_id=step,
                                                timeout_s=t).SerializeToString(deterministic=True)
            assert c.recv_request(key, step, t) == want
            back = worker_pb2.RecvTensorRequest.FromString(c.recv_request(key, step, t))
            assert (back.step_id, back.timeout_s, back.tensor) == (step, t, "x:0")
    finally:
        c.close()


@pytest.mark.parametrize("method", ["RegisterGraph", "RunGraph", "RecvTensor", "AbortStep", "DeregisterGraph",
                                    "GetStatus"])
def test_undecodable_request_bytes_get_invalid_argument(cluster, method):
    """Bytes protobuf cannot parse end INVALID_ARGUMENT naming the method (gRPC's own answer
    would be INTERNAL), and the server keeps serving."""
    call = cluster[D0].channel.unary_unary(f"/isthmus.Worker/{method}", request_serializer=None,
                                           response_deserializer=None)
    for junk in (b"\xff\xff\xff", b"\x0a\x80\x80\x80\x80\x10", b"\x12\x05ab"):
        with pytest.raises(grpc.RpcError) as ei:
            call(junk, timeout=5)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (junk, ei.value.details())
        assert f"/isthmus.Worker/{method}: malformed request bytes" in ei.value.details()
    assert cluster[D0].status()["task"]
