"""`isthmus convert MODEL --to edge|onnx -o OUT`: convert an ONNX file (or a Python function that
builds a graph, `file.py:function`) to the edge format or back to ONNX."""
from __future__ import annotations

import argparse
import os
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an .onnx file, or file.py:function returning a Graph or (Graph, outputs)")
    p.add_argument("--to", choices=["edge", "onnx"], default="edge")
    p.add_argument("-o", "--output", default=None, help="output path (default: MODEL with .isth or .onnx)")
    p.add_argument("--batch", type=int, default=1, help="batch size for unknown leading dims (edge)")


def run(args) -> int:
    from isthmus.partitioner.cli import load_model
    graph, outputs = load_model(args.model)
    if not outputs:
        raise SystemExit("the model names no outputs: return (graph, outputs) from the function")
    base = os.path.splitext(args.model.split(":")[0])[0]
    out = args.output or base + (".isth" if args.to == "edge" else ".converted.onnx")
    if args.to == "edge":
        from .edge_export import to_edge
        data = to_edge(graph, outputs, batch=args.batch, metadata={"source": os.path.basename(args.model)})
        with open(out, "wb") as f:
            f.write(data)
    else:
        import onnx
        from .onnx_export import to_onnx
        onnx.save(to_onnx(graph, outputs), out)
    print(f"wrote {out} ({os.path.getsize(out):,} bytes)")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_arguments(p)
    sys.exit(run(p.parse_args()))
