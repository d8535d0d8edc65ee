"""Runs every ONNX backend node case the installed onnx package defines through from_onnx and the
isthmus executor, and sorts each into pass / refused (OnnxImportError) / wrong / crash.

Shared by tests/converters/test_onnx_backend.py and docs/gen_onnx_coverage.py.
"""
from __future__ import annotations

import os
import re
import signal
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

REFUSALS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnx_expected_refusals.txt")
CASE_SECONDS = 20  # one case that runs longer than this counts as a crash (a hang must not stall CI)

# The ops that CNN, RNN, transformer and int8 models use (the "important-op" subset).
IMPORTANT_OPS = set("""
Abs Add And ArgMax ArgMin Attention AveragePool BatchNormalization Cast CastLike Ceil Celu Clip Concat Constant
ConstantOfShape Conv ConvInteger ConvTranspose Cos CumSum DepthToSpace DequantizeLinear Div Dropout DynamicQuantizeLinear
Einsum Elu Equal Erf Exp Expand Flatten Floor GRU Gather GatherElements GatherND Gelu Gemm GlobalAveragePool
GlobalMaxPool Greater GreaterOrEqual GroupNormalization HardSigmoid HardSwish Hardmax Identity If InstanceNormalization
IsInf IsNaN LRN LSTM LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop MatMul MatMulInteger Max
MaxPool Mean Min Mish Mod Mul Neg NonZero Not OneHot Or PRelu Pad Pow QLinearConv QLinearMatMul QuantizeLinear RMSNormalization
RNN Range Reciprocal ReduceL1 ReduceL2 ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum
ReduceSumSquare Relu Reshape Resize RotaryEmbedding Round ScatterElements ScatterND Selu Shape Sigmoid Sign Sin Size
Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tanh ThresholdedRelu Tile TopK Transpose Trilu
Unsqueeze Upsample Where Xor
""".split())


@dataclass
class Result:
    name: str
    op: str
    status: str  # pass | refused | wrong | crash
    detail: str = ""


def load_cases():
    """The node cases of the installed onnx package, built in memory (about 12 s)."""
    import onnx.backend.test.loader as loader
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return loader.load_model_tests(kind="node")


def case_ops(cases) -> Dict[str, str]:
    """Case name -> the ONNX op it tests: the single node's op, or (for expanded and multi-node
    cases) the op of the longest single-node case name it starts with."""
    single = {c.name: c.model.graph.node[0].op_type for c in cases if len(c.model.graph.node) == 1}
    out = {}
    for c in cases:
        if c.name in single and "_expanded" not in c.name:
            out[c.name] = single[c.name]
            continue
        base = re.sub(r"_expanded.*$", "", c.name)
        best = max((n for n in single if base == n or base.startswith(n + "_")), key=len, default=None)
        out[c.name] = single[best] if best else (c.model.graph.node[-1].op_type if c.model.graph.node else "?")
    return out


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout(f"ran over {CASE_SECONDS} s")


def run_case(case) -> tuple:
    """(status, detail) of one case."""
    import isthmus as ism
    from isthmus.converters.onnx_import import OnnxImportError, from_onnx
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            try:
                g, ins, outs = from_onnx(case.model)
            except OnnxImportError as e:
                return "refused", _short(str(e))
            names = [i.name for i in case.model.graph.input
                     if i.name not in {t.name for t in case.model.graph.initializer}]
            sess = ism.Session(g)
            sess.run(ism.global_variables_initializer(g))
            for inputs, refs in case.data_sets:
                inputs, refs = [_array(v) for v in inputs], [_array(v) for v in refs]
                feed = {ins[n]: v for n, v in zip(names, inputs) if n in ins}
                got = sess.run(list(outs), feed) if outs else []
                problem = _compare(refs, got, case.rtol, case.atol)
                if problem:
                    return "wrong", problem
            return "pass", ""
    except _Timeout as e:
        return "crash", str(e)
    except Exception as e:  # noqa: BLE001 (the point is to classify every escape)
        return "crash", _short(f"{type(e).__name__}: {e}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _array(v):
    """Case data come as numpy arrays or, for some dtypes, as TensorProtos."""
    from onnx import TensorProto, numpy_helper
    return numpy_helper.to_array(v) if isinstance(v, TensorProto) else v


def _compare(refs, got, rtol, atol) -> Optional[str]:
    if len(refs) != len(got):
        return f"{len(got)} outputs, expected {len(refs)}"
    for k, (r, o) in enumerate(zip(refs, got)):
        if isinstance(r, list):
            return f"output {k}: sequence outputs are not compared"
        o = np.asarray(o)
        if o.dtype != r.dtype:
            return f"output {k}: dtype {o.dtype}, expected {r.dtype}"
        if o.shape != r.shape:
            return f"output {k}: shape {o.shape}, expected {r.shape}"
        try:
            if r.dtype == object or r.dtype.kind in "SU":
                np.testing.assert_array_equal(o, r)
            else:
                np.testing.assert_allclose(o, r, rtol=rtol, atol=atol)
        except AssertionError as e:
            return f"output {k}: " + _short(str(e).strip().replace("\n", " "))
    return None


def _short(s: str, n: int = 300) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[:n] + "..."


def run_all(cases=None, only: Optional[List[str]] = None) -> List[Result]:
    cases = cases if cases is not None else load_cases()
    ops = case_ops(cases)
    out = []
    for c in cases:
        if only and c.name not in only:
            continue
        status, detail = run_case(c)
        out.append(Result(c.name, ops[c.name], status, detail))
    return out


def read_refusals(path: str = REFUSALS_FILE) -> Dict[str, str]:
    """Case name -> reason, from the expected-refusals file (`name  # reason` per line)."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, reason = line.partition("#")
            out[name.strip()] = reason.strip()
    return out


def write_refusals(results: List[Result], path: str = REFUSALS_FILE) -> None:
    lines = ["# ONNX backend node cases that from_onnx refuses with OnnxImportError, with the reason.",
             "# This list may only shrink: a listed case that passes fails the test (remove it from the list).",
             "# Regenerate with: PYTHONPATH=... python docs/gen_onnx_coverage.py --update-refusals", ""]
    for r in sorted(results, key=lambda r: r.name):
        if r.status == "refused":
            lines.append(f"{r.name}  # {reason_of(r.detail)}")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


def reason_of(detail: str) -> str:
    """The refusal message without its node-specific parts, short enough to group by."""
    m = re.match(r"^cannot import \(opset \d+\): (.*?)(\. Supported: .*)?$", detail)
    if m:
        ops = sorted({part.split(" x")[0] for part in m.group(1).split("; ")})
        return "no handler for " + ", ".join(ops)
    d = re.sub(r"^node \d+ '[^']*' \([^)]*\): ", "", detail)
    d = re.sub(r"'[^']*_expanded_function_[^']*'", "'...'", d)
    return _short(d, 160)
