"""Where a request's time goes (OffloadClient.last) and the emulated slow edge (edge_slowdown)."""
import types
import numpy as np
import pytest

from isthmus.edge.link_emulation import EmulatedLink
from isthmus.edge.offload_client import OffloadClient
from isthmus.edge.split_model import load_split

from .test_offload_client import server, split  # noqa: F401  (fixtures)


def _time_view(**fakes):
    """The time module as one module under test sees it, with `fakes` in place of some functions.
    Patching the time module itself would hand the fakes to every other thread in the process (a
    server thread left from an earlier test), and theirs to the fake clock."""
    import time
    view = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    for k, f in fakes.items():
        setattr(view, k, f)
    return view


def _cloud_cut(path):
    sm = load_split(path)
    k = next(k for k, c in enumerate(sm.cuts) if c.cloud_part and c.inputs != sm.cuts[-1].inputs) \
        if len(sm.cuts) > 2 else len(sm.cuts) - 1
    cut = sm.cuts[k]
    return (cut.min_bandwidth_bps + min(cut.max_bandwidth_bps, 1e9)) / 2


def _sent_bytes(cut) -> int:
    """Bytes the edge part of `cut` sends per request: its remote parts' inputs at batch 1."""
    m = cut.model
    total = 0
    for part in m.remote:
        for i in part.inputs:
            t = m.tensors[i]
            total += int(np.prod([1 if d < 0 else d for d in t.shape])) * np.dtype(t.dtype).itemsize
    return total


def test_breakdown_adds_up_and_counts_the_bytes(split, server):  # noqa: F811
    bps = _cloud_cut(split["model"])
    link = EmulatedLink(50e6, 4e-3)
    with OffloadClient(split["model"], server.address, deadline_ms=5000, adapt=False, initial_bandwidth_bps=bps,
                       link=link, ping_every=1000) as c:
        c.invoke(split["xs"][0])      # connects and pings
        c.invoke(split["xs"][1])
        last = dict(c.last)
        cut = c.split.cuts[c.cut]
    assert last["mode"] == "cloud" and last["cut"] == cut.name
    assert last["up_bytes"] == _sent_bytes(cut) > 0
    assert last["down_bytes"] == 10 * 4
    # the remote call includes at least the emulated link (two RTT halves + bytes) and the service
    floor = link.transfer_time(last["up_bytes"]) + link.transfer_time(last["down_bytes"])
    assert last["remote_s"] >= floor + last["server_s"] * 0.99
    assert last["server_s"] > 0
    assert last["total_s"] >= last["remote_s"] + last["edge_s"] * 0.99
    # this thread's CPU inside the call (encode, decode, the stub): some, and never more than the call took
    assert 0 < last["remote_cpu_s"] <= last["remote_s"]


def test_edge_slowdown_sleeps_k_minus_one_times_the_local_compute(split, monkeypatch):  # noqa: F811
    """Everything on the edge (no cloud at all), edge_clock="wall": after each request the client
    sleeps (k-1) x the time it computed, and reports k x that as the edge time."""
    import isthmus.edge.offload_client as oc
    sm = load_split(split["model"])
    low = sm.cuts[0]
    assert not low.cloud_part
    asked = []
    real_sleep = oc.time.sleep
    monkeypatch.setattr(oc, "time", _time_view(sleep=lambda s: (asked.append(s), real_sleep(s))))
    with OffloadClient(split["model"], "127.0.0.1:1", deadline_ms=5000, adapt=False, initial_bandwidth_bps=low.max_bandwidth_bps / 2,
                       edge_slowdown=5.0, ping_every=1000, edge_clock="wall") as c5:
        for v in split["xs"][:4]:
            asked.clear()
            c5.invoke(v)
            last = c5.last
            assert last["remote_s"] == 0 == last["remote_cpu_s"] and last["mode"] == "local"
            assert len(asked) == 1 and asked[0] == pytest.approx(last["edge_s"] * 4 / 5, rel=1e-9)
            assert last["total_s"] >= last["edge_s"]  # sleep never returns early
    with OffloadClient(split["model"], "127.0.0.1:1", deadline_ms=5000, adapt=False, initial_bandwidth_bps=low.max_bandwidth_bps / 2,
                       ping_every=1000) as c1:
        asked.clear()
        c1.invoke(split["xs"][0])
        assert asked == []  # no slowdown: no sleep


def test_edge_slowdown_by_cpu_time_counts_only_this_threads_compute(split, monkeypatch):  # noqa: F811
    """edge_clock="cpu" (the default): the emulated edge time is k x the CPU time the request's
    compute took, whatever else delayed it; the client sleeps for what the wall time has not yet
    covered. A fake clock pair makes it exact: the compute takes 2 ms of CPU and 5 ms of wall."""
    import isthmus.edge.offload_client as oc
    sm = load_split(split["model"])
    low = sm.cuts[0]
    clock = {"wall": 100.0, "cpu": 7.0}
    asked = []
    monkeypatch.setattr(oc, "time", _time_view(perf_counter=lambda: clock["wall"], thread_time=lambda: clock["cpu"],
                                                sleep=lambda s: asked.append(s)))
    with OffloadClient(split["model"], "127.0.0.1:1", deadline_ms=5000, adapt=False, initial_bandwidth_bps=low.max_bandwidth_bps / 2,
                       edge_slowdown=8.0, ping_every=1000) as c:
        real_local = c._local

        def local(inputs):
            clock["wall"] += 0.005
            clock["cpu"] += 0.002
            return real_local(inputs)
        c._local = local
        c.invoke(split["xs"][0])
        assert c.last["mode"] == "local"
        assert c.last["edge_s"] == pytest.approx(8 * 0.002)
        assert asked == [pytest.approx(8 * 0.002 - 0.005)]
        # a compute delayed beyond k x its CPU time (a loaded machine): no sleep, the wall time counts
        asked.clear()

        def slow_local(inputs):
            clock["wall"] += 0.030
            clock["cpu"] += 0.002
            return real_local(inputs)
        c._local = slow_local
        c.invoke(split["xs"][1])
        assert asked == [0.0] and c.last["edge_s"] == pytest.approx(0.030)


def test_edge_slowdown_is_validated(split):  # noqa: F811
    with pytest.raises(ValueError, match="edge_slowdown"):
        OffloadClient(split["model"], "127.0.0.1:1", edge_slowdown=0.5)
    with pytest.raises(ValueError, match="edge_clock"):
        OffloadClient(split["model"], "127.0.0.1:1", edge_slowdown=2.0, edge_clock="gpu")


def test_emulated_kernel_seconds_times_each_kernel_as_the_emulated_edge_runs_it(split, monkeypatch):  # noqa: F811
    """One entry per kernel of the full model, named by its output; k x the CPU time of each (a fake
    clock that each kernel advances makes it exact), scaled so that the kernels add up to a whole
    run timed as one (here a whole run also pays 10% outside the kernels); each run followed by
    the emulated edge's sleep; the model's outputs are unchanged afterwards (the inputs are put
    back before every run)."""
    import isthmus.edge.link_emulation as oc
    from isthmus.edge import Interpreter
    sm = load_split(split["model"])
    interp = Interpreter(sm.full)
    x = split["xs"][0]
    before = [o.copy() for o in interp.invoke(x)]
    names = [sm.full.tensors[op.outputs[0]].name for op in sm.full.operators]
    n = len(names)
    clock = {"cpu": 0.0, "reads": 0}

    def thread_time():
        clock["reads"] += 1
        if clock["reads"] % 2 == 0:  # each interval pays a little outside the kernels...
            clock["cpu"] += 0.05e-3 * (n if clock.get("whole") else 0)
        return clock["cpu"]

    def timed(step):
        def run():
            step()
            clock["cpu"] += 0.5e-3  # ... and each kernel 0.5 ms
        return run
    real_steps = interp._steps
    interp._steps = [timed(st) for st in real_steps]
    asked = []
    real_set = interp.set_inputs

    def set_inputs(*a, **kw):  # per round: the per-kernel runs' putting back, then the whole run's
        clock["whole"] = not clock.get("whole")
        return real_set(*a, **kw)
    # the module's own view of time (_time_view); the puts counted on this interpreter alone
    monkeypatch.setattr(oc, "time", _time_view(thread_time=thread_time, sleep=lambda s: asked.append(s)))
    monkeypatch.setattr(interp, "set_inputs", set_inputs)
    got = oc.emulated_kernel_seconds(interp, x, slowdown=4.0, runs=3)
    monkeypatch.undo()
    interp._steps = real_steps
    assert set(got) == set(names)
    for name in set(names):  # 0.5 ms each, x 4, x the whole run's 1.1 / the kernels' 1.0
        assert got[name] == pytest.approx(4.0 * 0.5e-3 * 1.1 * names.count(name))
    assert asked == [pytest.approx(3.0 * 0.5e-3 * n), pytest.approx(3.0 * 0.55e-3 * n)] * 3
    assert all(np.array_equal(a, b) for a, b in zip(before, interp.invoke(x)))
    with pytest.raises(ValueError, match="slowdown"):
        oc.emulated_kernel_seconds(interp, x, slowdown=0.5)


def test_interpreter_kernels_run_in_turn_are_one_invoke(split):  # noqa: F811
    """Interpreter.kernels (name, kernel) in run order, run in turn after set_inputs, give invoke's
    outputs; names are the kernels' first outputs, as the partitioner's measured times key them."""
    from isthmus.edge import Interpreter
    sm = load_split(split["model"])
    interp = Interpreter(sm.full)
    x = split["xs"][1]
    ref = [o.copy() for o in interp.invoke(x)]
    ks = interp.kernels
    assert [n for n, _ in ks] == [sm.full.tensors[op.outputs[0]].name for op in sm.full.operators]
    interp.invoke(np.zeros_like(x))
    interp.set_inputs(x)
    for _, k in ks:
        k()
    assert all(np.array_equal(a, b) for a, b in zip(ref, interp._outputs))
    with pytest.raises(ValueError, match="shape"):
        interp.set_inputs(x[..., :1])
