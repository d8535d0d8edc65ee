"""partitioner/speed_state.py: a calibration sample is taken to the fast state by the probe read beside it."""
import numpy as np
import pytest

from isthmus.partitioner.speed_state import normalised, reference, speed_probe


def test_the_reference_is_the_fast_state_of_the_probes():
    # 160 us most of the time, a slow stretch at 210-240: the fast state is the low percentile, not the median
    probes = [160e-6] * 6 + [210e-6, 230e-6, 240e-6, 220e-6]
    assert reference(probes) == pytest.approx(np.percentile(probes, 10)) and reference(probes) == pytest.approx(160e-6)
    assert reference([213e-6, 194e-6]) < 200e-6  # a calibration all in a slow stretch keeps its fastest reading
    for bad in ([], [0.0], [float("nan")], [-1e-4]):
        with pytest.raises(ValueError, match="speed probes must be finite"):
            reference(bad)


def test_a_sample_is_scaled_by_the_reference_over_its_probe():
    # a part timed at 3 ms beside a probe 1.5x the reference ran in a state 1.5x slow: 2 ms at the reference
    assert normalised([3e-3, 2e-3], [240e-6, 160e-6], 160e-6) == pytest.approx([2e-3, 2e-3])
    with pytest.raises(ValueError, match="2 samples against 1 probes"):
        normalised([1.0, 2.0], [1.0], 1.0)


def test_the_probe_times_cpu_seconds_after_warming():
    clock, calls = [0.0], []

    def work():
        clock[0] += 1e-4 if len(calls) != 11 else 3e-4  # the second timed product is slower: the fastest is kept
        calls.append(1)
    assert speed_probe(reps=3, warm_s=1e-3, clock=lambda: clock[0], work=work) == pytest.approx(1e-4)
    assert len(calls) == 10 + 3
    t = speed_probe(reps=2)  # the real product: tens to hundreds of microseconds here
    assert 1e-6 < t < 0.1


def test_the_scaling_benchmark_tells_work_that_slows_with_the_probe_from_work_that_does_not():
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from speed_state_scaling import analyse
    rng = np.random.default_rng(0)
    probes = np.where(rng.random(200) < 0.3, 220e-6, 160e-6) * (1 + 0.01 * rng.standard_normal(200))
    rows = [(p, p, 2e-3 * p / 160e-6, 3e-3, 1e-3 * (p / 160e-6) ** 0.5) for p in probes]
    got = analyse(rows, ("alike", "memory", "half"))
    assert got["alike"]["loglog_slope"] == pytest.approx(1.0, abs=1e-6) and got["alike"]["cv_normalised"] < 1e-6
    assert got["memory"]["loglog_slope"] == pytest.approx(0.0, abs=1e-6) and got["memory"]["slow_over_fast"] == 1.0
    assert got["half"]["loglog_slope"] == pytest.approx(0.5, abs=1e-3)
    assert got["alike"]["slow_over_fast"] == pytest.approx(got["alike"]["probe_slow_over_fast"], rel=0.01)
    assert 40 < got["slow_blocks"] < 80 and got["blocks"] == 200


def test_a_fit_keeps_the_samples_timed_in_the_fast_state_where_it_has_them():
    from isthmus.partitioner.speed_state import FAST_STATE, median_at_reference
    # one group in the fast state, two probed 2x slow (their time 3x: more than the probe's slowdown)
    timed = [(3e-3, 2e-4), (3e-3, 2e-4), (1.0e-3, 1.05e-4)]
    assert median_at_reference(timed, 1e-4) == pytest.approx(1.0e-3 / 1.05)
    # normalising all of them would have kept the slow ones' excess: 1.5 ms
    assert np.median(normalised([t for t, _ in timed], [p for _, p in timed], 1e-4)) == pytest.approx(1.5e-3)
    # none in the fast state: all of them, normalised
    slow = [(2e-3, 2e-4), (2.2e-3, 2e-4)]
    assert median_at_reference(slow, 1e-4) == pytest.approx(1.05e-3) and FAST_STATE * 1e-4 < 2e-4
    with pytest.raises(ValueError, match="no samples"):
        median_at_reference([], 1e-4)
