"""Graph files: `isthmus import MODEL.onnx|MODEL.tflite -o model.graph` and
`isthmus export model.graph --to onnx|edge`.

A graph file is the GraphDef of cloud/graph_codec.py (strict, bit for bit), so the cloud reads
it as it is. The model's signature rides in two graph collections: the input placeholders and
the output tensors, each beside a collection of the model's own names for them, so an exported
ONNX file takes and returns the names the imported one did. Constants carry their values;
a variable (an ONNX initializer imported with `--trainable`) carries its initial value as the
Const its initializer reads, so weights survive import -> file -> export with no side file;
values learned since are in a checkpoint (core/checkpoint.py), which `export --checkpoint` reads.

This module sits at the package root (as cli.py and demo.py do) because it joins converters/
and cloud/, which DESIGN keeps apart.
"""
from __future__ import annotations

import argparse
import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import isthmus.core as ism
from isthmus.cloud import graph_codec
from isthmus.converters.edge_export import to_edge
from isthmus.converters.onnx_export import to_onnx
from isthmus.converters.onnx_import import OnnxImportError, from_onnx
from isthmus.converters.tflite_import import TFLiteImportError, from_tflite
from isthmus.converters.tflite_read import read_model
from isthmus.converters.tflite_write_graph import graph_to_tflite
from isthmus.core.checkpoint import Saver
from isthmus.core.errors import CheckpointError, GraphError
from isthmus.core.variables import global_variables

INPUTS, INPUT_NAMES = "isthmus.signature.inputs", "isthmus.signature.input_names"
OUTPUTS, OUTPUT_NAMES = "isthmus.signature.outputs", "isthmus.signature.output_names"
_KEYS = (INPUTS, INPUT_NAMES, OUTPUTS, OUTPUT_NAMES)
MAX_FILE_BYTES = 4 << 30  # a graph file larger than this is refused before it is read


class GraphFileError(ValueError):
    """A graph file cannot be written, or a file is not a valid graph file."""


def save_graph(path: str, graph, inputs: Union[Mapping[str, object], Sequence], outputs: Sequence,
               output_names: Optional[Sequence[str]] = None) -> int:
    """Write `graph` with its signature to `path`; returns the bytes written.

    `inputs`: name -> placeholder (as from_onnx returns them) or a list of placeholders (named
    after their nodes); `outputs`: tensors, named `output_names` (default: their node names)."""
    ins = dict(inputs) if isinstance(inputs, Mapping) else {t.node.name: t for t in inputs}
    outs = list(outputs)
    names = list(output_names) if output_names is not None else [t.node.name for t in outs]
    if not outs:
        raise GraphFileError(f"{path}: a graph file needs at least one output")
    if len(names) != len(outs) or len(set(names)) != len(names):
        raise GraphFileError(f"{path}: output names {names} must be unique, one per output ({len(outs)})")
    for k, t in ins.items():
        if t.node.graph is not graph or t.node.op != "Placeholder":
            raise GraphFileError(f"{path}: input '{k}' is not a placeholder of the graph ({t.node.op} '{t.node.name}')")
    for k, t in zip(names, outs):
        if t.node.graph is not graph:
            raise GraphFileError(f"{path}: output '{k}' ({t.name}) is not a tensor of the graph")
    saved = {k: graph.collections.pop(k) for k in _KEYS if k in graph.collections}
    try:  # the signature is written into the graph's collections only for the encoding
        graph.collections[INPUTS], graph.collections[INPUT_NAMES] = list(ins.values()), list(ins)
        graph.collections[OUTPUTS], graph.collections[OUTPUT_NAMES] = outs, names
        data = graph_codec.to_bytes(graph)
    except graph_codec.GraphCodecError as e:
        raise GraphFileError(f"{path}: cannot encode the graph: {e}") from None
    finally:
        for k in _KEYS:
            graph.collections.pop(k, None)
        graph.collections.update(saved)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        raise GraphFileError(f"cannot write graph file {path}: {e.strerror or e}") from None
    return len(data)


def load_graph(path: str, max_tensor_bytes: Optional[int] = None) -> Tuple[object, Dict[str, object], Dict[str, object]]:
    """(graph, inputs, outputs) from a graph file: inputs and outputs map the model's names to
    tensors, in the model's order. A file that is missing, not a GraphDef, fails to verify, or
    lacks a valid signature raises GraphFileError naming the file and the field at fault."""
    try:
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            raise GraphFileError(f"{path}: {size:,} bytes is more than the {MAX_FILE_BYTES:,} a graph file may hold")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise GraphFileError(f"cannot read graph file {path}: {e.strerror or e}") from None
    try:
        graph = graph_codec.decode(data, verify=True, max_bytes=max_tensor_bytes)
    except graph_codec.GraphCodecError as e:
        raise GraphFileError(f"{path}: not a valid graph file: {e}") from None
    cols = graph.collections
    for key in (OUTPUTS, OUTPUT_NAMES):
        if not cols.get(key):
            raise GraphFileError(f"{path}: not an isthmus graph file: collection '{key}' is missing or empty "
                                 "(write graph files with `isthmus import` or graph_io.save_graph)")
    sig = {}
    for tkey, nkey in ((INPUTS, INPUT_NAMES), (OUTPUTS, OUTPUT_NAMES)):
        tensors, names = cols.pop(tkey, []), cols.pop(nkey, [])
        if len(tensors) != len(names):
            raise GraphFileError(f"{path}: collection '{tkey}' has {len(tensors)} items, '{nkey}' {len(names)}")
        if any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
            raise GraphFileError(f"{path}: collection '{nkey}' must hold unique non-empty strings, got {names!r}")
        for n, t in zip(names, tensors):
            if not hasattr(t, "node") or t.node.graph is not graph:
                raise GraphFileError(f"{path}: collection '{tkey}' entry '{n}' is not a tensor of the root graph")
            if tkey == INPUTS and t.node.op != "Placeholder":
                raise GraphFileError(f"{path}: input '{n}' is a {t.node.op} ('{t.node.name}'), not a Placeholder")
        sig[tkey] = dict(zip(names, tensors))
    return graph, sig[INPUTS], sig[OUTPUTS]


def import_model(model: str, trainable: bool = False, nhwc: bool = False):
    """(graph, inputs, outputs, output_names) of an .onnx or .tflite file."""
    if model.endswith(".tflite"):
        if trainable:
            raise GraphFileError(f"{model}: --trainable applies to ONNX models (TFLite weights may be quantized)")
        try:
            with open(model, "rb") as f:
                data = f.read()
            graph, inputs, outputs = from_tflite(data, nhwc_io=nhwc)
            md = read_model(data)
        except OSError as e:
            raise GraphFileError(f"cannot read {model}: {e.strerror or e}") from None
        except TFLiteImportError as e:
            raise GraphFileError(f"cannot import {model}: {e}") from None
        names = [md.tensors[i].name or f"output{k}" for k, i in enumerate(md.outputs)]
        return graph, inputs, outputs, _unique(names)
    if not model.endswith(".onnx"):
        raise GraphFileError(f"{model}: expected an .onnx or .tflite file")
    # deferred: onnx is a heavy or optional dependency
    import onnx  # the onnx package, a heavy import, only when reading ONNX
    try:
        proto = onnx.load(model, load_external_data=False)  # from_onnx reads it, confined to the model's folder
    except OSError as e:
        raise GraphFileError(f"cannot read {model}: {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001  (protobuf's DecodeError and friends)
        raise GraphFileError(f"cannot read {model}: not an ONNX model ({type(e).__name__}: {e})") from None
    inits = {i.name for i in proto.graph.initializer}
    shapeless = [vi.name for vi in proto.graph.input if vi.name not in inits and not vi.type.tensor_type.HasField("shape")]
    if shapeless:  # not a scalar: the file does not say
        raise GraphFileError(f"{model}: input '{shapeless[0]}' has no shape in the file; give it one "
                             "(isthmus convert/split/quantize take --input-shape NAME=D0,D1,...)")
    try:
        graph, inputs, outputs = from_onnx(proto, trainable=trainable,
                                           external_data_dir=os.path.dirname(os.path.abspath(model)))
    except (OnnxImportError, GraphError, ValueError) as e:
        raise GraphFileError(f"cannot import {model}: {e}") from None
    return graph, inputs, outputs, _unique([o.name or f"output{k}" for k, o in enumerate(proto.graph.output)])


def _unique(names: List[str]) -> List[str]:
    seen: Dict[str, int] = {}
    out = []
    for n in names:
        k = seen.get(n, 0)
        seen[n] = k + 1
        out.append(n if k == 0 else f"{n}_{k}")
    return out


def _session(graph, checkpoint: Optional[str]):
    """A Session holding the graph's variables: their imported values, or a checkpoint's."""
    sess = ism.Session(graph)
    if global_variables(graph):
        sess.run(ism.global_variables_initializer(graph))
    if checkpoint:
        Saver(graph=graph).restore(sess, checkpoint)
    return sess


def export_onnx(graph, inputs: Mapping[str, object], outputs: Mapping[str, object], checkpoint: Optional[str] = None):
    """An onnx.ModelProto of a loaded graph file, inputs and outputs named as in the file."""
    sess = _session(graph, checkpoint)
    model = to_onnx(sess, list(outputs.values()), inputs=[t.name for t in inputs.values()])
    _rename(model, [(t.node.name, n) for n, t in inputs.items()], [(v.name, n) for v, n in
                                                                   zip(model.graph.output, outputs)])
    return model


def _rename(model, input_pairs, output_pairs) -> None:
    """Give the model's graph inputs and outputs the file's names (everywhere they are used)."""
    g = model.graph
    taken = {v for n in g.node for v in list(n.input) + list(n.output)} | {i.name for i in g.initializer} \
        | {i.name for i in g.input}
    mapping = {}
    for old, new in list(input_pairs) + list(output_pairs):
        if old == new or old in mapping or new in taken or new in mapping.values():
            continue
        if sum(1 for o in g.output if o.name == old) > 1:
            continue  # one value returned twice keeps its name
        mapping[old] = new
    if not mapping:
        return

    def walk(graph):
        for n in graph.node:
            for i, v in enumerate(n.input):
                if v in mapping:
                    n.input[i] = mapping[v]
            for i, v in enumerate(n.output):
                if v in mapping:
                    n.output[i] = mapping[v]
            for a in n.attribute:
                if a.type == a.GRAPH:
                    walk(a.g)
                for sub in a.graphs:
                    walk(sub)
        for coll in (graph.input, graph.output, graph.value_info, graph.initializer):
            for v in coll:
                if v.name in mapping:
                    v.name = mapping[v.name]
    walk(g)


# ---- the commands ----------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    if p.prog.split()[-1] == "import":
        p.add_argument("model", help="an .onnx or .tflite file")
        p.add_argument("-o", "--output", default=None, help="graph file to write (default: MODEL with .graph)")
        p.add_argument("--trainable", action="store_true",
                       help="ONNX: float initializers become trainable variables (to fine-tune the model)")
        p.add_argument("--nhwc", action="store_true", help="TFLite: keep 4-D inputs and outputs NHWC (default NCHW)")
    else:
        p.add_argument("graph", help="a graph file written by `isthmus import`")
        p.add_argument("--to", choices=["onnx", "edge", "tflite"], default="onnx",
                       help="tflite: a LiteRT .tflite (fp32; needs the tflite extra)")
        p.add_argument("-o", "--output", default=None, help="output path (default: GRAPH with .onnx, .isth or .tflite)")
        p.add_argument("--checkpoint", default=None,
                       help="variable values from this checkpoint (file or directory) instead of the imported ones")
        p.add_argument("--batch", type=int, default=1, help="edge: the size of unknown leading dims")


def run(args) -> int:
    try:
        return _import(args) if args.command == "import" else _export(args)
    except GraphFileError as e:
        raise SystemExit(f"error: {e}") from None


def _refuse_overwrite(out: str, args) -> None:
    if os.path.exists(out) and not getattr(args, "force", False):
        raise GraphFileError(f"{out} exists; pass --force to overwrite it")


def _import(args) -> int:
    graph, inputs, outputs, names = import_model(args.model, trainable=args.trainable, nhwc=args.nhwc)
    out = args.output or os.path.splitext(args.model)[0] + ".graph"
    _refuse_overwrite(out, args)
    size = save_graph(out, graph, inputs, outputs, names)
    print(f"wrote {out} ({size:,} bytes): {len(graph.nodes)} nodes, {len(global_variables(graph))} variables, "
          f"inputs {list(inputs)}, outputs {names}")
    return 0


def _export(args) -> int:
    graph, inputs, outputs = load_graph(args.graph)
    out = args.output or os.path.splitext(args.graph)[0] + {"onnx": ".onnx", "tflite": ".tflite"}.get(args.to, ".isth")
    _refuse_overwrite(out, args)
    try:
        if args.to == "onnx":
            # deferred: onnx is a heavy or optional dependency
            import onnx  # the onnx package, a heavy import, only when writing ONNX
            onnx.save(export_onnx(graph, inputs, outputs, args.checkpoint), out)
        elif args.to == "tflite":
            data = graph_to_tflite(_session(graph, args.checkpoint), [t.name for t in outputs.values()],
                                   inputs=[t.name for t in inputs.values()], batch=args.batch)
            with open(out, "wb") as f:
                f.write(data)
        else:
            data = to_edge(_session(graph, args.checkpoint), [t.name for t in outputs.values()],
                           inputs=[t.name for t in inputs.values()], batch=args.batch,
                           metadata={"source": os.path.basename(args.graph)})
            with open(out, "wb") as f:
                f.write(data)
    except OSError as e:
        raise GraphFileError(f"cannot write {out}: {e.strerror or e}") from None
    except CheckpointError as e:
        raise GraphFileError(f"{args.graph}: checkpoint {args.checkpoint}: {e}") from None
    except GraphError as e:
        raise GraphFileError(f"cannot export {args.graph} to {args.to}: {e}") from None
    print(f"wrote {out} ({os.path.getsize(out):,} bytes)")
    return 0
