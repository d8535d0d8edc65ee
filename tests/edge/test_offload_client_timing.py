"""Where a request's time goes (OffloadClient.last) and the emulated slow edge (edge_slowdown)."""
import numpy as np
import pytest

from isthmus.edge.offload_client import EmulatedLink, OffloadClient, load_split

from .test_offload_client import server, split  # noqa: F401  (fixtures)


def _cloud_cut(path):
    sm = load_split(path)
    k = next(k for k, c in enumerate(sm.cuts) if c.cloud_part and c.inputs != sm.cuts[-1].inputs) \
        if len(sm.cuts) > 2 else len(sm.cuts) - 1
    cut = sm.cuts[k]
    return (cut.min_bps + min(cut.max_bps, 1e9)) / 2


def test_breakdown_adds_up_and_counts_the_bytes(split, server):  # noqa: F811
    bps = _cloud_cut(split["model"])
    link = EmulatedLink(50e6, 4e-3)
    with OffloadClient(split["model"], server.address, deadline_ms=5000, adapt=False, initial_bps=bps,
                       link=link) as c:
        c.invoke(split["xs"][0])      # connects and pings
        c.invoke(split["xs"][1])
        last = dict(c.last)
        cut = c.split.cuts[c.cut]
    assert last["mode"] == "cloud"
    x_bytes = {"x:0": 784 * 4, "act0:0": 128 * 4, "mm0:0": 128 * 4}
    assert last["up_bytes"] == sum(x_bytes.get(n, 0) for n in cut.inputs) > 0
    assert last["down_bytes"] == 10 * 4
    # the remote call includes at least the emulated link (two RTT halves + bytes) and the service
    floor = link.transfer_time(last["up_bytes"]) + link.transfer_time(last["down_bytes"])
    assert last["remote_s"] >= floor + last["server_s"] * 0.99
    assert last["server_s"] > 0
    assert last["total_s"] >= last["remote_s"] + last["edge_s"] * 0.99
    assert last["total_s"] <= last["remote_s"] + last["edge_s"] + 0.05


def test_edge_slowdown_stretches_local_compute_only(split):  # noqa: F811
    """Everything on the edge (no cloud at all): the request takes ~k x its compute time."""
    sm = load_split(split["model"])
    low = sm.cuts[0]
    assert not low.cloud_part
    with OffloadClient(split["model"], "127.0.0.1:1", deadline_ms=5000, adapt=False, initial_bps=low.max_bps / 2) as c:
        for v in split["xs"][:3]:
            c.invoke(v)
        times1 = []
        for v in split["xs"][:6]:
            c.invoke(v)
            times1.append(c.last["total_s"])
    with OffloadClient(split["model"], "127.0.0.1:1", deadline_ms=5000, adapt=False, initial_bps=low.max_bps / 2,
                       edge_slowdown=5.0) as c5:
        times5 = []
        for v in split["xs"][:6]:
            c5.invoke(v)
            times5.append(c5.last["total_s"])
            # all of it is edge time (sleep() may overshoot on a busy machine: edge_s is what was asked)
            assert c5.last["remote_s"] == 0 and 0.5 * c5.last["total_s"] <= c5.last["edge_s"] <= c5.last["total_s"]
    ratio = np.median(times5) / np.median(times1)
    assert 2.5 < ratio < 12.0, (times1, times5)


def test_edge_slowdown_is_validated(split):  # noqa: F811
    with pytest.raises(ValueError, match="edge_slowdown"):
        OffloadClient(split["model"], "127.0.0.1:1", edge_slowdown=0.5)
