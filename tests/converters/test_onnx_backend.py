"""Every ONNX backend node case the installed onnx package defines, through from_onnx and the
isthmus executor: each one passes within the case's tolerance or is refused with OnnxImportError,
and exactly the cases in onnx_expected_refusals.txt are refused (the list can only shrink: a listed
case that passes fails here until it is removed). Regenerate the list and docs/onnx-coverage.md with
`PYTHONPATH=... python docs/gen_onnx_coverage.py --update-refusals`."""
import collections
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import onnx_conformance as oc  # noqa: E402

MIN_CASES = 1800  # the installed onnx defines 1884 node cases (onnx 1.23); fewer means the loader broke


@pytest.fixture(scope="module")
def results():
    return oc.run_all()


def test_every_case_passes_or_is_refused_by_name(results):
    bad = [f"{r.status}: {r.name}: {r.detail}" for r in results if r.status not in ("pass", "refused")]
    assert len(results) >= MIN_CASES
    assert not bad, f"{len(bad)} cases gave a wrong result or another exception:\n" + "\n".join(bad[:30])
    for r in results:
        if r.status == "refused":  # the message names the node or the op, and the opset
            assert "opset" in r.detail or "initializer" in r.detail or "graph input" in r.detail, r


def test_every_case_passes_on_the_stand_in_gpu_too(monkeypatch):
    """The same conformance cases with every Session on the stand-in GPU (core/simgpu.py): a kernel
    computing with numpy on device values, or an op that must run on the host placed on the device,
    fails here (DFT, STFT, NonMaxSuppression and Unique did; a float16 convolution summed in float16)."""
    monkeypatch.setenv("ISTHMUS_DEVICE", "gpu")
    monkeypatch.setenv("ISTHMUS_GPU", "simulated")
    results = oc.run_all()
    bad = [f"{r.status}: {r.name}: {r.detail}" for r in results if r.status not in ("pass", "refused")]
    assert len(results) >= MIN_CASES
    assert not bad, f"{len(bad)} cases gave a wrong result or another exception on the GPU:\n" + "\n".join(bad[:30])


def test_refusals_are_exactly_the_expected_ones(results, capsys):
    expected = oc.read_refusals()
    refused = {r.name for r in results if r.status == "refused"}
    passing = sorted(r.name for r in results if r.status == "pass" and r.name in expected)
    new = sorted(refused - set(expected))
    gone = sorted(set(expected) - {r.name for r in results})
    counts = collections.Counter(r.status for r in results)
    important = [r for r in results if r.op in oc.IMPORTANT_OPS]
    with capsys.disabled():
        print(f"\nONNX node cases: {counts['pass']} of {len(results)} pass, {counts['refused']} refused, "
              f"{counts['wrong']} wrong, {counts['crash']} crashed; important ops: "
              f"{sum(r.status == 'pass' for r in important)} of {len(important)} pass")
    assert not passing, f"{len(passing)} listed refusals now pass: remove them from the list " \
                        f"({oc.REFUSALS_FILE}): {passing[:20]}"
    assert not new, f"{len(new)} cases are refused but not listed as expected refusals: {new[:20]}"
    assert not gone, f"{len(gone)} listed cases no longer exist in the installed onnx: {gone[:20]}"
