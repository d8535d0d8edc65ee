"""`isthmus quantize MODEL --calibration-data data.npz -o m.isth`: post-training int8 quantization
to an edge file (a QDQ model's own scales need no data), with a report (ops int8 / fp32, size ratio,
output drift against fp32)."""
from __future__ import annotations

import argparse
import inspect
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

import numpy as np

from .deploy import calibration_feeds
from .errors import UsageError, non_negative_int, output_path, positive_int
from .model_source import LoadedModel, load_model, parse_input_shapes

EXAMPLES = """examples:
  isthmus quantize cnn.onnx --calibration-data calib.npz -o cnn.int8.isth
  isthmus quantize model.graph --calibration-data calib.npz --method percentile --percentile 99.9 -o m.isth
  isthmus quantize model.qdq.onnx -o m.isth     # a QDQ model: its own scales, no data needed
  isthmus edge-run cnn.int8.isth --input image=x.npy
The .npz holds sample inputs by input name (or one array for a one-input model), samples along axis 0."""
METHODS = ("minmax", "percentile", "entropy")
_SCALES = {"calibration": "scales: from the calibration data",
           "qdq": "scales: from the model's QDQ nodes (QuantizeLinear/DequantizeLinear), no calibration",
           "qdq+calibration": "scales: from the model's QDQ nodes; calibration data for tensors the file leaves out"}


@dataclass
class QuantizeReport:
    """What quantization did: op counts, sizes and the int8 model's drift from fp32."""
    path: str
    int8_ops: int
    fp32_ops: int
    int8_bytes: int
    fp32_bytes: int
    samples: int
    max_abs_drift: float          # largest |int8 - fp32| over outputs and samples
    rel_drift: float              # that, over the largest |fp32| output value
    top1_agreement: Optional[float]  # classifiers: how often argmax agrees
    method: str
    seconds: float
    notes: List[str] = field(default_factory=list)
    scales_from: str = "calibration"  # or "qdq" (the model's QuantizeLinear/DequantizeLinear), "qdq+calibration"

    def text(self) -> str:
        top1 = "" if self.top1_agreement is None else f", top-1 agreement {self.top1_agreement:.1%}"
        lines = [f"quantized ({self.method}): {self.int8_ops} ops int8, {self.fp32_ops} ops fp32",
                 f"size: {self.int8_bytes:,} bytes int8 vs {self.fp32_bytes:,} fp32 "
                 f"({self.int8_bytes / max(self.fp32_bytes, 1):.2f}x)",
                 _SCALES[self.scales_from]]
        if self.samples:
            lines.append(f"drift vs {'the QDQ model' if self.scales_from != 'calibration' else 'fp32'} on "
                         f"{self.samples} calibration samples: max abs {self.max_abs_drift:.4g} "
                         f"({self.rel_drift:.2%} of the largest output){top1}")
        else:
            lines.append("drift not measured (no --calibration-data)")
        lines += [f"note: {n}" for n in self.notes]
        lines.append(f"wrote {self.path} in {self.seconds:.1f} s")
        return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog, p.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument("model", help="an .onnx, .tflite or .graph file, or file.py:function")
    p.add_argument("--calibration-data", default=None, metavar="NPZ",
                   help="sample inputs (see below); optional for a QDQ model, whose own scales are used")
    p.add_argument("-o", "--output", default=None, help="edge file to write (default: MODEL with .int8.isth)")
    p.add_argument("--method", choices=METHODS, default="minmax",
                   help="activation ranges: minmax, percentile (clips outliers) or entropy (default %(default)s)")
    p.add_argument("--percentile", type=float, default=99.99, help="with --method percentile (default %(default)s)")
    scales = p.add_mutually_exclusive_group()
    scales.add_argument("--per-channel", dest="per_channel", action="store_const", const=True, default=None,
                        help="one weight scale per output channel of conv and dense weights (the default)")
    scales.add_argument("--per-tensor", dest="per_channel", action="store_const", const=False,
                        help="one weight scale per weight tensor")
    p.add_argument("--unquantized", choices=("error", "fp32"), default="error",
                   help="a QDQ model's int8-capable node on a tensor the file gives no scale (and no data "
                        "calibrates): refuse it naming the tensor, or run it in float as the file does")
    p.add_argument("--limit", type=non_negative_int, default=0, help="use the first N samples only (0: all)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,..",
                   help="shape of an input whose dims the model leaves unknown (repeatable)")
    p.add_argument("--batch", type=positive_int, default=1, help="batch size for unknown leading dims")
    p.add_argument("--dynamic-batch", action="store_true",
                   help="keep an unknown leading dim unknown (the file then runs at any batch)")
    p.add_argument("--force", action="store_true", help="overwrite -o")


def quantize(model: Union[str, LoadedModel], calibration, output: str, method: str = "minmax",
             percentile: float = 99.99, per_channel: Optional[bool] = None, limit: int = 0, batch: int = 1,
             input_shapes=None, force: bool = False, unquantized: str = "error") -> QuantizeReport:
    """Quantize `model` on `calibration` (an .npz path or {input name: samples}) into `output`.
    `per_channel`: None keeps the quantizer's default (per channel)."""
    from isthmus.converters.edge_export import to_edge  # deferred: converters.edge_export loads flatbuffers
    from isthmus.converters.quantize import quantize_to_edge  # deferred: converters.quantize loads flatbuffers
    # deferred: converters.quantize_qdq loads the graph machinery (isthmus.core)
    from isthmus.converters.quantize_qdq import fp32_graph, has_qdq
    t0 = time.perf_counter()
    if method not in METHODS:
        raise UsageError(f"--method {method}: expected one of {', '.join(METHODS)}")
    if method == "percentile" and not 50.0 < percentile <= 100.0:
        raise UsageError(f"--percentile {percentile}: expected a number in (50, 100]")
    output_path(output, force)
    m = model if isinstance(model, LoadedModel) else load_model(model, input_shapes)
    qdq = has_qdq(m.graph.nodes)
    if calibration is None and not qdq:
        raise UsageError(f"{m.source}: --calibration-data is needed (the model has no QDQ scales of its own)")
    feeds = calibration_feeds(calibration, m, limit) if calibration is not None else []
    params = inspect.signature(quantize_to_edge).parameters
    kw, notes = {"batch": batch}, []
    if method == "percentile":
        kw["percentile"] = percentile
    elif method == "entropy":
        if "method" not in params:
            raise UsageError("--method entropy: this version's quantizer offers minmax and percentile only")
        kw["method"] = "entropy"
    if per_channel is not None and "per_channel" in params:  # None: the quantizer's default (per channel)
        kw["per_channel"] = per_channel
    elif per_channel is False:
        raise UsageError("--per-tensor: this version's quantizer quantizes weights per channel only")
    sess = m.session()
    outs = list(m.outputs.values())
    if qdq:
        kw["unquantized"] = unquantized
    data, rep = quantize_to_edge(sess, outs, feeds or None, **kw)
    if qdq:  # the float model the QDQ nodes quantize
        g, fouts, _ = fp32_graph(sess, outs)
        fp32 = to_edge(g, fouts, inputs=[t.name for t in m.inputs.values()], batch=batch)
    else:
        fp32 = to_edge(sess, outs, inputs=[t.name for t in m.inputs.values()], batch=batch)
    tmp = output + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, output)
    drift, rel, top1 = measure_drift(data, sess, m, feeds) if feeds else (0.0, 0.0, None)
    notes += rep.get("requantized", [])
    return QuantizeReport(output, rep["int8_ops"], rep["fp32_ops"], len(data), len(fp32), len(feeds), drift, rel,
                          top1, "QDQ" if rep.get("scales_from") == "qdq" else
                          method if method != "percentile" else f"percentile {percentile:g}",
                          time.perf_counter() - t0, notes, rep.get("scales_from", "calibration"))


def measure_drift(edge_model, sess, m: LoadedModel, feeds: List[Dict[str, np.ndarray]]):
    """(max |int8 - fp32|, that over max |fp32|, top-1 agreement or None) over the feeds; `edge_model`:
    the edge file's bytes or a loaded EdgeModel."""
    # deferred: the edge interpreter, loaded only by the commands that need it
    from isthmus.edge.interpreter import Interpreter
    interp = Interpreter(edge_model)
    names = list(interp.input_shapes)
    outs = list(m.outputs.values())
    worst, peak, agree, n = 0.0, 0.0, 0, 0
    classifier = len(outs) == 1 and len(outs[0].shape) == 2
    for f in feeds:
        ref = sess.run(outs, {m.graph.tensor(k + ":0"): v for k, v in f.items()})
        got = interp.invoke(*[f[k] for k in names])
        for r, g in zip(ref, got):
            r = np.asarray(r, np.float64)
            worst = max(worst, float(np.abs(r - np.asarray(g, np.float64).reshape(r.shape)).max()))
            peak = max(peak, float(np.abs(r).max()))
        if classifier:
            agree += int((np.argmax(ref[0], -1) == np.argmax(got[0].reshape(ref[0].shape), -1)).sum())
            n += ref[0].shape[0]
    return worst, worst / peak if peak else 0.0, (agree / n if classifier and n else None)


def run(args) -> int:
    out = args.output or os.path.splitext(args.model.split(":")[0])[0] + ".int8.isth"
    rep = quantize(args.model, args.calibration_data, out, args.method, args.percentile, args.per_channel,
                   args.limit, -1 if args.dynamic_batch else args.batch, parse_input_shapes(args.input_shape),
                   args.force, args.unquantized)
    print(rep.text())
    return 0


__all__ = ["quantize", "QuantizeReport", "measure_drift"]
