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
from .test_writer_ops import run_litert, run_onnx

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
