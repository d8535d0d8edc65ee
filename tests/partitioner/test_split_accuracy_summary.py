"""benchmarks/split_accuracy.py's summary of a case: the median over every block's requests, the switch
latency against the steady requests of the switch's own block (this VM's speed moves for seconds at a
time, so a block measured in a slow stretch must not count its switch as slow), and the speed probe."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


def _row(total, cut="cut0", mode="local", faults=0):
    return {"total_s": total, "edge_s": total, "server_s": 0.0, "remote_s": 0.0, "client_s": 1e-5, "cut": cut,
            "mode": mode, "faults": faults}


def test_switch_is_against_its_own_block_and_the_median_over_all():
    from split_accuracy import summary
    fast = {"first": _row(0.011, faults=3), "rows": [_row(0.010), _row(0.010, faults=1)], "probe_s": 2e-4}
    slow = {"first": _row(0.016), "rows": [_row(0.015), _row(0.015)], "probe_s": 3e-4}  # a slow stretch
    s = summary([fast, slow, fast], "cut0")
    assert s["ms"] == pytest.approx(10.0)
    assert s["switch_ratio"] == [pytest.approx(1.1), pytest.approx(16 / 15, abs=1e-3), pytest.approx(1.1)]
    assert s["switch_ratio_all"][1] == pytest.approx(1.6)  # the old measure: the slow block's switch at 1.6x
    assert s["probe_us"] == [200.0, 300.0, 200.0]
    assert s["switch_faults"] == [3, 0, 3] and s["steady_faults_max"] == 1


def test_the_switch_per_cut_is_the_median_of_its_blocks_and_the_slow_blocks_carry_their_probes():
    from split_accuracy import summary, switch_summary
    first = dict(_row(0.011), probe_after_s=2e-4)
    flipped = dict(_row(0.014), probe_after_s=3e-4)  # the VM slow during this first request only
    fast = {"first": first, "rows": [_row(0.010), _row(0.010)], "probe_s": 2e-4}
    one = summary([fast, {**fast, "first": flipped, "probe_s": 3e-4}, fast], "cut0")
    cold = {"first": dict(_row(0.013), probe_after_s=2e-4), "rows": [_row(0.010)], "probe_s": 2e-4}
    two = summary([cold, cold, fast], "cut0")  # another cut whose switch costs in most blocks
    s = switch_summary([one, two])
    assert s["blocks"] == 6 and s["over_1.2"] == 3 and s["cuts"] == 2
    assert s["max_first_over_steady"] == pytest.approx(1.4)
    assert s["max_per_cut_median"] == pytest.approx(1.3)  # cut1's cost shows; cut0's one flip does not
    flip = s["blocks_over_1.2"][0]
    assert flip["probe_before_us"] == 300.0 and flip["probe_after_us"] == 300.0
    assert flip["first_ms"]["total"] == pytest.approx(14.0) and flip["steady_ms"] == [10.0, 10.0]


def test_a_request_off_the_cut_fails_the_case():
    from split_accuracy import summary
    with pytest.raises(SystemExit, match="expected every request on cut0"):
        summary([{"first": _row(0.01), "rows": [_row(0.01, mode="fallback")], "probe_s": 1e-4}], "cut0")


def test_the_speed_probe_times_cpu_seconds():
    from split_accuracy import speed_probe
    t = speed_probe(reps=2)
    assert 0.0 < t < 0.5


def test_the_error_at_reference_speed_takes_out_the_probes_slowdown_of_the_edge_only():
    from split_accuracy import at_reference
    rows = [{"measured": {"ms": 30.0, "edge_ms": 20.0, "probe_us": [300.0, 300.0, 200.0]}, "predicted": {"ms": 20.0}},
            {"measured": {"ms": 21.0, "edge_ms": 20.0, "probe_us": [200.0]}, "predicted": {"ms": 20.0}}]
    at_reference(rows, 200.0)
    assert rows[0]["probe_over_typical"] == 1.5
    assert rows[0]["error_at_reference_speed"] == pytest.approx((30 - 20 / 3) / 20 - 1, abs=1e-4)
    assert rows[1]["probe_over_typical"] == 1.0 and rows[1]["error_at_reference_speed"] == pytest.approx(0.05)


def test_the_state_diagnostic_keeps_the_blocks_probed_in_the_calibrations_state():
    """by_state: the verdict stays the median of all blocks; beside it the error of the blocks whose
    probe was within FAST of the calibration's, and how far the blocks' medians spread."""
    from split_accuracy import FAST, by_state, summary
    fast = {"first": _row(0.011), "rows": [_row(0.010), _row(0.010)], "probe_s": 2e-4}
    slow = {"first": _row(0.016), "rows": [_row(0.015), _row(0.016)], "probe_s": 3e-4}
    rows = [{"measured": summary([fast, slow, slow], "cut0"), "predicted": {"ms": 10.0}},
            {"measured": summary([slow], "cut0"), "predicted": {"ms": 10.0}}]
    assert rows[0]["measured"]["block_ms"] == [[10.0, 10.0], [15.0, 16.0], [15.0, 16.0]]
    by_state(rows, 200.0 / FAST * 1.0001)  # 200 us is within FAST of it, 300 is not
    assert rows[0]["fast_blocks"] == "1/3" and rows[0]["error_in_calibration_state"] == pytest.approx(0.0)
    assert rows[0]["block_spread"] == pytest.approx((15.5 - 10.0) / 15.0, abs=1e-4)  # the verdict's median: 15
    assert rows[1]["fast_blocks"] == "0/1" and rows[1]["error_in_calibration_state"] is None
    assert rows[1]["block_spread"] == 0.0


def test_the_speed_probe_is_warmed_before_it_is_timed():
    """The probe spends warm_s of CPU untimed first (a probe right after the emulated edge's sleep read
    cold caches as a slow VM): with a fake CPU clock, the products before the timed ones are counted."""
    from split_accuracy import speed_probe
    clock, calls = [0.0], []

    def work():
        clock[0] += 1e-4 if len(calls) != 11 else 2e-4  # the second timed product is slower
        calls.append(1)
    assert speed_probe(reps=3, warm_s=1e-3, clock=lambda: clock[0], work=work) == pytest.approx(1e-4)
    assert len(calls) == 10 + 3  # 1 ms of warming at 0.1 ms a product, then the three timed


def test_a_block_whose_memory_probe_was_slow_is_not_in_the_calibrations_state():
    """The cache-resident probe missed slow stretches that only a larger working set meets: a block
    counts as the calibration's state only when the memory probe agrees too."""
    from split_accuracy import by_state, memory_probe, summary
    a = {"first": _row(0.010), "rows": [_row(0.010)], "probe_s": 2e-4, "probe_mem_s": 3e-4}
    b = {"first": _row(0.013), "rows": [_row(0.013)], "probe_s": 2e-4, "probe_mem_s": 6e-4}  # memory slow
    rows = [{"measured": summary([a, b], "cut0"), "predicted": {"ms": 10.0}}]
    assert rows[0]["measured"]["probe_mem_us"] == [300.0, 600.0]
    by_state(rows, 200.0, 300.0)
    assert rows[0]["fast_blocks"] == "1/2" and rows[0]["error_in_calibration_state"] == pytest.approx(0.0)
    by_state(rows, 200.0)  # without the memory probe's reference: both blocks
    assert rows[0]["fast_blocks"] == "2/2" and rows[0]["error_in_calibration_state"] == pytest.approx(0.15)
    assert 0.0 < memory_probe() < 0.5
