"""benchmarks/cold_by_model.py's table: per part, the hot median and each idle's median over it."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


def test_cold_is_the_median_after_each_idle_less_the_hot_median():
    from cold_by_model import cold_table
    times = {("a", 0.0): [1.0e-3, 1.2e-3, 5.0e-3], ("a", 0.005): [1.3e-3, 1.1e-3, 1.5e-3],
             ("a", 0.023): [2.0e-3, 1.6e-3, 9.0e-3], ("b", 0.0): [2e-3], ("b", 0.023): [1.9e-3]}
    t = cold_table(times, {"a": 100, "b": 7})
    assert t["a"]["hot_ms"] == pytest.approx(1.2)  # the median: one slow request does not move it
    assert t["a"]["cold_ms"] == {"5": pytest.approx(0.1), "23": pytest.approx(0.8)}
    assert t["b"] == {"weights": 7, "hot_ms": pytest.approx(2.0), "cold_ms": {"23": pytest.approx(-0.1)}}


def test_a_part_without_hot_requests_is_an_error():
    from cold_by_model import cold_table
    with pytest.raises(KeyError):
        cold_table({("a", 0.023): [1e-3]}, {"a": 1})


def test_held_bytes_counts_a_closures_distinct_arrays_less_the_skipped():
    import numpy as np
    from weights_in_model import held_bytes
    w, arena = np.zeros((100, 10), np.int16), np.zeros(1000, np.int8)
    view, box = arena[10:20], {"w": w}

    class Holder:
        def __init__(self):
            self.parts = [w[:5], np.zeros(7, np.int32)]

    h = Holder()

    def step():
        return w.sum() + view.sum() + len(box) + len(h.parts)
    assert held_bytes(step, skip=[arena]) == 2000 + 28  # w once (its slice is a view), the int32 array
    assert held_bytes(step) == 2000 + 28 + 1000  # the arena counted when not skipped


def test_step_medians_run_each_step_in_order():
    from weights_in_model import step_medians
    calls = []
    steps = [lambda: calls.append(0), lambda: calls.append(1), lambda: calls.append(2)]
    t = step_medians(steps, [2, 0], reps=3)
    assert calls == [2, 0] * 3 and set(t) == {0, 2} and all(v >= 0 for v in t.values())
