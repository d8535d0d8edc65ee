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
