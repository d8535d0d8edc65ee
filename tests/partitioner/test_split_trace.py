"""Tracing a split edge/cloud run in process: both parts on one timeline, one track each, every
Send paired with its Recv (bytes exact, the emulated link's delay visible), Chrome flows."""
import json

import numpy as np

import isthmus as ism
from isthmus.core.rendezvous import InProcessRendezvous
from isthmus.partitioner import CLOUD_DEVICE, EDGE_DEVICE, LinkModel, partition
from isthmus.partitioner.runner import SplitSession, emulated_link

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((32, 64)).astype(np.float32)
W2 = RNG.standard_normal((64, 10)).astype(np.float32)


def split_mlp():
    """tanh(x @ W1) on the edge, @ W2 on the cloud, the result back to the edge."""
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 32), name="x")
        h = ism.tanh(ism.matmul(x, ism.constant(W1, name="w1"), name="mm1"), name="h")
        y = ism.matmul(h, ism.constant(W2, name="w2"), name="y")
    edge = {"x", "w1", "mm1", "h"}
    placement = {n.name: EDGE_DEVICE if n.name in edge else CLOUD_DEVICE for n in g.nodes}
    return partition(g, placement, [y], return_to=EDGE_DEVICE)


def _check_transit(t, emulated_s):
    span_us = t.recv.end_us - t.send.start_us
    assert 0.9 * emulated_s * 1e6 <= span_us < 2e6
    assert 0.0 <= t.transit_us <= span_us


def test_traced_split_run():
    xv = RNG.standard_normal((8, 32)).astype(np.float32)
    want = np.tanh(xv @ W1) @ W2  # numpy reference
    link = LinkModel(8e6, 16e6, 0.01)  # 2 KB up: 2 ms + 5 ms; 320 B down: 0.16 ms + 5 ms
    rv = InProcessRendezvous(timeout=10, delay=emulated_link(link, EDGE_DEVICE))
    with SplitSession(split_mlp(), rendezvous=rv) as s:
        plain = s.run({"x": xv})[0]
        md = ism.RunMetadata()
        traced = s.run({"x": xv}, options=ism.RunOptions(trace=True), run_metadata=md)[0]
        assert len(md.events) > 0 and md.origin_s is not None
        s.run({"x": xv}, options=ism.RunOptions(trace=True), run_metadata=md)  # a second step, same md
    np.testing.assert_allclose(plain, want, rtol=1e-5, atol=1e-5)
    assert traced.tobytes() == plain.tobytes()

    assert {e.device for e in md.events} == {EDGE_DEVICE, CLOUD_DEVICE}
    assert any(e.op == "MatMul" and e.device == EDGE_DEVICE for e in md.events)
    sends = [e for e in md.events if e.op == "Send"]
    ts = md.transfers()
    assert len(ts) == len(sends) == 4  # h up and y down, two steps
    up = [t for t in ts if t.src_device == EDGE_DEVICE]
    down = [t for t in ts if t.src_device == CLOUD_DEVICE]
    assert len(up) == len(down) == 2
    for t in up:
        assert t.dst_device == CLOUD_DEVICE and t.nbytes == 8 * 64 * 4 == t.recv.transfer_bytes
        assert t.send.device == EDGE_DEVICE and t.recv.device == CLOUD_DEVICE
        # the Recv cannot finish before the emulated upload, which starts when the Send hands the value
        # over (between the Send's start and end): on one timeline with the Send. transit_us starts at the
        # Send's end, so a sender thread descheduled after the hand-over (a loaded machine: pytest -n 2
        # beside a CPU hog) shortens it by as much; it is never longer than the whole span
        _check_transit(t, link.upload_time(t.nbytes))
    for t in down:
        assert t.dst_device == EDGE_DEVICE and t.nbytes == 8 * 10 * 4
        _check_transit(t, link.download_time(t.nbytes))
    # the n-th Send of a key pairs with the n-th Recv: the second step's after the first's
    first, second = sorted(up, key=lambda t: t.send.start_us)
    assert first.recv.end_us <= second.recv.end_us and first.send.end_us <= second.send.start_us

    data = json.loads(json.dumps(md.to_chrome_trace()))
    ev = data["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M"}
    assert sorted(procs.values()) == sorted([EDGE_DEVICE, CLOUD_DEVICE])
    s_ = {e["id"]: e for e in ev if e["ph"] == "s"}
    f_ = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert len(s_) == 4 and s_.keys() == f_.keys()
    # the flow events carry the transfers' own transit times (bounded above: see _check_transit)
    assert sorted(s_[i]["args"]["transit_us"] for i in s_) == sorted(round(t.transit_us, 3) for t in ts)
    assert sorted((procs[s_[i]["pid"]], procs[f_[i]["pid"]], s_[i]["args"]["bytes"]) for i in s_) == sorted(
        [(EDGE_DEVICE, CLOUD_DEVICE, 2048)] * 2 + [(CLOUD_DEVICE, EDGE_DEVICE, 320)] * 2)


def test_untraced_split_run_records_nothing():
    xv = RNG.standard_normal((2, 32)).astype(np.float32)
    md = ism.RunMetadata()
    with SplitSession(split_mlp(), timeout=10) as s:
        s.run({"x": xv}, options=ism.RunOptions(trace=False), run_metadata=md)
    assert md.events == [] and md.origin_s is None


def test_split_trace_survives_the_wire_format():
    """A split trace encoded as a StepTrace (what a task sends) decodes to the same transfers."""
    from isthmus.cloud import tracing
    md = ism.RunMetadata()
    with SplitSession(split_mlp(), timeout=10) as s:
        s.run({"x": np.ones((3, 32), np.float32)}, options=ism.RunOptions(trace=True), run_metadata=md)
    back = tracing.decode(tracing.encode(md), "split")
    assert back.origin_s == md.origin_s and back.events == md.events
    assert [(t.tensor, t.nbytes) for t in back.transfers()] == [(t.tensor, t.nbytes) for t in md.transfers()]
