"""The offload client's cut selection (edge/cut_selector.py), without gRPC or a model: measurements
in, the cut to run out, checked against the rule worked out by hand."""
import math

import pytest

from isthmus.edge.cut_selector import CutSelector
from isthmus.edge import Cut, cut_for, mid_bandwidth_bps


def _cuts():
    # edge only below 1 Mbit/s, a small cut up to 10 Mbit/s, a big one above
    return [Cut("edge", None, "", 0.0, 1e6, [], [], 0.0),
            Cut("small", None, "p1", 1e6, 10e6, ["a"], ["b"], 0.0),
            Cut("big", None, "p2", 10e6, math.inf, ["c"], ["d"], 0.0)]


def test_cut_for_picks_the_range_that_holds_the_bandwidth():
    cuts = _cuts()
    assert [cut_for(cuts, b) for b in (0.0, 0.5e6, 1e6, 9.99e6, 10e6, 1e12)] == [0, 0, 1, 1, 2, 2]


def test_mid_bandwidth_is_inside_the_range_and_picks_its_cut():
    cuts = _cuts()
    assert [mid_bandwidth_bps(c) for c in cuts] == [0.5e6, 5.5e6, (10e6 + 1e10) / 2]
    assert [cut_for(cuts, mid_bandwidth_bps(c)) for c in cuts] == [0, 1, 2]
    assert CutSelector(cuts, initial_bandwidth_bps=mid_bandwidth_bps(cuts[1])).cut == 1


def test_it_starts_at_the_initial_bandwidths_cut_or_the_last_one():
    assert CutSelector(_cuts(), initial_bandwidth_bps=2e6).cut == 1
    assert CutSelector(_cuts()).cut == 2
    with pytest.raises(ValueError, match="at least one cut"):
        CutSelector([])


def test_a_measurement_is_bits_over_time_less_the_round_trip_and_the_estimate_the_largest_of_the_window():
    s = CutSelector(_cuts(), window=2, initial_bandwidth_bps=2e6)
    assert s.add_rtt(0.030) == 0.030 and s.add_rtt(0.020) == 0.020 and s.add_rtt(0.025) == 0.020
    # 40 kB in 20 ms + 0.16 s: 320 kbit / 0.16 s = 2 Mbit/s
    assert s.measure(0.180, 40_000) == pytest.approx(2e6)
    assert s.measure(0.100, 40_000) == pytest.approx(320e3 / 0.080)   # larger: it becomes the estimate
    assert s.measure(0.150, 40_000) == pytest.approx(320e3 / 0.080)   # a slow sample is only a lower bound
    assert s.measure(0.150, 40_000) == pytest.approx(320e3 / 0.130)   # the window (2) forgot the fast one
    # a transfer under resolution_s shows only bits / resolution_s
    s2 = CutSelector(_cuts(), resolution_s=1e-3, initial_bandwidth_bps=2e6)
    assert s2.measure(0.0, 1000) == pytest.approx(8000 / 1e-3)


def test_the_cut_moves_only_past_the_hysteresis():
    s = CutSelector(_cuts(), window=1, hysteresis=0.15, initial_bandwidth_bps=5e6)
    assert s.cut == 1
    s.measure(8 * 1e6 / 11e6, 1_000_000)          # 11 Mbit/s: inside 10 * 1.15, stays
    assert s.cut == 1 and s.counts["switches"] == 0
    s.measure(8 * 1e6 / 12e6, 1_000_000)          # 12 Mbit/s: past it, moves up
    assert s.cut == 2 and s.counts["switches"] == 1
    s.measure(8 * 1e6 / 9e6, 1_000_000)           # 9 Mbit/s: 10 / 1.15 = 8.7, stays
    assert s.cut == 2
    s.measure(8 * 1e6 / 0.5e6, 1_000_000)         # 0.5 Mbit/s: straight to the edge-only cut
    assert s.cut == 0 and s.counts["switches"] == 2
    frozen = CutSelector(_cuts(), window=1, adapt=False, initial_bandwidth_bps=5e6)
    frozen.measure(8 * 1e6 / 100e6, 1_000_000)
    assert frozen.cut == 1 and frozen.bandwidth_bps == pytest.approx(100e6)


def test_every_probe_every_requests_one_runs_the_next_cut_up_unless_the_cloud_is_down():
    counts = {}
    s = CutSelector(_cuts(), probe_every=3, initial_bandwidth_bps=0.5e6, counts=counts)
    assert [s.choose() for _ in range(6)] == [0, 0, 1, 0, 0, 1]
    assert counts["probes"] == 2
    assert [s.choose(cloud_down=True) for _ in range(4)] == [0, 0, 0, 0]
    top = CutSelector(_cuts(), probe_every=1)               # at the top cut there is nothing to probe
    assert [top.choose() for _ in range(3)] == [2, 2, 2] and top.counts["probes"] == 0
    still = CutSelector(_cuts(), probe_every=1, adapt=False, initial_bandwidth_bps=0.5e6)
    assert [still.choose() for _ in range(3)] == [0, 0, 0]


def test_a_drop_is_believed_from_the_one_call_that_shows_it():
    """100 -> 2 Mbit/s: the call that takes 40x longer than predicted resets the window, so the
    request after it runs on the cut for 2 Mbit/s (with the window alone it took `window` calls)."""
    s = CutSelector(_cuts(), window=3, initial_bandwidth_bps=100e6, probe_every=16)
    s.add_rtt(0.010)
    for _ in range(3):
        s.measure(0.010 + 8 * 50_000 / 100e6, 50_000)                # 4 ms of bytes at 100 Mbit/s
    assert s.cut == 2 and s.bandwidth_bps == pytest.approx(100e6)
    s.measure(0.010 + 8 * 50_000 / 2e6, 50_000)                      # the same call at 2 Mbit/s: 200 ms
    assert s.cut == 1 and s.bandwidth_bps == pytest.approx(2e6) and s.counts["drops"] == 1
    # a probe of the cut above follows 3 requests later (a stall taken for a drop is undone then)
    assert [s.choose() for _ in range(3)] == [1, 1, 2] and s.counts["probes"] == 1
    # the jitter must be known first: no drop is believed from the first 3 calls
    early = CutSelector(_cuts(), window=3, initial_bandwidth_bps=100e6)
    early.add_rtt(0.010)
    early.measure(0.010 + 8 * 50_000 / 100e6, 50_000)
    early.measure(0.010 + 8 * 50_000 / 2e6, 50_000)
    assert early.cut == 2 and early.counts["drops"] == 0
    # jitter is not a drop: under twice the predicted time, or less than drop_min_s (10 ms) more
    j = CutSelector(_cuts(), window=3, initial_bandwidth_bps=100e6)
    j.add_rtt(0.010)
    for _ in range(3):
        j.measure(0.010 + 8 * 50_000 / 100e6, 50_000)
    j.measure(0.010 + 0.004 + 0.0035, 50_000)                        # 1.9x: a slow call, a lower bound
    j.measure(0.010 + 0.0002 + 0.009, 1000)                          # 47x but 9 ms: jitter on a small call
    assert j.cut == 2 and j.bandwidth_bps == pytest.approx(100e6) and j.counts["drops"] == 0
    # the window alone (drop_min_s = inf) keeps the old cut for `window` calls, as before
    w = CutSelector(_cuts(), window=3, initial_bandwidth_bps=100e6, drop_min_s=math.inf)
    w.add_rtt(0.010)
    for _ in range(3):
        w.measure(0.010 + 8 * 50_000 / 100e6, 50_000)
    seen = []
    for _ in range(3):
        w.measure(0.010 + 8 * 50_000 / 2e6, 50_000)
        seen.append(w.cut)
    assert seen == [2, 2, 1]


def test_a_call_faster_than_the_believed_round_trip_bounds_it():
    """A call's time on the wire holds one whole round trip: a first ping slowed by a busy machine
    (or a connection's setup) must not hide every transfer until the next ping."""
    s = CutSelector(_cuts(), window=1, initial_bandwidth_bps=100e6)
    assert s.add_rtt(0.050) == 0.050
    s.measure(0.006, 50_000)                                         # 6 ms for the whole call: rtt <= 6 ms
    assert s.rtt_s == pytest.approx(0.006)
    assert s.add_rtt(0.020) == pytest.approx(0.006)                  # a later slow ping does not undo it
    # with the round trip right, a 2 Mbit/s transfer shows as one (it hid under the 50 ms before)
    assert s.measure(0.006 + 8 * 50_000 / 2e6, 50_000) == pytest.approx(2e6) and s.cut == 1
