"""`isthmus convert MODEL --to edge|onnx -o OUT`: convert an ONNX or TFLite file (or a Python
function that builds a graph, `file.py:function`) to the edge format or to ONNX."""
from __future__ import annotations

import argparse
import os
import sys

from isthmus.converters.edge_export import to_edge
from isthmus.converters.onnx_export import to_onnx
from isthmus.converters.tflite_import import TFLiteImportError, from_tflite

from .partition import load_model


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an .onnx or .tflite file, or file.py:function returning a Graph or (Graph, outputs)")
    p.add_argument("--to", choices=["edge", "onnx"], default="edge")
    p.add_argument("-o", "--output", default=None, help="output path (default: MODEL with .isth or .onnx)")
    p.add_argument("--batch", type=int, default=1, help="batch size for unknown leading dims (edge)")
    p.add_argument("--nhwc", action="store_true",
                   help="TFLite: keep 4-D inputs and outputs NHWC (default NCHW, which needs no transposes)")


def _load(args):
    if args.model.endswith(".tflite"):
        try:
            graph, _, outputs = from_tflite(args.model, nhwc_io=args.nhwc)
        except (OSError, TFLiteImportError) as e:
            raise SystemExit(f"cannot import {args.model}: {e}") from None
        return graph, list(outputs)
    return load_model(args.model)


def run(args) -> int:
    graph, outputs = _load(args)
    if not outputs:
        raise SystemExit("the model names no outputs: return (graph, outputs) from the function")
    base = os.path.splitext(args.model.split(":")[0])[0]
    out = args.output or base + (".isth" if args.to == "edge" else ".converted.onnx")
    if args.to == "edge":
        data = to_edge(graph, outputs, batch=args.batch, metadata={"source": os.path.basename(args.model)})
        with open(out, "wb") as f:
            f.write(data)
    else:
        import onnx  # the onnx package, a heavy import, only when writing ONNX
        onnx.save(to_onnx(graph, outputs), out)
    print(f"wrote {out} ({os.path.getsize(out):,} bytes)")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_arguments(p)
    sys.exit(run(p.parse_args()))
