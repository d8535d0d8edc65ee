"""Default planning never places on the edge a node that the phone formats then refuse: every edge part
test_edge_capabilities.py's plans make (the test suite's and the benchmarks' models, native and through
ONNX, an edge that takes all it can and the default profile) is written as .tflite and as ONNX, and
LiteRT and onnxruntime compute what isthmus's edge interpreter computes on it (fp32, 1e-5 relative)."""
import numpy as np
import pytest

from isthmus.converters.edge_export import to_edge
from isthmus.converters.onnx_edge import edge_to_onnx
from isthmus.converters.split_export import _standalone
from isthmus.converters.tflite_write import edge_to_tflite
from isthmus.edge import Interpreter
from isthmus.edge.loader import loads
from isthmus.partitioner import plan_split
from isthmus.partitioner.devices import EDGE_DEVICE
from isthmus.partitioner.partition import partition

from .test_edge_capabilities import COSTS, _models
from .test_writer_ops import output_step, run_litert, run_onnx

litert = pytest.importorskip("ai_edge_litert.interpreter")


def _edge_parts(make_cost):
    """(model name, the edge part as an isthmus edge model) of every plan that puts something on the edge."""
    for name, g, outs in _models():
        batch = outs[0].shape[0] or 1
        plan = plan_split(g, make_cost(batch), outputs=outs)
        part = partition(g, plan.placement, outs, return_to=EDGE_DEVICE)
        edge_part = part.parts.get(EDGE_DEVICE)
        if edge_part is None:
            continue
        eg, recvs, sends, eouts = _standalone(edge_part, part.transfers, batch_none=False)
        e_outs = [sends[s] for s in sorted(sends)] + [eouts[t.name] for t in outs if t.name in eouts]
        e_ins = list(recvs.values()) + [n.outputs[0] for n in eg.nodes if n.op == "Placeholder"
                                        and n.outputs[0] not in recvs.values()]
        if e_outs:
            yield name, to_edge(eg, e_outs, e_ins, batch=batch)


def _feeds(edge: bytes):
    m, rng = loads(edge), np.random.default_rng(5)
    out = []
    for i in m.inputs:
        t = m.tensors[i]
        shape = tuple(1 if d < 0 else d for d in t.shape)
        out.append(rng.standard_normal(shape).astype(np.float32) if t.dtype == np.float32
                   else rng.integers(0, 2, shape).astype(t.dtype))
    return out


@pytest.mark.parametrize("cost_name,make_cost", COSTS, ids=[c[0] for c in COSTS])
def test_every_planned_edge_part_writes_as_tflite_and_onnx_and_runs_there(cost_name, make_cost):
    checked, ops = 0, set()
    for name, edge in _edge_parts(make_cost):
        ops |= {op.op for op in loads(edge).operators}
        xs = _feeds(edge)
        want = Interpreter(edge).invoke(*xs)
        for fmt, run in (("tflite", lambda: run_litert(edge_to_tflite(edge), xs)),
                         ("onnx", lambda: run_onnx(edge_to_onnx(edge), xs))):
            try:
                got = run()
            except Exception as e:
                pytest.fail(f"{name} ({cost_name}): the plan's edge part does not run as {fmt}: {e}")
            for g, w in zip(got, want):
                assert g.shape == w.shape, (name, fmt)
                assert np.abs(g - w).max() <= 1e-5 * max(1.0, float(np.abs(w).max())), (name, fmt)
        checked += 1
    assert checked >= 8, checked


def test_every_planned_edge_part_quantized_writes_as_tflite_and_onnx_within_its_drift():
    """The same edge parts (an edge that takes all it can) quantized by converters/quantize.py on random
    calibration feeds: LiteRT and onnxruntime (the QDQ graph as written) differ from the int8 edge
    interpreter by no more than that differs from fp32, or one output step where that is smaller (per-op
    steps compound through the layers)."""
    from isthmus.converters.quantize import quantize_to_edge
    from isthmus.core.session import Session
    checked, ops = 0, set()
    for name, g, outs in _models():
        batch = outs[0].shape[0] or 1
        plan = plan_split(g, COSTS[0][1](batch), outputs=outs)
        part = partition(g, plan.placement, outs, return_to=EDGE_DEVICE)
        if part.parts.get(EDGE_DEVICE) is None:
            continue
        eg, recvs, sends, eouts = _standalone(part.parts[EDGE_DEVICE], part.transfers, batch_none=False)
        e_outs = [sends[s] for s in sorted(sends)] + [eouts[t.name] for t in outs if t.name in eouts]
        e_ins = list(recvs.values()) + [n.outputs[0] for n in eg.nodes if n.op == "Placeholder"
                                        and n.outputs[0] not in recvs.values()]
        if not e_outs or any(t.dtype != np.float32 for t in e_ins):
            continue
        fp32 = to_edge(eg, e_outs, e_ins, batch=batch)
        m32 = loads(fp32)
        names = [m32.tensors[i].name for i in m32.inputs]      # the placeholders' node names
        calib = [dict(zip(names, _feeds(fp32))) for _ in range(4)]
        edge, _ = quantize_to_edge(Session(eg, optimize=False), e_outs, calib, batch=batch)
        rng = np.random.default_rng(9)
        by_name = {n: rng.standard_normal(x.shape).astype(np.float32) for n, x in zip(names, _feeds(fp32))}
        m8 = loads(edge)
        ops |= {op.op for op in m8.operators}
        xs = [by_name[m8.tensors[i].name] for i in m8.inputs]
        want, ref = Interpreter(edge).invoke(*xs), Interpreter(fp32).invoke(*[by_name[n] for n in names])
        got_t, got_o = run_litert(edge_to_tflite(edge), xs), run_onnx(edge_to_onnx(edge), xs)
        assert [m8.tensors[i].name.replace("/dequant", "") for i in m8.outputs] == \
            [m32.tensors[i].name for i in m32.outputs], name     # the same outputs, in the same order
        for k, (w, r) in enumerate(zip(want, ref)):
            drift = max(float(np.abs(w - r).max()), output_step(m8, k))
            for fmt, got in (("tflite", got_t[k]), ("onnx", got_o[k])):
                assert np.abs(got - w).max() <= drift + 1e-6, (name, fmt, k, float(np.abs(got - w).max()), drift)
        checked += 1
    assert checked >= 5, checked
    assert {"FusedConv2D", "FusedMatMul", "LayerNorm", "Quantize", "Dequantize"} <= ops, ops
