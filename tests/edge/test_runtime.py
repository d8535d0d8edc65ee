"""The interpreter end to end, with no core graph: a small CNN in fp32 and int8, its arena against
the lower bound, no allocation per call, hostile files and graphs, and a light import."""
import subprocess
import sys
import time
import tracemalloc

import numpy as np
import pytest

from isthmus.edge import EdgeModelError
from isthmus.edge.arena import ArenaPlanner
from isthmus.edge.interpreter import Interpreter
from isthmus.edge.loader import loads
from isthmus.edge.writer import ModelWriter

from . import cnn

rng = np.random.default_rng(11)


@pytest.fixture(scope="module")
def models():
    return {"fp32": cnn.fp32(), "int8": cnn.int8()}


def test_int8_cnn_agrees_with_fp32(models):
    a, b = Interpreter(models["fp32"]), Interpreter(models["int8"])
    for _ in range(10):
        x = rng.uniform(0, 1, cnn.SHAPE).astype(np.float32)
        pa, pb = a.invoke(x)[0], b.invoke(x)[0]
        assert abs(pa.sum() - 1) < 1e-5 and pa.argmax() == pb.argmax()
        assert np.abs(pa - pb).max() < 0.05


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_arena_within_10_percent_of_the_lower_bound(models, kind):
    it = Interpreter(models[kind])
    assert it.arena_lower_bound <= it.arena_bytes <= 1.1 * it.arena_lower_bound
    assert it.arena_bytes < it.tensor_bytes + it.scratch_bytes


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_arena_and_packed_weights_start_on_64_byte_boundaries(models, kind):
    """The compiled kernels' 32-byte loads must not split cache lines (numpy only promises 16 bytes)."""
    from isthmus.edge.arena import ALIGN, aligned_copy, aligned_empty
    it = Interpreter(models[kind])
    assert it.arena.ctypes.data % ALIGN == 0 and it.arena.nbytes == it.arena_bytes
    for n in (1, 17, 4096, 300_001):
        assert aligned_empty(n).ctypes.data % ALIGN == 0 and aligned_empty(n).nbytes == n
    a = rng.integers(-5, 5, (7, 13)).astype(np.int32)
    b = aligned_copy(a)
    assert b.ctypes.data % ALIGN == 0 and b.flags.c_contiguous and np.array_equal(a, b)


def test_arena_planner_beats_greedy_by_size_on_a_residual():
    """Greedy by size alone puts the largest buffer at 0 and needs 4 units here; 3 suffice."""
    p = ArenaPlanner()
    for size, first, last in [(16, 0, 3), (16, 1, 2), (16, 2, 3), (16, 3, 4), (32, 4, 5), (8, 5, 6)]:
        p.add(size * 1024, first, last)
    offsets, peak = p.plan()
    assert peak == p.lower_bound() == 48 * 1024
    for i, (si, fi, li) in enumerate(p.buffers):  # buffers alive together never overlap
        for j, (sj, fj, lj) in enumerate(p.buffers[:i]):
            if not (li < fj or lj < fi):
                assert offsets[i] + si <= offsets[j] or offsets[j] + sj <= offsets[i]


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_invoke_allocates_only_the_outputs(models, kind):
    """Beyond the returned outputs, only numpy's own iteration buffers (at most 64 KiB each, freed
    at once) may appear: nothing scales with the model's activations."""
    it = Interpreter(models[kind])
    x = rng.uniform(0, 1, cnn.SHAPE).astype(np.float32)
    it.invoke(x)
    tracemalloc.start()
    try:
        it.invoke(x)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * 1024 < it.arena_bytes + it.tensor_bytes


def test_per_op_overhead_is_small():
    def chain(n):
        w = ModelWriter()
        cur = w.add_input("x", "float32", (1, 8))
        for k in range(n):
            y = w.add_tensor(f"t{k}", "float32", (1, 8))
            w.add_operator("Relu", [cur], [y])
            cur = y
        w.mark_output(cur)
        return Interpreter(w.to_bytes())

    def best(it):
        xv = np.ones((1, 8), np.float32)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(50):
                it.invoke(xv)
            times.append((time.perf_counter() - t) / 50)
        return min(times)
    per_op = (best(chain(201)) - best(chain(1))) / 200
    assert per_op < 20e-6, f"{per_op * 1e6:.2f} us per op"  # about 1 us here: one numpy call and a closure


# ---- hostile files and graphs --------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_truncated_and_bit_flipped_models_only_raise_edge_model_errors(models, kind):
    data = models[kind]
    fb_end = min(off for off, size in loads(data).buffers if size)  # the flatbuffer; the weights follow
    r = np.random.default_rng(5)
    cases = [data[:n] for n in r.integers(0, len(data), 40)]
    for _ in range(160):
        b = bytearray(data)
        for _ in range(r.integers(1, 4)):  # flips in the weights would only change values
            i = int(r.integers(0, fb_end))
            b[i] ^= 1 << int(r.integers(0, 8))
        cases.append(bytes(b))
    x = np.zeros(cnn.SHAPE, np.float32)
    outcomes = {"ok": 0, "refused": 0}
    with np.errstate(all="ignore"):
        for c in cases:
            try:
                Interpreter(c).invoke(x)
                outcomes["ok"] += 1
            except EdgeModelError:
                outcomes["refused"] += 1
    print(kind, outcomes)
    assert outcomes["refused"] > 40 and outcomes["ok"] > 5


def _chain_model(op="Relu", attrs=None, shape=(1, 2, 6, 6), out_shape=None, dtype="float32", twice=False,
                 read_early=False):
    w = ModelWriter()
    x = w.add_input("x", dtype, shape)
    mid = w.add_tensor("mid", dtype, out_shape or shape)
    y = w.add_tensor("y", dtype, out_shape or shape)
    if read_early:
        w.add_operator("Relu", [mid], [y])
        w.add_operator(op, [x], [mid], attrs)
    else:
        w.add_operator(op, [x], [mid], attrs)
        w.add_operator("Relu", [mid], [mid if twice else y])
    w.mark_output(y)
    return w.to_bytes()


@pytest.mark.parametrize("kwargs,message", [
    (dict(read_early=True), "read before any operator writes it"),
    (dict(twice=True), "written twice"),
    (dict(op="Frobnicate"), "no edge kernel; edge kernels: .*Conv2D"),
    (dict(dtype="int16"), "fp32 kernels take float32 only"),
    (dict(op="MaxPool", attrs={"ksize": [2, 2], "strides": [0, 1]}), "'strides'.*outside"),
    (dict(op="MaxPool", attrs={"ksize": [1 << 30, 1 << 30]}), "does not fit input"),
    (dict(op="MaxPool", attrs={"ksize": [2, 2], "pads": [1 << 40, 0, 0, 0]}), "outside|exceeds"),
    (dict(op="AvgPool", attrs={"ksize": [3, 3], "pads": [5, 5, 5, 5]}), "exceeds the window's reach"),
    (dict(op="Pad", attrs={"paddings": [0, 0, 0, 0, 1 << 20, 0, 0, 0]}), "outside"),
    (dict(op="Softmax", attrs={"axis": 9}), "'axis'.*outside"),
    (dict(op="Relu", out_shape=(1, 2, 6, 7)), "the file declares"),
])
def test_hostile_graphs_are_refused_with_a_reason(kwargs, message):
    with pytest.raises(EdgeModelError, match=message):
        Interpreter(_chain_model(**kwargs))


def test_memory_bound_set_by_the_file_size():
    w = ModelWriter()
    x = w.add_input("x", "float32", (1, 4))
    y = w.add_tensor("y", "float32", (1 << 14, 1 << 14))  # 1 GiB declared by a tiny file
    w.add_operator("Relu", [x], [y])
    w.mark_output(y)
    with pytest.raises(EdgeModelError, match="beyond the bound|exceeds the memory bound"):
        Interpreter(w.to_bytes())


# ---- importing stays light -----------------------------------------------------------------------
def test_import_and_run_without_core_onnx_grpc_or_flatbuffers(tmp_path, models):
    path = tmp_path / "cnn.isth"
    path.write_bytes(models["int8"])
    code = ("import sys, numpy as np, isthmus.edge as e; m = e.load(sys.argv[1]); "
            "y = e.Interpreter(m).invoke(np.zeros((1, 3, 32, 32), np.float32)); "
            "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('onnx', 'onnxruntime', 'grpc', 'flatbuffers') "
            "or n.startswith(('isthmus.core', 'isthmus.partitioner', 'isthmus.converters', 'isthmus.cloud'))); "
            "print(bad, y[0].shape)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] (1, 10)"
