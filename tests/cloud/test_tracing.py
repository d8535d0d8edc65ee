"""Tracing a distributed step: every task's node events on one timeline, each Send matched by
its Recv with the bytes it carried, Chrome JSON with flow arrows; malformed traces refused."""
import json
import math

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import isthmus as ism  # noqa: E402
from isthmus import nn  # noqa: E402
from isthmus.cloud import rpc, tracing  # noqa: E402
from isthmus.cloud.cluster import ClusterSpec  # noqa: E402
from isthmus.cloud.server import Server, start_grpc_server  # noqa: E402
from isthmus.cloud.session import DistributedSession  # noqa: E402
from isthmus.cloud.worker import Worker, WorkerError  # noqa: E402
from isthmus.proto import worker_pb2  # noqa: E402

PS, WK = "/job:ps/task:0/device:CPU:0", "/job:worker/task:0/device:CPU:0"


@pytest.fixture
def two_tasks():
    """A ps task and a worker task as gRPC servers on free loopback ports."""
    made = {job: Server(None, job, 0, port=0, step_timeout=20.0, recv_timeout=10.0) for job in ("ps", "worker")}
    spec = ClusterSpec({job: [f"127.0.0.1:{s.port}"] for job, s in made.items()})
    for s in made.values():
        s.set_cluster(spec)
    yield made
    for s in made.values():
        s.stop()


def mlp():
    g = ism.Graph(seed=3)
    with g.as_default():
        x = ism.placeholder("float32", (None, 16), name="x")
        y = ism.placeholder("int32", (None,), name="y")
        net = nn.Sequential([nn.Dense(12, activation="relu", name="h"), nn.Dense(4, name="out")])
        loss = nn.sparse_softmax_cross_entropy(y, net(x, training=True))
        train = ism.optimizers.Momentum(0.1).minimize(loss)
        init = ism.global_variables_initializer()
    return g, x, y, loss, train, init


def batches(n=3):
    rng = np.random.default_rng(1)
    return [(rng.random((6, 16), dtype=np.float32), rng.integers(0, 4, 6).astype(np.int32)) for _ in range(n)]


def test_traced_distributed_step(two_tasks, tmp_path):
    g, x, y, loss, train, init = mlp()
    local = ism.Session(g)
    local.run(init)
    want = [np.asarray(local.run([loss, train], {x: xb, y: yb})[0]).tobytes() for xb, yb in batches()]

    g, x, y, loss, train, init = mlp()
    shapes = {n.name: tuple(n.outputs[0].shape) for n in g.nodes if n.op == "Variable"}
    mds = []
    with DistributedSession(g, two_tasks["worker"].target) as s:
        s.run(init)
        got = []
        for xb, yb in batches():  # every step traced: the same training, bit for bit
            md = ism.RunMetadata()
            got.append(np.asarray(s.run([loss, train], {x: xb, y: yb}, options=ism.RunOptions(trace=True),
                                        run_metadata=md)[0]).tobytes())
            mds.append(md)
    assert got == want
    md = mds[-1]
    devices = {e.device for e in md.events}
    assert devices == {PS, WK}  # both tasks' events, each on its part's device
    assert md.origin_s is not None and abs(md.origin_s - __import__("time").time()) < 60
    sends = [e for e in md.events if e.op == "Send"]
    recvs = [e for e in md.events if e.op == "Recv"]
    transfers = md.transfers()
    assert sends and len(transfers) == len(sends) == len(recvs)
    assert {id(t.recv) for t in transfers} == {id(r) for r in recvs}  # every Recv matched once
    var_bytes = 0
    for t in transfers:
        assert t.send.key == t.recv.key and t.send.step == t.recv.step != -1
        assert t.send.device == t.src_device != t.recv.device == t.dst_device and t.cross_task
        assert t.nbytes == t.send.transfer_bytes == t.recv.transfer_bytes > 0
        assert t.send.start_us <= t.recv.end_us + 1e3  # one clock for both tasks (1 ms slack)
        assert 0.0 <= t.transit_us <= t.recv.end_us - t.recv.start_us + 1e-6
        var = t.tensor.split(":")[0]
        if var in shapes:  # a variable read on the ps task and sent to the worker: its exact size
            assert t.nbytes == 4 * math.prod(shapes[var]) and t.src_device == PS
            var_bytes += t.nbytes
    assert var_bytes == 4 * (16 * 12 + 12 + 12 * 4 + 4)  # every variable crossed once

    data = json.loads(json.dumps(md.to_chrome_trace()))
    ev = data["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M"}
    assert set(procs.values()) == {PS, WK}
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert len(starts) == len(transfers) and starts.keys() == ends.keys()
    for i, s_ in starts.items():
        f = ends[i]
        assert procs[s_["pid"]] == s_["args"]["src"] != procs[f["pid"]] == f["args"]["dst"] and f["bp"] == "e"
        assert s_["args"]["bytes"] == f["args"]["bytes"] > 0
    assert {procs[e["pid"]] for e in starts.values()} == {PS, WK}  # variables out, gradients back
    assert {e["cat"] for e in ev if e["ph"] == "X"} >= {"Send", "Recv", "MatMul"}
    assert data["otherData"]["origin_unix_s"] == md.origin_s
    md.write_chrome_trace(str(tmp_path / "step.json"))  # and the calibrator still reads it
    from isthmus.partitioner.trace_fit import samples_from_trace
    assert any(s.op == "MatMul" for s in samples_from_trace([str(tmp_path / "step.json")]))


def test_tracing_off_sets_no_trace_field():
    """An untraced RunGraph carries and returns no trace (nothing extra on the wire)."""
    from isthmus.partitioner.partition import partition
    D0, D1 = WK, "/job:worker/task:1/device:CPU:0"
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (None, 3), name="x")
        a = ism.mul(x, 2.0, name="a")
        ism.tanh(a, name="b")
    p = partition(g, {"x": D0, "a": D0, "b": D1}, outputs=["b:0"])
    w = Worker("/job:worker/task:0", devices=[D0])
    part = p.parts[D0]
    h = w.register_graph(part.graph, D0)
    servicer = rpc.WorkerServicer(w)
    xv = np.ones((2, 3), np.float32)
    from isthmus.wire import tensor_codec
    req = worker_pb2.RunGraphRequest(handle=h, step_id=1, fetches=part.fetches)
    tensor_codec.encode(xv, out=req.feeds.add(name="x:0").tensor)
    resp = servicer.RunGraph(req, None)
    assert not resp.HasField("trace")
    req.step_id, req.trace = 2, True
    resp = servicer.RunGraph(req, None)
    md = tracing.decode(resp.trace, "test")
    assert {e.device for e in md.events} == {D0} and any(e.op == "Send" and e.step == 2 for e in md.events)


def _event(**kw):
    base = dict(node="n", op="MatMul", device=WK, thread=1, start_us=1.0, end_us=2.0, groups=1)
    base.update(kw)
    return base


@pytest.mark.parametrize("change, message", [
    (dict(start_us=float("nan")), r"event 0 \('n'\): field 'start_us'"),
    (dict(end_us=0.5), r"ends \(0.5 us\) before it starts"),
    (dict(flops=-1.0), r"field 'flops'"),
    (dict(transfer_bytes=-5), r"field 'transfer_bytes'"),
    (dict(node="x" * 5000), r"field 'node' is 5000 characters"),
    (dict(device=""), r"field 'device' is empty"),
    (dict(key="a;b;c"), r"field 'key' 'a;b;c' is not a Send/Recv key"),
    (dict(op="Send", key="nosemicolons"), r"field 'key'"),
    (dict(groups=0), r"field 'groups'"),
])
def test_malformed_events_are_refused(change, message):
    st = worker_pb2.StepTrace(origin_s=1.7e9)
    st.events.add(**_event(**change))
    with pytest.raises(tracing.TraceDecodeError, match=message):
        tracing.decode(st, "task A")


def test_bounded_and_bad_origin():
    st = worker_pb2.StepTrace(origin_s=1.7e9)
    for _ in range(5):
        st.events.add(**_event())
    with pytest.raises(tracing.TraceDecodeError, match="5 trace events; at most 4"):
        tracing.decode(st, "task A", max_events=4)
    assert len(tracing.decode(st, "task A").events) == 5
    st.origin_s = float("inf")
    with pytest.raises(tracing.TraceDecodeError, match="origin_s"):
        tracing.decode(st, "task A")


def test_a_task_returning_a_malformed_trace_fails_the_call_clearly():
    """A (broken or hostile) task answers a traced RunGraph with an event that ends before it starts."""
    def run_graph(request, context):
        resp = worker_pb2.RunGraphResponse()
        resp.trace.origin_s = 1.7e9
        resp.trace.events.add(**_event(node="evil", start_us=10.0, end_us=1.0))
        return resp
    handler = grpc.method_handlers_generic_handler(rpc.SERVICE, {"RunGraph": grpc.unary_unary_rpc_method_handler(
        run_graph, request_deserializer=worker_pb2.RunGraphRequest.FromString,
        response_serializer=lambda m: m.SerializeToString())})
    server, port = start_grpc_server([handler], "127.0.0.1", 0, 4, 1 << 20)
    try:
        with rpc.WorkerClient(f"127.0.0.1:{port}", timeout=5.0, name="/job:evil/task:0") as c:
            assert c.run_graph("h", 1, {}, [], timeout=5.0) == []  # untraced: the trace is not read
            with pytest.raises(WorkerError, match=r"/job:evil/task:0: malformed trace: .*'evil'.*ends"):
                c.run_graph("h", 1, {}, [], timeout=5.0, run_metadata=ism.RunMetadata())
    finally:
        server.stop(None).wait(5)


def test_traced_step_with_in_process_workers():
    """The master driving in-process Workers (no network): the same events and transfers."""
    from tests.cloud.test_master import in_process
    master, _ = in_process({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]})
    try:
        g, x, y, loss, train, init = mlp()
        (xb, yb), = batches(1)
        with DistributedSession(g, master=master) as s:
            s.run(init)
            plain = s.run(loss, {x: xb, y: yb})
            md = ism.RunMetadata()
            traced = s.run(loss, {x: xb, y: yb}, options=ism.RunOptions(trace=True), run_metadata=md)
        assert np.asarray(traced).tobytes() == np.asarray(plain).tobytes()
        ts = md.transfers()
        assert {e.device for e in md.events} == {PS, WK} and ts
        assert len(ts) == sum(e.op == "Recv" for e in md.events) == sum(e.op == "Send" for e in md.events)
        assert all(t.src_device == PS and t.dst_device == WK and t.nbytes > 0 for t in ts)  # reads only
    finally:
        master.close()


def test_a_master_returning_a_bad_trace_fails_the_step_clearly():
    from isthmus.cloud.master_rpc import MasterClient
    from isthmus.proto import master_pb2
    answers = iter(["none", "bad"])

    def run_step(request, context):
        resp = master_pb2.RunStepResponse(step_id=7)
        if next(answers) == "bad":
            resp.trace.origin_s = float("nan")
        return resp
    handler = grpc.method_handlers_generic_handler("isthmus.Master", {"RunStep": grpc.unary_unary_rpc_method_handler(
        run_step, request_deserializer=master_pb2.RunStepRequest.FromString,
        response_serializer=lambda m: m.SerializeToString())})
    server, port = start_grpc_server([handler], "127.0.0.1", 0, 4, 1 << 20)
    c = MasterClient(f"127.0.0.1:{port}", timeout=5.0)
    try:
        with pytest.raises(WorkerError, match="RunStep was asked for a trace and returned none"):
            c.run_step("s", {}, [], timeout=5.0, run_metadata=ism.RunMetadata())
        with pytest.raises(WorkerError, match="malformed trace: .*origin_s nan"):
            c.run_step("s", {}, [], timeout=5.0, run_metadata=ism.RunMetadata())
    finally:
        c.close()
        server.stop(None).wait(5)


def test_traced_step_across_processes():
    """Tasks in their own processes (LocalCluster): each process times its events against its own
    origin; the merged trace still puts every Send before the Recv that took its value."""
    from isthmus.cloud.local_cluster import LocalCluster
    g, x, y, loss, train, init = mlp()
    (xb, yb), = batches(1)
    with LocalCluster({"ps": 1, "worker": 1}, timeout=60.0, recv_timeout=10.0) as c:
        with DistributedSession(g, c.target, timeout=20.0) as s:
            s.run(init)
            plain = s.run(loss, {x: xb, y: yb})
            md = ism.RunMetadata()
            traced = s.run(loss, {x: xb, y: yb}, options=ism.RunOptions(trace=True), run_metadata=md)
    assert np.asarray(traced).tobytes() == np.asarray(plain).tobytes()
    ts = md.transfers()
    assert {e.device for e in md.events} == {PS, WK} and len(ts) == 4  # the 4 variables, read once
    assert sorted(t.nbytes for t in ts) == sorted(4 * n for n in (16 * 12, 12, 12 * 4, 4))
    for t in ts:
        assert t.cross_task and t.send.step == t.recv.step
        assert t.send.start_us <= t.recv.end_us + 5e3  # one wall clock for both processes (5 ms slack)
