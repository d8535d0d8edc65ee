"""`isthmus info FILE`: what a model file holds (inputs and outputs with shapes and dtypes, op
counts int8 / fp32, sizes, remote parts, producer), for every format isthmus reads."""
from __future__ import annotations

import argparse
import collections
import json
import os
from typing import Dict, List

import numpy as np

from isthmus.wire.split_format import SPLIT_KEY

from .errors import UsageError, input_file
from .model_source import load_model

EXAMPLES = """examples:
  isthmus info cnn.onnx
  isthmus info deploy/model.isth          # a split edge file: its cuts and remote parts
  isthmus info deploy/model.cloud --json
Formats: .onnx, .tflite, .graph (isthmus import), .isth (edge), .cloud (isthmus split), file.py:function."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog, p.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument("file", help="a model file (or file.py:function)")
    p.add_argument("--json", action="store_true", help="print the description as JSON")


def describe_file(path: str) -> Dict[str, object]:
    """A JSON-able description of the model in `path`."""
    low = path.lower()
    if low.endswith(".isth"):
        return _edge(input_file(path, "FILE"))
    if low.endswith(".cloud"):
        return _cloud(input_file(path, "FILE"))
    m = load_model(path)
    return _graph(m)


def _shape(shape) -> List[object]:
    return ["?" if d is None or d == -1 else int(d) for d in shape]


def _io(name: str, dtype, shape) -> Dict[str, object]:
    return {"name": name, "dtype": np.dtype(dtype).name, "shape": _shape(shape)}


def _graph(m) -> Dict[str, object]:
    # deferred: the graph machinery (isthmus.core), loaded only by the commands that need it
    from isthmus.core.executor import prune
    outs = list(m.outputs.values())
    nodes = prune([t.node for t in outs], set())
    ops = collections.Counter(n.op for n in nodes if n.op not in ("Const", "Placeholder", "Variable"))
    weights = sum(np.asarray(n.attrs["value"]).nbytes for n in nodes if n.op == "Const" and "value" in n.attrs)
    weights += sum(int(np.prod(n.outputs[0].shape)) * np.dtype(n.outputs[0].dtype).itemsize
                   for n in nodes if n.op == "Variable" and None not in n.outputs[0].shape)
    int8 = sum(1 for n in nodes if n.op not in ("Const", "Placeholder", "Variable")
               and any(np.dtype(t.dtype) == np.int8 for t in n.outputs))
    size = os.path.getsize(m.source) if os.path.isfile(m.source) else None
    return {"file": m.source, "format": m.kind, "producer": m.producer, **m.extra,
            "inputs": [_io(k, t.dtype, t.shape) for k, t in m.inputs.items()],
            "outputs": [_io(k, t.dtype, t.shape) for k, t in m.outputs.items()],
            "ops": dict(sorted(ops.items())), "int8_ops": int8, "fp32_ops": sum(ops.values()) - int8,
            "weight_bytes": int(weights), "file_bytes": size, "remote_parts": []}


def _edge(path: str) -> Dict[str, object]:
    # deferred: the edge runtime, loaded only by the commands that need it
    from isthmus.edge.format import EdgeModelError
    from isthmus.edge.loader import load  # deferred: the edge runtime, loaded only by the commands that need it
    try:
        models = [load(path)]
        split = None
    except EdgeModelError as e:
        if "subgraph" not in str(e):
            raise UsageError(f"FILE {path}: not a valid edge model: {e}") from None
        # deferred: the edge runtime, loaded only by the commands that need it
        from isthmus.edge.split_model import load_split
        try:
            split = load_split(path)
        except EdgeModelError as e2:
            raise UsageError(f"FILE {path}: not a valid edge model: {e2}") from None
        models = [split.full or split.cuts[0].model]
    m = models[0]
    out = {"file": path, "format": "isthmus edge model" + (" (split)" if split else ""), "producer": m.producer,
           "version": m.version, "file_bytes": os.path.getsize(path)}
    out.update(_edge_model(m))
    out["metadata"] = {k: v for k, v in m.metadata.items() if k != SPLIT_KEY and len(v) < 200}
    if split:
        out["cuts"] = [{"name": c.name, "uplink_mbps": [c.min_bandwidth_bps / 1e6, None if np.isinf(c.max_bandwidth_bps)
                                                        else c.max_bandwidth_bps / 1e6],
                        "cloud_part": c.cloud_part or None, "sends": c.inputs, "receives": c.outputs,
                        **{k: v for k, v in _edge_model(c.model).items() if k in ("int8_ops", "fp32_ops")}}
                       for c in split.cuts]
        out["remote_parts"] = [c.cloud_part for c in split.cuts if c.cloud_part]
    return out


def _edge_model(m) -> Dict[str, object]:
    ops = collections.Counter(o.op for o in m.operators)
    int8 = sum(1 for o in m.operators if o.outputs and m.tensors[o.outputs[0]].dtype == np.int8
               and o.op != "Quantize")
    weights = sum(t.data.nbytes for t in m.tensors if t.data is not None)
    t = m.tensors
    return {"inputs": [_io(t[i].name, t[i].dtype, t[i].shape) for i in m.inputs],
            "outputs": [_io(t[i].name, t[i].dtype, t[i].shape) for i in m.outputs],
            "ops": dict(sorted(ops.items())), "int8_ops": int8, "fp32_ops": sum(ops.values()) - int8,
            "weight_bytes": int(weights), "remote_parts": [p.name for p in m.remote]}


def _cloud(path: str) -> Dict[str, object]:
    # deferred: cloud.offload_model loads protobuf, scipy
    from isthmus.cloud.offload_model import CloudPartsError, load_cloud_parts
    try:
        cm = load_cloud_parts(path)
    except CloudPartsError as e:
        raise UsageError(f"FILE {e}") from None
    parts = []
    for p in cm.parts.values():
        ops = collections.Counter(n.op for n in p.graph.nodes if n.op not in ("Const", "Placeholder"))
        parts.append({"name": p.name, "batchable": p.batchable, "ops": dict(sorted(ops.items())),
                      "inputs": [s.to_json() for s in p.inputs], "outputs": [s.to_json() for s in p.outputs]})
    return {"file": path, "format": "isthmus cloud parts", "model": cm.model, "file_bytes": os.path.getsize(path),
            "parts": parts}


def _print(d: Dict[str, object]) -> None:
    print(f"{d['file']}: {d['format']}" + (f", producer {d['producer']}" if d.get("producer") else "")
          + (f", {d['file_bytes']:,} bytes" if d.get("file_bytes") else ""))
    for key in ("inputs", "outputs"):
        for io in d.get(key, []):
            print(f"  {key[:-1]:<6} {io['name']}: {io['dtype']}[{', '.join(map(str, io['shape']))}]")
    if "ops" in d:
        print(f"  ops    {d['int8_ops'] + d['fp32_ops']} ({d['int8_ops']} int8, {d['fp32_ops']} fp32): "
              + ", ".join(f"{k} x{v}" for k, v in d["ops"].items()))
        print(f"  weights {d['weight_bytes']:,} bytes")
    for c in d.get("cuts", []):
        hi = "inf" if c["uplink_mbps"][1] is None else f"{c['uplink_mbps'][1]:.3g}"
        where = f"sends {', '.join(c['sends'])} to cloud part '{c['cloud_part']}'" if c["cloud_part"] else "edge only"
        print(f"  cut {c['name']}: uplink {c['uplink_mbps'][0]:.3g}..{hi} Mbit/s, {where}")
    for p in d.get("parts", []):
        print(f"  part {p['name']}: {', '.join(s['name'] for s in p['inputs'])} -> "
              f"{', '.join(s['name'] for s in p['outputs'])}; {sum(p['ops'].values())} ops"
              + ("" if p["batchable"] else " (unbatched)"))
    if d.get("remote_parts"):
        print(f"  remote parts: {', '.join(d['remote_parts'])}")


def run(args) -> int:
    d = describe_file(args.file)
    if args.json:
        print(json.dumps(d, indent=1, default=str))
    else:
        _print(d)
    return 0


__all__ = ["describe_file"]
