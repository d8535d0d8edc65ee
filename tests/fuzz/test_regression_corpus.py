"""Inputs the fuzz harnesses once found failing (crash, hang, over-allocation), kept and replayed:
each must now be handled by the harness within its 2 s bound (benchmarks/reliability.py).

tests/fuzz/corpus/<harness>/*: one file per finding, named after what it found.
- edge_loader/hang-stride-*: mutated edge models whose convolution strides are enormous; preparing
  the interpreter looped over (and would have allocated for) every stride phase.
- graphdef_decoder/indexerror-variable-without-output: a GraphDef node carrying a variable record
  but no outputs (the long run's 1 IndexError in its first 160,000 inputs, seed 6, input 13,532);
  the decoder read its output 0.
"""
import os
import signal
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
try:
    import reliability  # noqa: E402
finally:
    sys.path.pop(0)

CASES = sorted((h, f) for h in os.listdir(CORPUS) for f in os.listdir(os.path.join(CORPUS, h)))


class _Slow(Exception):
    pass


@pytest.mark.parametrize("harness,name", CASES)
def test_finding_stays_fixed(harness, name):
    _, run, *_ = reliability.HARNESSES[harness]
    data = open(os.path.join(CORPUS, harness, name), "rb").read()

    def alarm(*_):
        raise _Slow(f"{harness}/{name} took over 2 s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(2)
    try:
        run(data)   # documented errors are caught by the harness; anything else fails the test
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
