"""Warming the offload client's cuts (edge/cut_warmer.py), without gRPC: every kernel runs once on
zeros, a remote part never, and a request waits for the warm-up of its own cut only."""
import threading
import time

import numpy as np
import pytest

from isthmus.edge.cut_warmer import CutWarmer, warm_interpreter
from isthmus.edge.interpreter import Interpreter

from . import cnn
from .test_offload_client import _remote_model


def _counted(interp, log, key, delay_s=0.0):
    """Wrap each step of `interp` to log (key, step index) when it runs, sleeping `delay_s` first."""
    def wrap(k, step):
        def run():
            time.sleep(delay_s)
            log.append((key, k))
            step()
        return run
    interp._steps = [wrap(k, s) for k, s in enumerate(interp._steps)]
    return interp


def test_warming_runs_every_kernel_on_zeros_and_no_remote_part():
    calls = []
    it = Interpreter(_remote_model(("relu", "softmax")), remote=lambda p, a: calls.append(p.name) or [a[0]])
    it.arena.fill(0xAB)
    log = []
    _counted(it, log, "m")
    warm_interpreter(it)
    assert calls == [] and log == [("m", 0), ("m", 2)]      # relu and softmax, not the remote step (1)
    # the arena was zeroed, every page of it touched; softmax of the zero remote output is uniform
    np.testing.assert_allclose(it._outputs[0], np.full((2, 5), 0.2, np.float32), rtol=1e-6)


def test_now_warms_everything_and_off_nothing():
    log = []
    jobs = [(k, _counted(Interpreter(cnn.fp32(k)), log, k)) for k in range(2)]
    w = CutWarmer(jobs, "now")
    assert w.done and sorted({k for k, _ in log}) == [0, 1] and set(w.seconds) == {0, 1} and not w.errors
    n = len(log)
    w.ensure(0)
    assert len(log) == n                                     # warm once
    off_log = []
    off = CutWarmer([(0, _counted(Interpreter(cnn.fp32(0)), off_log, 0))], "off")
    off.ensure(0)
    assert off.done and off_log == []
    with pytest.raises(ValueError, match="warm must be one of"):
        CutWarmer([], "later")


def test_a_request_waits_for_its_own_cut_only_and_the_background_gives_way():
    """Three models whose kernels each take 20 ms to warm (9 kernels: 180 ms a model). While a
    request runs, the background thread stops between kernels; the request's ensure(2) warms cut 2
    (it needs it) without waiting for cuts 0 and 1, which finish once the request is over."""
    log = []
    jobs = [(k, _counted(Interpreter(cnn.fp32(k)), log, k, delay_s=0.02)) for k in range(3)]
    nsteps = len(jobs[0][1]._steps)
    w = CutWarmer(jobs, "background")
    w.request_started()                                      # at once: the background thread may have begun cut 0
    time.sleep(0.1)
    before = len(log)
    t0 = time.perf_counter()
    w.ensure(2)
    waited = time.perf_counter() - t0
    assert 2 in w._done and all(k == 2 for k, _ in log[before:]), log
    assert [i for k, i in log if k == 2] == list(range(nsteps))
    assert len({k for k, _ in log if k != 2}) <= 1 and sum(k == 0 for k, _ in log) <= 2, log  # cut 0 paused at once
    assert waited < 0.02 * nsteps * 2 + 0.5                  # its own warm-up, not the others'
    w.request_finished()
    assert w.wait(30) and w.done and not w.errors
    assert sorted(k for k, _ in log) == sorted([0, 1, 2] * nsteps)


def test_a_warm_up_that_raises_is_recorded_not_raised():
    it = Interpreter(cnn.fp32(0))

    def boom():
        raise RuntimeError("kernel broke")
    it._steps = [boom]
    w = CutWarmer([("full", it)], "now")
    assert w.done and "kernel broke" in w.errors["full"]
