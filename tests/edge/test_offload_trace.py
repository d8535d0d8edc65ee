"""Traced offload requests on the edge client (OffloadClient(trace=True)): the service's spans
(InferResponse.trace) decoded strictly in edge/ and placed inside the call, the client's own spans
(edge compute per part, the emulated link, the call), clock skew re-centred, malformed traces
refused but the answer used, and the Chrome export with its flow arrows.

Servers listen on 127.0.0.1:0 and stop at the end of each test; every call has a deadline."""
import json
import math

import numpy as np
import pytest

pytest.importorskip("grpc")

from isthmus.edge.link_emulation import EmulatedLink  # noqa: E402
from isthmus.edge.offload_client import OffloadClient  # noqa: E402
from isthmus.edge.offload_trace import EDGE_TRACK, LINK_TRACK, TraceError, decode_service_trace  # noqa: E402
from isthmus.edge.split_model import load_split  # noqa: E402
from isthmus.proto import worker_pb2  # noqa: E402

from .test_offload_client import server, split  # noqa: F401,E402  (fixtures)

SERVICE_OPS = ["OffloadDecode", "OffloadQueue", "OffloadBatch", "OffloadHandoff", "OffloadEncode"]


def _cloud_bps(path):
    """A bandwidth inside the range of a cut that runs edge layers before its cloud part."""
    sm = load_split(path)
    k = next(k for k, c in enumerate(sm.cuts) if c.cloud_part and c.inputs != sm.cuts[-1].inputs)
    c = sm.cuts[k]
    return (c.min_bandwidth_bps + min(c.max_bandwidth_bps, 1e9)) / 2


def _client(split, server, **kw):  # noqa: F811
    kw.setdefault("link", EmulatedLink(50e6, 2e-3))
    return OffloadClient(split["model"], server.address, deadline_ms=5000, adapt=False,
                         initial_bandwidth_bps=_cloud_bps(split["model"]), ping_every=1000, trace=True, **kw)


def _ops(events, device=None):
    return [e.op for e in events if device is None or e.device == device]


def test_a_traced_request_has_every_span_in_order_and_the_service_inside_the_call(split, server):  # noqa: F811
    with _client(split, server) as c:
        c.invoke(split["xs"][0])                         # connects, pings
        out, = c.invoke(split["xs"][1])
        last = dict(c.last)
    np.testing.assert_allclose(out, split["ref"][1], rtol=1e-4, atol=1e-6)   # the answer is used
    assert last["mode"] == "cloud" and c.counts["trace_errors"] == 0
    ev = last["trace"]
    assert isinstance(last["trace_origin_s"], float) and last["trace_shift_s"] == 0.0   # one clock: no shift
    edge = [e for e in ev if e.device == EDGE_TRACK]
    assert [e.op for e in edge] == ["EdgeRequest", "EdgeCompute", "OffloadSend", "OffloadCall", "OffloadRecv",
                                    "EdgeCompute"]
    req = edge[0]
    for a, b in zip(edge[1:], edge[2:]):                # back to back, in order, inside the request
        assert a.start_us <= a.end_us <= b.start_us + 1e-6
    assert all(req.start_us <= e.start_us <= e.end_us <= req.end_us for e in ev)
    assert [e.node for e in edge if e.op == "EdgeCompute"] == [f"edge:{last['cut']}/part0", f"edge:{last['cut']}/part1"]
    assert _ops(ev, LINK_TRACK) == ["LinkUp", "LinkDown"]
    up, down = [e for e in ev if e.device == LINK_TRACK]
    assert (up.bytes_out, down.bytes_out) == (last["up_bytes"], last["down_bytes"])
    assert up.end_us - up.start_us >= 1e3 - 50 and down.end_us - down.start_us >= 1e3 - 50   # rtt/2 = 1 ms each
    call = next(e for e in edge if e.op == "OffloadCall")
    send = next(e for e in edge if e.op == "OffloadSend")
    assert send.start_us <= up.start_us and up.end_us <= send.end_us + 1e-6
    svc = [e for e in ev if e.device not in (EDGE_TRACK, LINK_TRACK)]
    assert [e.op for e in svc if e.op.startswith("Offload")] == SERVICE_OPS
    assert {e.op for e in svc} - set(SERVICE_OPS)       # and the part's own nodes, traced
    for e in svc:                                       # the service's time lies inside the client's call
        assert call.start_us - 1 <= e.start_us <= e.end_us <= call.end_us + 1
        assert e.call == 0
    spans = [e for e in svc if e.op in SERVICE_OPS]
    for a, b in zip(spans, spans[1:]):
        assert a.end_us <= b.start_us + 1
    assert spans[0].bytes_out == last["up_bytes"]       # what the service decoded is what was sent


def test_untraced_requests_record_nothing_and_ask_for_nothing(split, server):  # noqa: F811
    with _client(split, server) as c:
        c.trace = False
        c.invoke(split["xs"][0])
        assert "trace" not in c.last and c.counts["trace_errors"] == 0
        with pytest.raises(ValueError, match="trace=True"):
            c.chrome_trace()


def test_the_chrome_export_loads_and_draws_the_request_and_the_answer_as_flows(split, server, tmp_path):  # noqa: F811
    with _client(split, server) as c:
        c.invoke(split["xs"][0])
        path = c.write_chrome_trace(str(tmp_path / "req.json"))
        ev = c.last["trace"]
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    assert data["displayTimeUnit"] == "ms" and data["otherData"]["origin_unix_s"] == c.last["trace_origin_s"]
    tev = data["traceEvents"]
    procs = {e["args"]["name"]: e["pid"] for e in tev if e["ph"] == "M"}
    assert EDGE_TRACK in procs and LINK_TRACK in procs and len(procs) == 3
    slices = [e for e in tev if e["ph"] == "X"]
    assert len(slices) == len(ev) and all(e["dur"] > 0 for e in slices)
    flows = {}
    for e in tev:
        if e["ph"] in ("s", "f"):
            flows.setdefault(e["id"], {})[e["ph"]] = e
    assert sorted(f["s"]["name"] for f in flows.values()) == ["answer", "request"]

    def bound(fe):  # the slice a flow event binds to: the one on its track around its ts
        return [s["cat"] for s in slices if s["pid"] == fe["pid"] and s["tid"] == fe["tid"]
                and s["ts"] <= fe["ts"] <= s["ts"] + s["dur"]]
    for f in flows.values():
        assert f["f"]["bp"] == "e" and f["s"]["ts"] <= f["f"]["ts"]
        if f["s"]["name"] == "request":
            assert "OffloadSend" in bound(f["s"]) and "OffloadDecode" in bound(f["f"])
            assert f["s"]["pid"] == procs[EDGE_TRACK] != f["f"]["pid"]
        else:
            assert "OffloadEncode" in bound(f["s"]) and "OffloadRecv" in bound(f["f"])


def _fabricated(origin, spans, node="offload:p/decode", device="/job:cloud/task:0/device:CPU:0"):
    st = worker_pb2.StepTrace(origin_s=origin)
    for i, (a, b) in enumerate(spans):
        st.events.add(node=f"{node}{i}", op="OffloadDecode", device=device, thread=7, start_us=a, end_us=b)
    return st


def test_a_skewed_service_clock_is_recentred_inside_the_call():
    t_send, t_recv = 1.7e9, 1.7e9 + 0.010               # a 10 ms call
    # in step: the service's spans fall 2..6 ms into the call and stay there
    spans, shift = decode_service_trace(_fabricated(t_send + 0.002, [(0, 1000), (1000, 4000)]), t_send, t_recv)
    assert shift == 0.0 and [(e.start_us, e.end_us) for e in spans] == [
        pytest.approx((2000, 3000), abs=0.5), pytest.approx((3000, 6000), abs=0.5)]   # 0.24 us: a Unix time's ulp
    # the service's clock 3 s ahead: 4 ms of spans, re-centred on the call's middle (3..7 ms)
    for skew in (3.0, -250.0, 0.0075):
        spans, shift = decode_service_trace(_fabricated(t_send + 0.002 + skew, [(0, 1000), (1000, 4000)]),
                                            t_send, t_recv)
        assert shift == pytest.approx(0.001 - skew, abs=1e-6)
        assert [(e.start_us, e.end_us) for e in spans] == [pytest.approx((3000, 4000), abs=0.5),
                                                           pytest.approx((4000, 7000), abs=0.5)]
        assert spans[1].end_us - spans[0].start_us == pytest.approx(4000, abs=1e-3)   # durations kept
    # a service span longer than the call (clocks running at different rates) is centred too
    spans, shift = decode_service_trace(_fabricated(t_send, [(0, 20000)]), t_send, t_recv)
    assert (spans[0].start_us, spans[0].end_us) == (pytest.approx(-5000, abs=0.5), pytest.approx(15000, abs=0.5))


@pytest.mark.parametrize("damage, message", [
    (lambda st: setattr(st, "origin_s", math.nan), "origin_s nan"),
    (lambda st: setattr(st, "origin_s", -1.0), "origin_s -1.0"),
    (lambda st: setattr(st.events[1], "end_us", math.inf), "event 1 .* field 'end_us' is inf"),
    (lambda st: setattr(st.events[0], "start_us", math.nan), "event 0 .* field 'start_us' is nan"),
    (lambda st: setattr(st.events[1], "end_us", -5.0), r"event 1 \('offload:p/decode1'\): ends \(-5 us\) before"),
    (lambda st: setattr(st.events[0], "node", "n" * 4097), "event 0: field 'node' is 4097 characters"),
    (lambda st: setattr(st.events[1], "key", "k" * 5000), "event 1: field 'key' is 5000 characters"),
    (lambda st: setattr(st.events[0], "op", ""), "event 0: field 'op' is empty"),
    (lambda st: setattr(st.events[0], "thread", -3), "field 'thread' is -3"),
    (lambda st: st.ClearField("events"), "no events"),
])
def test_malformed_traces_are_refused_naming_the_field(damage, message):
    st = _fabricated(1.7e9, [(0, 10), (10, 20)])
    damage(st)
    with pytest.raises(TraceError, match=message):
        decode_service_trace(st, 1.7e9, 1.7e9 + 1, where="svc")


def test_too_many_events_are_refused_before_they_are_read():
    st = _fabricated(1.7e9, [(0, 1)] * 5)
    with pytest.raises(TraceError, match="5 trace events; at most 4"):
        decode_service_trace(st, 1.7e9, 1.7e9 + 1, max_events=4)
    st = worker_pb2.StepTrace(origin_s=1.7e9)
    st.events.add(node="n", op="o", device="d")
    many = worker_pb2.StepTrace(origin_s=1.7e9)
    many.events.extend([st.events[0]] * 200_001)
    with pytest.raises(TraceError, match="200001 trace events; at most 200000"):
        decode_service_trace(many, 1.7e9, 1.7e9 + 1)


def test_a_bad_trace_from_the_service_is_counted_and_the_answer_still_used(split, server, monkeypatch):  # noqa: F811
    with _client(split, server) as c:
        c.invoke(split["xs"][0])
        real = c._stub.Infer

        def spoiled(req, timeout):
            resp = real(req, timeout=timeout)
            resp.trace.events[2].end_us = math.nan       # a broken (or hostile) service
            return resp
        monkeypatch.setattr(c._stub, "Infer", spoiled)
        out, = c.invoke(split["xs"][2])
        np.testing.assert_allclose(out, split["ref"][2], rtol=1e-4, atol=1e-6)
        assert c.last["mode"] == "cloud" and c.stats()["trace_errors"] == 1
        assert "event 2" in c.last_trace_error and "'end_us' is nan" in c.last_trace_error
        ev = c.last["trace"]                             # the client's own spans are kept, the service's dropped
        assert "OffloadCall" in _ops(ev) and not [e for e in ev if e.op in SERVICE_OPS]
        flows = [e for e in c.chrome_trace()["traceEvents"] if e["ph"] in ("s", "f")]
        assert flows == []

        def untraced(req, timeout):
            resp = real(req, timeout=timeout)
            resp.ClearField("trace")
            return resp
        monkeypatch.setattr(c._stub, "Infer", untraced)
        out, = c.invoke(split["xs"][3])
        np.testing.assert_allclose(out, split["ref"][3], rtol=1e-4, atol=1e-6)
        assert c.stats()["trace_errors"] == 2 and "carries no trace" in c.last_trace_error


def test_a_fallback_request_traces_the_failed_call_and_the_local_run(split):  # noqa: F811
    with OffloadClient(split["model"], "127.0.0.1:1", deadline_ms=2000, adapt=False,
                       initial_bandwidth_bps=_cloud_bps(split["model"]), ping_every=1000, trace=True) as c:
        out, = c.invoke(split["xs"][0])
        np.testing.assert_allclose(out, split["ref"][0], rtol=1e-4, atol=1e-6)
        ev = c.last["trace"]
    assert c.last["mode"] == "fallback"
    assert _ops(ev) == ["EdgeRequest", "EdgeCompute", "OffloadFailed", "EdgeLocal"]
    req = ev[0]
    assert all(req.start_us <= e.start_us <= e.end_us <= req.end_us for e in ev)
