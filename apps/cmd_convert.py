"""`isthmus convert MODEL --to edge|onnx -o OUT`: any model isthmus reads (ONNX, TFLite, graph
file, `file.py:function`) to the edge format or to ONNX."""
from __future__ import annotations

import argparse
import os

from .errors import UsageError, output_path, positive_int
from .model_source import LoadedModel, load_model, parse_input_shapes

EXAMPLES = """examples:
  isthmus convert cnn.onnx --to edge -o cnn.isth
  isthmus convert model.graph --to onnx -o model.onnx --force
  isthmus convert net.tflite --to edge --nhwc"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog, p.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument("model", help="an .onnx, .tflite or .graph file, or file.py:function returning (Graph, outputs)")
    p.add_argument("--to", choices=["edge", "onnx"], default="edge")
    p.add_argument("-o", "--output", default=None, help="output path (default: MODEL with .isth or .converted.onnx)")
    p.add_argument("--batch", type=positive_int, default=1, help="batch size for unknown leading dims (edge)")
    p.add_argument("--dynamic-batch", action="store_true",
                   help="edge: keep an unknown leading dim unknown (the file then runs at any batch)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,..",
                   help="ONNX: shape of an input the file leaves unknown (repeatable)")
    p.add_argument("--nhwc", action="store_true",
                   help="TFLite: keep 4-D inputs and outputs NHWC (default NCHW, which needs no transposes)")
    p.add_argument("--force", action="store_true", help="overwrite the output file if it exists")


def convert(model: str, to: str = "edge", output=None, batch: int = 1, input_shapes=None, nhwc: bool = False,
            force: bool = False) -> str:
    """Write `model` as an edge file or ONNX; returns the path written. batch=-1: a dynamic batch."""
    base = os.path.splitext(model.split(":")[0])[0]
    out = output or base + (".isth" if to == "edge" else ".converted.onnx")
    output_path(out, force)  # not there yet (or --force), and its folder exists
    if model.lower().endswith(".tflite") and nhwc:
        # deferred: the graph machinery (isthmus.core), loaded only by the commands that need it
        from isthmus.converters.tflite_import import from_tflite
        graph, inputs, outputs = from_tflite(model, nhwc_io=True)
        m = LoadedModel(graph, dict(inputs), {t.name: t for t in outputs}, model, "TFLite")
    else:
        m = load_model(model, input_shapes)
    sess = m.session()
    outs = list(m.outputs.values())
    if to == "edge":
        from isthmus.converters.edge_export import to_edge  # deferred: converters.edge_export loads flatbuffers
        data = to_edge(sess, outs, inputs=[t.name for t in m.inputs.values()], batch=batch,
                       metadata={"source": os.path.basename(model)})
        with open(out + ".tmp", "wb") as f:
            f.write(data)
        os.replace(out + ".tmp", out)
    elif to == "onnx":
        import onnx  # deferred: onnx is a heavy or optional dependency
        # deferred: the graph machinery (isthmus.core), loaded only by the commands that need it
        from isthmus.converters.onnx_export import to_onnx
        onnx.save(to_onnx(sess, outs, inputs=[t.name for t in m.inputs.values()]), out)
    else:
        raise UsageError(f"--to {to}: expected edge or onnx")
    return out


def run(args) -> int:
    out = convert(args.model, args.to, args.output, -1 if args.dynamic_batch else args.batch,
                  parse_input_shapes(args.input_shape), args.nhwc,
                  getattr(args, "force", False))
    print(f"wrote {out} ({os.path.getsize(out):,} bytes)")
    return 0


__all__ = ["convert"]
