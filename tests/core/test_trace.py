"""Step tracing: same results as an untraced run, one event per executed node, Chrome JSON."""
import json

import numpy as np
import pytest

import isthmus as ism


@pytest.mark.cpu  # names the CPU plan's kernels
def test_traced_run_matches_and_exports_chrome_trace(tmp_path):
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 4), name="x")
        with ism.device("/job:cloud/task:0/device:CPU:0"):
            y = ism.nn.Dense(3, activation="relu", name="fc")(x)
        loss = ism.reduce_mean(y * y)
        step = ism.optimizers.SGD(0.1).minimize(loss)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    xv = np.ones((2, 4), np.float32)
    md = ism.RunMetadata()
    traced = sess.run([loss, y], {x: xv}, options=ism.RunOptions(trace=True), run_metadata=md)
    plain = sess.run([loss, y], {x: xv})
    np.testing.assert_array_equal(traced[0], plain[0])
    np.testing.assert_array_equal(traced[1], plain[1])
    plan = sess.plan_for([loss, y], {x: None})
    assert len(md.events) == len(plan.kernels)
    assert any(e.device == "/job:cloud/task:0/device:CPU:0" for e in md.events)
    assert all(e.end_us >= e.start_us for e in md.events)
    md2 = ism.RunMetadata()
    sess.run(step, {x: xv}, options=ism.RunOptions(trace=True), run_metadata=md2)
    assert "ApplyGradientDescent" in md2.by_op()
    path = md.write_chrome_trace(str(tmp_path / "trace.json"))
    data = json.load(open(path))
    names = {e["name"] for e in data["traceEvents"] if e["ph"] == "X"}
    assert any("fc" in n for n in names)
    assert {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M"} >= {"/job:cloud/task:0/device:CPU:0"}


def _ev(node, op, device, start, end, key="", nbytes=0, step=-1):
    return ism.core.trace.NodeEvent(node, op, device, 1, start, end, key=key, transfer_bytes=nbytes, step=step)


def test_merge_puts_processes_on_one_timeline():
    a = ism.RunMetadata(events=[_ev("s", "Send", "/job:a/device:CPU:0", 0.0, 10.0, "A;B;t:0", 64)], origin_s=100.0)
    b = ism.RunMetadata(events=[_ev("r", "Recv", "cpu", 0.0, 10.0, "A;B;t:0", 64)], origin_s=100.5)
    md = ism.RunMetadata()
    md.merge(a)
    md.merge(b, device="/job:b/device:CPU:0")
    assert md.origin_s == 100.0
    assert [(e.start_us, e.end_us, e.device) for e in md.events] == [
        (0.0, 10.0, "/job:a/device:CPU:0"), (500000.0, 500010.0, "/job:b/device:CPU:0")]
    assert b.events[0].start_us == 0.0  # the merged-in metadata is left as it was
    (t,) = md.transfers()
    assert (t.tensor, t.src_device, t.dst_device, t.nbytes) == ("t:0", "A", "B", 64)
    md.merge(ism.RunMetadata())  # nothing to add: no change
    assert len(md.events) == 2


def test_transfers_pair_by_key_and_step_in_order():
    d = "/job:x/device:CPU:0"
    md = ism.RunMetadata(origin_s=1.0, events=[
        _ev("s", "Send", d, 0, 1, "a;b;t:0", 8, 5), _ev("s", "Send", d, 2, 3, "a;b;t:0", 8, 6),
        _ev("r", "Recv", d, 4, 9, "a;b;t:0", 8, 6), _ev("r", "Recv", d, 1, 5, "a;b;t:0", 8, 5),
        _ev("s2", "Send", d, 0, 1, "a;b;u:0", 4)])  # a Send whose Recv is not in this trace
    ts = md.transfers()
    assert [(t.send.step, t.recv.step, t.recv.start_us) for t in ts] == [(5, 5, 1), (6, 6, 4)]
    flows = [e for e in md.to_chrome_trace()["traceEvents"] if e["ph"] in "sf"]
    assert sorted((e["id"], e["ph"]) for e in flows) == [(1, "f"), (1, "s"), (2, "f"), (2, "s")]
    for e in flows:  # each end sits inside the slice it binds to
        owner = ts[e["id"] - 1].send if e["ph"] == "s" else ts[e["id"] - 1].recv
        assert owner.start_us <= e["ts"] <= owner.end_us


def test_local_events_use_the_metadata_origin():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (3,), name="x")
        y = ism.tanh(x)
    sess = ism.Session(g)
    md = ism.RunMetadata()
    import time
    before = time.time()
    sess.run(y, {x: np.zeros(3, np.float32)}, options=ism.RunOptions(trace=True), run_metadata=md)
    first_end = md.events[-1].end_us
    sess.run(y, {x: np.zeros(3, np.float32)}, options=ism.RunOptions(trace=True), run_metadata=md)
    assert before <= md.origin_s <= time.time()
    assert md.events[-1].start_us >= first_end  # the second run follows the first on the same timeline
    assert md.to_chrome_trace()["otherData"]["origin_unix_s"] == md.origin_s
