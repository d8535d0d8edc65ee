"""The offload service (cloud/offload.py) and its cloud-parts file (cloud/offload_model.py).

Graph values are small integers held in float32, so every sum is exact whatever the batch
composition and BLAS blocking: rows routed back from a batch must equal the hand-numpy rows
bit for bit. Servers listen on 127.0.0.1:0 and are stopped by their fixtures; every RPC has a
deadline.
"""
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import isthmus as ism  # noqa: E402
from isthmus.wire import tensor_codec  # noqa: E402
from isthmus.cloud.offload import (DeadlineExceeded, InvalidRequest, OffloadServer, OffloadService,  # noqa: E402
                                   Overloaded)
from isthmus.cloud.offload_model import (MAGIC, CloudModel, CloudPartsError, cloud_part,  # noqa: E402
                                         cloud_part_from_partition, cloud_parts_from_plans, load_cloud_parts,
                                         save_cloud_parts)
from isthmus.partitioner import partition  # noqa: E402
from isthmus.partitioner.devices import CLOUD_DEVICE, EDGE_DEVICE  # noqa: E402
from isthmus.proto import offload_pb2, offload_pb2_grpc  # noqa: E402

RNG = np.random.default_rng(7)
W1 = RNG.integers(-2, 3, (8, 16)).astype(np.float32)
W2 = RNG.integers(-2, 3, (16, 4)).astype(np.float32)
EDGE_NODES = {"x", "w1", "mm1", "act1"}


def _graph():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 8), name="x")
        w1 = ism.Variable(np.zeros_like(W1), name="w1")
        h = ism.relu(ism.matmul(x, w1, name="mm1"), name="act1")
        logits = ism.matmul(h, ism.constant(W2, name="w2"), name="logits")
        y = ism.relu(logits, name="y")
        init = ism.global_variables_initializer()
    sess = ism.Session(g)
    sess.run(init)
    sess.set_variable_value(w1, W1)  # the part must carry the session's value, not the initializer's
    return g, sess, x, logits, y


def _hand(xv):
    logits = np.maximum(xv @ W1, 0) @ W2
    return logits, np.maximum(logits, 0)


def _hidden(xv):
    return np.maximum(xv @ W1, 0).astype(np.float32)


def _rows(n, seed):
    return np.random.default_rng(seed).integers(-3, 4, (n, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def model():
    g, sess, x, logits, y = _graph()
    place = {n.name: EDGE_DEVICE if n.name in EDGE_NODES else CLOUD_DEVICE for n in g.nodes}
    p = partition(g, place, [logits, y], return_to=EDGE_DEVICE)
    split = cloud_part_from_partition(p, "split", source=sess)
    whole = cloud_part(sess, ["x"], [logits, y], "whole")
    return CloudModel("tiny", {"split": split, "whole": whole})


@pytest.fixture
def server(model):
    srv = OffloadServer(model, max_batch_size=64, max_queue_delay_ms=100)
    ch = grpc.insecure_channel(srv.address)
    yield srv, offload_pb2_grpc.OffloadStub(ch)
    ch.close()
    srv.stop(grace=None)


def _request(part, feeds, rid=""):
    req = offload_pb2.InferRequest(part=part, request_id=rid)
    for k, v in feeds.items():
        tensor_codec.encode(v, out=req.inputs.add(name=k).tensor)
    return req


def _outputs(resp):
    return {t.name: tensor_codec.decode(t.tensor) for t in resp.outputs}


# ---- the parts and their file ----------------------------------------------------------------------
def test_parts_from_a_partition_carry_frozen_weights_and_a_batch_free_signature(model):
    split = model.parts["split"]
    assert [s.name for s in split.inputs] == ["act1:0"]
    assert [s.name for s in split.outputs] == ["logits:0", "y:0"]
    assert all(s.shape[0] == -1 for s in split.inputs + split.outputs) and split.batchable
    assert not any(n.op in ("Variable", "Send", "Recv") for n in split.graph.nodes)
    whole = model.parts["whole"]
    assert [s.name for s in whole.inputs] == ["x:0"] and whole.inputs[0].shape == (-1, 8)
    xv = _rows(5, 1)
    with ism.Session(whole.graph) as s:
        got = s.run([o.tensor for o in whole.outputs], {whole.inputs[0].tensor: xv})
    for a, b in zip(got, _hand(xv)):
        np.testing.assert_array_equal(a, b)


def test_a_variable_without_its_session_is_refused_by_name():
    g, sess, x, logits, y = _graph()
    with pytest.raises(CloudPartsError, match="variable 'w1': pass the Session"):
        cloud_part(g, ["x"], [y], "whole")
    assert cloud_part(g, ["act1"], [y], "tail").inputs[0].name == "act1:0"  # w1 is not needed past act1


def test_file_round_trip(model, tmp_path):
    path = tmp_path / "tiny.cloud"
    save_cloud_parts(path, list(model.parts.values()), model="tiny")
    m = load_cloud_parts(path)
    assert m.model == "tiny" and list(m.parts) == ["split", "whole"]
    for name, p in model.parts.items():
        q = m.parts[name]
        assert (q.inputs, q.outputs, q.batchable) == (p.inputs, p.outputs, p.batchable)
    hv = _hidden(_rows(3, 2))
    with ism.Session(m.parts["split"].graph) as s:
        got = s.run([o.tensor for o in m.parts["split"].outputs], {"act1:0": hv})
    np.testing.assert_array_equal(got[0], hv @ W2)


def test_batch_fixing_and_row_mixing_parts_are_not_batchable():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (4, 8), name="x")
        fixed = ism.reshape(x, (2, 16), name="fixed")
        mixed = ism.softmax(x, axis=0, name="mixed")
        rowwise = ism.softmax(x, axis=1, name="rowwise")
    a = cloud_part(g, ["x"], [fixed], "a")
    assert not a.batchable and a.inputs[0].shape == (4, 8)   # the service refuses other batch sizes
    b = cloud_part(g, ["x"], [mixed], "b")
    assert not b.batchable and b.inputs[0].shape == (-1, 8)  # shapes say yes; the probe says no: runs alone
    ok = cloud_part(g, ["x"], [rowwise], "c")
    assert ok.batchable and ok.inputs[0].shape == (-1, 8)    # the fixed batch of 4 relaxed


def test_unbatchable_parts_run_each_request_alone_and_fixed_batches_are_enforced():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (4, 8), name="x")
        fixed = ism.reshape(x, (2, 16), name="fixed")
        mixed = ism.softmax(x, axis=0, name="mixed")
    parts = {"a": cloud_part(g, ["x"], [fixed], "a"), "b": cloud_part(g, ["x"], [mixed], "b")}
    svc = OffloadService(CloudModel("m", parts), max_batch_size=64, max_queue_delay_ms=30)
    try:
        with pytest.raises(InvalidRequest, match="input 'x:0' has shape \\[3, 8\\]; the part takes \\[4, 8\\]"):
            svc.infer("a", {"x:0": np.zeros((3, 8), np.float32)})
        got = {}
        xs = {k: np.random.default_rng(k).standard_normal((k, 8)).astype(np.float32) for k in (1, 2, 3)}
        ts = [threading.Thread(target=lambda k=k: got.__setitem__(k, svc.infer("b", {"x:0": xs[k]}, 10)))
              for k in xs]
        for t in ts:
            t.start()
        for t in ts:
            t.join(10)
        for k, v in xs.items():
            e = np.exp(v - v.max(0))
            np.testing.assert_allclose(got[k].outputs[0], e / e.sum(0), rtol=1e-5)   # its own rows only
            assert got[k].batch_size == k
    finally:
        svc.close()


def test_parts_from_several_plans_skip_the_edge_only_cut(model):
    from isthmus.partitioner.costmodel import CostModel
    from isthmus.wire.link import LinkModel
    from isthmus.partitioner.plan import plan_split
    from isthmus.partitioner.problem import Constraints
    g, sess, x, logits, y = _graph()
    c = Constraints(edge_memory_budget=None)
    slow = plan_split(g, CostModel.edge_cloud(LinkModel(1e3, 1e3, 0.5)), [y], c)      # stays on the edge
    fast = plan_split(g, CostModel.edge_cloud(LinkModel(1e11, 1e11, 0.0)), [y], c)
    parts = cloud_parts_from_plans(sess, [slow, fast])
    assert [p.name for p in parts] == ["cut1"] and [o.name for o in parts[0].outputs] == ["y:0"]


def _corrupt(path, tmp_path, edit):
    data = bytearray(path.read_bytes())
    n = struct.unpack_from("<I", data, len(MAGIC))[0]
    man = json.loads(bytes(data[len(MAGIC) + 4:len(MAGIC) + 4 + n]))
    blobs = bytes(data[len(MAGIC) + 4 + n:])
    man, blobs = edit(man, blobs)
    raw = json.dumps(man).encode()
    out = tmp_path / "bad.cloud"
    out.write_bytes(MAGIC + struct.pack("<I", len(raw)) + raw + blobs)
    return out


def _set(man, key, value, part=0, spec=None):
    target = man["parts"][part] if spec is None else man["parts"][part][spec[0]][spec[1]]
    target[key] = value
    return man


@pytest.mark.parametrize("edit, want", [
    (lambda m, b: ({**m, "version": 99}, b), "field 'version'"),
    (lambda m, b: (_set(m, "name", 5), b), "field 'name' must be str"),
    (lambda m, b: (m, b[:-10]), "field 'graph' spans"),
    (lambda m, b: (m, b[:5] + bytes([b[5] ^ 1]) + b[6:]), "graph.sha256"),
    (lambda m, b: (_set(m, "dtype", "int32", spec=("inputs", 0)), b), "field 'dtype' is int32"),
    (lambda m, b: (_set(m, "dtype", "object", spec=("inputs", 0)), b), "field 'dtype'"),
    (lambda m, b: (_set(m, "shape", [-1, 99], spec=("outputs", 0)), b), "field 'shape'"),
    (lambda m, b: (_set(m, "tensor", "nope:0", spec=("outputs", 1)), b), "field 'tensor' 'nope:0'"),
    (lambda m, b: (_set(m, "tensor", "logits:0", spec=("inputs", 0)), b), "not a Placeholder"),
    (lambda m, b: (_set(m, "outputs", []), b), "field 'outputs'"),
])
def test_a_bad_file_is_refused_naming_the_file_part_and_field(model, tmp_path, edit, want):
    path = tmp_path / "tiny.cloud"
    save_cloud_parts(path, [model.parts["split"]], model="tiny")
    bad = _corrupt(path, tmp_path, edit)
    with pytest.raises(CloudPartsError) as e:
        load_cloud_parts(bad)
    assert want in str(e.value) and "bad.cloud" in str(e.value), str(e.value)


def test_mutated_files_load_or_raise_cloud_parts_error_only(model, tmp_path):
    path = tmp_path / "tiny.cloud"
    save_cloud_parts(path, [model.parts["split"]], model="tiny")
    good = path.read_bytes()
    n = struct.unpack_from("<I", good, len(MAGIC))[0]
    man_end = len(MAGIC) + 4 + n
    rng = np.random.default_rng(3)
    bad = tmp_path / "m.cloud"
    refused = 0
    for i in range(150):
        data = bytearray(good)
        if i % 3 == 0:      # JSON: flip characters of the manifest (types, numbers, names)
            for _ in range(rng.integers(1, 4)):
                k = int(rng.integers(len(MAGIC) + 4, man_end))
                data[k] = int(rng.choice(list(b'0123456789-",:[]{}tfnax')))
        elif i % 3 == 1:    # the manifest length
            struct.pack_into("<I", data, len(MAGIC), int(rng.integers(0, 2 * n)))
        else:               # truncated anywhere
            data = data[:int(rng.integers(0, len(data)))]
        bad.write_bytes(bytes(data))
        try:
            load_cloud_parts(bad)
        except CloudPartsError as e:
            assert "m.cloud" in str(e)
            refused += 1
    assert refused > 100


def test_a_file_that_is_not_one_is_refused(tmp_path):
    deep = b"[" * 200000
    for data in (b"", b"PK\x03\x04whatever", MAGIC + struct.pack("<I", 1 << 30) + b"{}", MAGIC + b"\x02\x00\x00\x00[]",
                 MAGIC + struct.pack("<I", len(deep)) + deep):
        p = tmp_path / "x.cloud"
        p.write_bytes(data)
        with pytest.raises(CloudPartsError, match="x.cloud"):
            load_cloud_parts(p)


# ---- the service, in process -------------------------------------------------------------------------
def test_concurrent_requests_are_batched_and_each_caller_gets_its_own_rows(model):
    svc = OffloadService(model, max_batch_size=64, max_queue_delay_ms=5000)
    try:
        results, errors = {}, []
        assert svc.arriving("whole")  # one more request on its way in: the batch fills until it comes

        def call(k):
            try:
                results[k] = svc.infer("whole", {"x:0": _rows(1 + k % 3, k)}, timeout=10)
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        ts = [threading.Thread(target=call, args=(k,)) for k in range(12)]
        for t in ts:
            t.start()
        _until(lambda: svc.stats()["queue_depth"] == 12)
        svc.not_arriving("whole")     # it never comes: the batch runs now
        for t in ts:
            t.join(20)
        assert not errors
        for k, r in results.items():
            want = _hand(_rows(1 + k % 3, k))
            np.testing.assert_array_equal(r.outputs[0], want[0])
            np.testing.assert_array_equal(r.outputs[1], want[1])
        assert {r.batch_size for r in results.values()} == {sum(1 + k % 3 for k in range(12))}  # one batch
        s = svc.stats()
        assert s["requests"] == 12 and s["errors"] == 0 and s["batches"] == 1
    finally:
        svc.close()


def test_a_request_whose_deadline_passes_in_the_queue_is_dropped(model):
    svc = OffloadService(model, max_batch_size=64, max_queue_delay_ms=1000)
    try:
        assert svc.arriving("whole")  # another request on its way in: the batch waits for it to fill
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="'whole'"):
            svc.infer("whole", {"x:0": _rows(1, 0)}, timeout=0.05)
        assert time.monotonic() - t0 < 0.8   # answered at its deadline, long before the batch flushed
        svc.not_arriving("whole")
        assert svc.infer("whole", {"x:0": _rows(2, 1)}, timeout=5).batch_size == 2  # the dropped one did not run
        assert svc.stats()["deadline_exceeded"] == 1
    finally:
        svc.close()


def test_in_process_refusals_name_the_part_or_tensor(model):
    svc = OffloadService(model, max_queue=1, max_batch_size=64, max_queue_delay_ms=300)
    try:
        with pytest.raises(InvalidRequest, match="input 'x:0' has shape \\[2, 7\\]"):
            svc.infer("whole", {"x:0": np.zeros((2, 7), np.float32)})
        svc.arriving("whole")  # the batch waits (0.3 s) for a request on its way in
        first = threading.Thread(target=svc.infer, args=("whole", {"x:0": _rows(1, 0)}, 5))
        first.start()
        deadline = time.monotonic() + 5
        while svc.stats()["queue_depth"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        with pytest.raises(Overloaded, match="limit 1"):
            svc.infer("split", {"act1:0": _hidden(_rows(1, 0))})
        svc.not_arriving("whole")
        first.join(10)
        s = svc.stats()
        assert (s["rejected_invalid"], s["rejected_overload"], s["errors"], s["batches"]) == (1, 1, 2, 1)
    finally:
        svc.close()


def test_closing_answers_queued_requests_unavailable_at_once(model):
    from isthmus.cloud.offload import ServiceStopped
    svc = OffloadService(model, max_batch_size=64, max_queue_delay_ms=5000)
    svc.arriving("whole")  # the batch waits (5 s) for a request on its way in
    got = []

    def call():
        try:
            svc.infer("whole", {"x:0": _rows(1, 0)}, 20)
        except Exception as e:  # noqa: BLE001
            got.append(e)
    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 5
    while svc.stats()["queue_depth"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    t0 = time.monotonic()
    svc.close()
    t.join(5)
    assert time.monotonic() - t0 < 2 and len(got) == 1 and isinstance(got[0], ServiceStopped)
    assert svc.stats()["queue_depth"] == 0 and ServiceStopped.code == grpc.StatusCode.UNAVAILABLE


# ---- over gRPC ------------------------------------------------------------------------------------------
def test_describe_and_infer_match_the_unsplit_session(server):
    srv, stub = server
    d = stub.Describe(offload_pb2.DescribeRequest(), timeout=5)
    assert d.model == "tiny" and [p.name for p in d.parts] == ["split", "whole"] and d.max_batch_size == 64
    assert [(t.name, list(t.shape)) for t in d.parts[0].inputs] == [("act1:0", [-1, 16])]
    g, sess, x, logits, y = _graph()
    xv = _rows(6, 3)
    ref = sess.run([logits, y], {x: xv})
    r = stub.Infer(_request("whole", {"x:0": xv}, "r1"), timeout=5)
    assert r.request_id == "r1" and r.batch_size == 6 and r.compute_ms > 0
    out = _outputs(r)
    np.testing.assert_array_equal(out["logits:0"], ref[0])
    np.testing.assert_array_equal(out["y:0"], ref[1])
    out = _outputs(stub.Infer(_request("split", {"act1:0": _hidden(xv)}), timeout=5))
    np.testing.assert_array_equal(out["y:0"], _hand(xv)[1])


def test_concurrent_clients_share_batches_over_grpc(server):
    srv, stub = server
    got, errors = {}, []
    srv.service.max_queue_delay_s = 10.0   # generous, for a loaded machine: the wait ends when the 8 queued
    srv.service.arriving("split")  # the first requests wait for one more on its way in: they form one batch

    def client(k):
        try:
            for i in range(5):
                xv = _rows(2, 100 * k + i)
                got[(k, i)] = (xv, stub.Infer(_request("split", {"act1:0": _hidden(xv)}), timeout=10))
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    ts = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    _until(lambda: srv.service.stats()["queue_depth"] == 8)
    srv.service.not_arriving("split")
    for t in ts:
        t.join(30)
    assert not errors and len(got) == 40
    for xv, r in got.values():
        np.testing.assert_array_equal(_outputs(r)["logits:0"], _hand(xv)[0])
    assert {got[(k, 0)][1].batch_size for k in range(8)} == {16}   # the first wave ran as one batch
    st = stub.Stats(offload_pb2.StatsRequest(), timeout=5)
    assert st.requests == 40 and st.errors == 0 and st.batches < 40 and st.mean_batch_rows > 2
    assert 0 < st.p50_latency_ms <= st.p99_latency_ms and st.throughput_rps > 0


@pytest.mark.parametrize("part, feeds, want", [
    ("nope", {"x:0": _rows(1, 0)}, "unknown part 'nope'"),
    ("whole", {}, "input 'x:0' is missing"),
    ("whole", {"x:0": _rows(1, 0), "z:0": _rows(1, 0)}, "input 'z:0' is not in its signature"),
    ("whole", {"x:0": _rows(1, 0).astype(np.float64)}, "input 'x:0' is float64"),
    ("whole", {"x:0": np.zeros((1, 9), np.float32)}, "input 'x:0' has shape [1, 9]"),
    ("whole", {"x:0": np.zeros((8,), np.float32)}, "input 'x:0' has shape [8]"),
    ("whole", {"x:0": np.zeros((0, 8), np.float32)}, "input 'x:0' has no rows"),
    ("whole", {"x:0": np.zeros((1 << 15, 8), np.float32)}, "input 'x:0'"),   # 1 MiB > the 512 KiB limit
])
def test_invalid_requests_are_refused_naming_the_tensor_and_the_server_keeps_serving(model, part, feeds, want):
    with OffloadServer(model, max_request_bytes=512 << 10) as srv:
        with grpc.insecure_channel(srv.address) as ch:
            stub = offload_pb2_grpc.OffloadStub(ch)
            with pytest.raises(grpc.RpcError) as e:
                stub.Infer(_request(part, feeds), timeout=5)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert want in e.value.details(), e.value.details()
            ok = stub.Infer(_request("whole", {"x:0": _rows(1, 5)}), timeout=5)
            np.testing.assert_array_equal(_outputs(ok)["y:0"], _hand(_rows(1, 5))[1])
            st = stub.Stats(offload_pb2.StatsRequest(), timeout=5)
            assert (st.requests, st.rejected_invalid, st.errors) == (2, 1, 1)


def test_a_tensor_whose_payload_does_not_match_its_header_is_refused(server):
    srv, stub = server
    req = _request("whole", {"x:0": _rows(2, 0)})
    req.inputs[0].tensor.content = req.inputs[0].tensor.content[:-4]
    with pytest.raises(grpc.RpcError) as e:
        stub.Infer(req, timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "input 'x:0'" in e.value.details()
    req = _request("whole", {"x:0": _rows(1, 0)})
    req.inputs.add(name="x:0").tensor.CopyFrom(req.inputs[0].tensor)
    with pytest.raises(grpc.RpcError, match="given twice"):
        stub.Infer(req, timeout=5)


def test_a_failing_batch_fails_its_requests_with_internal_and_the_part_keeps_serving():
    g = ism.Graph()
    with g.as_default():
        idx = ism.placeholder("int64", (None,), name="idx")
        rows = ism.gather(ism.constant(np.arange(12, dtype=np.float32).reshape(4, 3), name="table"), idx, name="rows")
    part = cloud_part(g, ["idx"], [rows], "lookup")
    assert part.batchable and part.inputs[0].shape == (-1,)
    with OffloadServer(CloudModel("lookup", {"lookup": part})) as srv:
        with grpc.insecure_channel(srv.address) as ch:
            stub = offload_pb2_grpc.OffloadStub(ch)
            with pytest.raises(grpc.RpcError) as e:
                stub.Infer(_request("lookup", {"idx:0": np.array([1, 99])}), timeout=5)
            assert e.value.code() == grpc.StatusCode.INTERNAL and "'rows'" in e.value.details(), e.value.details()
            ok = _outputs(stub.Infer(_request("lookup", {"idx:0": np.array([3, 0])}), timeout=5))
            np.testing.assert_array_equal(ok["rows:0"], [[9, 10, 11], [0, 1, 2]])


def test_overload_is_refused_at_once_with_resource_exhausted(model):
    with OffloadServer(model, max_queue=2, max_batch_size=64, max_queue_delay_ms=1500) as srv:
        with grpc.insecure_channel(srv.address) as ch:
            stub = offload_pb2_grpc.OffloadStub(ch)
            srv.service.arriving("whole")  # a request on its way in: queued ones wait for it (up to 1.5 s)
            queued = [stub.Infer.future(_request("whole", {"x:0": _rows(1, k)}), timeout=10) for k in range(2)]
            deadline = time.monotonic() + 5
            while stub.Stats(offload_pb2.StatsRequest(), timeout=5).queue_depth < 2:
                assert time.monotonic() < deadline, "the two requests never queued"
                time.sleep(0.01)
            t0 = time.monotonic()
            with pytest.raises(grpc.RpcError) as e:
                stub.Infer(_request("whole", {"x:0": _rows(1, 9)}), timeout=5)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() - t0 < 1.0
            srv.service.not_arriving("whole")
            for k, f in enumerate(queued):   # the queued ones still run, batched together
                r = f.result(timeout=10)
                assert r.batch_size == 2
                np.testing.assert_array_equal(_outputs(r)["y:0"], _hand(_rows(1, k))[1])
            assert stub.Stats(offload_pb2.StatsRequest(), timeout=5).rejected_overload == 1


def test_deadline_exceeded_over_grpc(model):
    with OffloadServer(model, max_batch_size=64, max_queue_delay_ms=3000) as srv:
        with grpc.insecure_channel(srv.address) as ch:
            stub = offload_pb2_grpc.OffloadStub(ch)
            srv.service.arriving("whole")  # the batch waits (3 s) for a request on its way in
            stub.Describe(offload_pb2.DescribeRequest(), timeout=10)  # connected: the deadline is all queueing
            with pytest.raises(grpc.RpcError) as e:
                stub.Infer(_request("whole", {"x:0": _rows(1, 0)}), timeout=0.5)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            deadline = time.monotonic() + 5
            while stub.Stats(offload_pb2.StatsRequest(), timeout=5).deadline_exceeded < 1:
                assert time.monotonic() < deadline, "the server never counted the dropped request"
                time.sleep(0.02)


def test_a_caller_gone_at_its_deadline_counts_as_deadline_not_cancel():
    """gRPC cancels a call when the caller's deadline passes, and the caller's clock runs ahead of
    the server's by the request's transit: a cancel that close to the deadline is the deadline
    (it raced the waiting thread's own timeout: counted 'cancelled' 1 in 9 on a loaded machine)."""
    from isthmus.cloud.offload_batching import Cancelled, _Request
    now = time.monotonic()
    for deadline, want in ((now + 0.5, Cancelled), (now + 0.01, DeadlineExceeded), (now - 0.01, DeadlineExceeded)):
        r = _Request([], 1, deadline)
        r.t0 = now - 0.5
        r.abandon()
        assert type(r.error) is want and r.cancelled and r.done.wait(0), (deadline - now, r.error)


def test_a_cancelled_request_frees_its_thread_and_never_runs(model):
    with OffloadServer(model, max_batch_size=64, max_queue_delay_ms=800) as srv:
        with grpc.insecure_channel(srv.address) as ch:
            stub = offload_pb2_grpc.OffloadStub(ch)
            srv.service.arriving("whole")  # the batch waits (0.8 s) for a request on its way in
            fut = stub.Infer.future(_request("whole", {"x:0": _rows(1, 0)}), timeout=20)
            _until(lambda: stub.Stats(offload_pb2.StatsRequest(), timeout=5).queue_depth == 1)
            fut.cancel()
            _until(lambda: stub.Stats(offload_pb2.StatsRequest(), timeout=5).errors == 1)  # the handler returned
            _until(lambda: stub.Stats(offload_pb2.StatsRequest(), timeout=5).queue_depth == 0)
            assert stub.Stats(offload_pb2.StatsRequest(), timeout=5).batches == 0          # and it never ran


def _until(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached within the timeout"
        time.sleep(0.01)


def test_a_bearer_token_is_required_when_configured(model):
    from isthmus.wire.security import ClientSecurity, ServerSecurity, make_channel
    with OffloadServer(model, security=ServerSecurity(token="s3cret-token")) as srv:
        with grpc.insecure_channel(srv.address) as ch:
            with pytest.raises(grpc.RpcError) as e:
                offload_pb2_grpc.OffloadStub(ch).Describe(offload_pb2.DescribeRequest(), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with make_channel(srv.address, ClientSecurity(token="s3cret-token", tls=False)) as ch:
            assert offload_pb2_grpc.OffloadStub(ch).Describe(offload_pb2.DescribeRequest(), timeout=5).model == "tiny"


def test_isthmus_serve_with_tls_and_a_token_prints_its_address_logs_and_stops_on_ctrl_c(model, tmp_path):
    pytest.importorskip("cryptography")
    from isthmus.wire.security import ClientSecurity, make_channel

    from ..tls_certs import make_certs
    certs = make_certs(tmp_path / "certs")
    path = tmp_path / "tiny.cloud"
    save_cloud_parts(path, list(model.parts.values()), model="tiny")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")}
    env["PYTHONPATH"] = os.path.dirname(root) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env["ISTHMUS_TLS_CA"] = str(certs.ca)   # for --measure-overhead's own loopback client
    proc = subprocess.Popen([sys.executable, "-m", "isthmus", "serve", str(path), "--port", "0",
                             "--log-every", "0.2", "--tls-cert", str(certs.server_cert), "--tls-key",
                             str(certs.server_key), "--token-file", str(certs.token), "--max-batch", "8",
                             "--warm-up", "--measure-overhead"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = _readline(proc.stdout, 30)
        assert line.startswith("ISTHMUS_OFFLOAD 127.0.0.1:"), line
        address = line.split()[1]
        good = ClientSecurity.from_files(ca=str(certs.ca), token_file=str(certs.token))
        with make_channel(address, good) as ch:
            r = offload_pb2_grpc.OffloadStub(ch).Infer(_request("whole", {"x:0": _rows(3, 1)}), timeout=10)
            np.testing.assert_array_equal(_outputs(r)["y:0"], _hand(_rows(3, 1))[1])
            overhead = offload_pb2_grpc.OffloadStub(ch).Describe(offload_pb2.DescribeRequest(), timeout=10).overhead_ms
        with make_channel(address, ClientSecurity.from_files(ca=str(certs.ca))) as ch:  # no token
            with pytest.raises(grpc.RpcError) as e:
                offload_pb2_grpc.OffloadStub(ch).Describe(offload_pb2.DescribeRequest(), timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(address) as ch:  # plaintext against TLS
            with pytest.raises(grpc.RpcError) as e:
                offload_pb2_grpc.OffloadStub(ch).Describe(offload_pb2.DescribeRequest(), timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "listening on 127.0.0.1:" in err and "TLS + bearer token" in err, err
        assert "offload: 56 requests" in err, err      # 55 of them measure_overhead's (5 unmeasured + 50)
        assert "warmed up with 12 batches" in err, err  # 2 parts x batch sizes 1, 2, 4, 8, 8, 8
        assert f"per-request overhead {overhead:.3f} ms" in err and overhead > 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


def _readline(stream, timeout):
    box = []
    t = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    t.start()
    t.join(timeout)
    assert box, "no line within the timeout"
    return box[0].strip()
