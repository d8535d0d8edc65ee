"""Load any model isthmus reads (ONNX, TFLite, graph file, `file.py:fn`) as a graph with named
inputs and outputs, and read the commands' `--input name=x.npy` / `--input-shape name=1,3,8,8` flags."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .errors import UsageError, input_file

MODEL_KINDS = ".onnx, .tflite, .graph (isthmus import), file.py:function or module:function"


@dataclass
class LoadedModel:
    """A graph and its signature: inputs (placeholders) and outputs, each by the model's own names."""
    graph: object
    inputs: Dict[str, object]
    outputs: Dict[str, object]
    source: str
    kind: str
    producer: str = ""
    extra: dict = field(default_factory=dict)

    def session(self):
        """A Session holding the graph's variables at their stored values."""
        # deferred: the graph machinery (isthmus.core), loaded only by the commands that need it
        import isthmus.core as ism
        # deferred: the graph machinery (isthmus.core), loaded only by the commands that need it
        from isthmus.core.variables import global_variables
        sess = ism.Session(self.graph)
        if global_variables(self.graph):
            sess.run(ism.global_variables_initializer(self.graph))
        return sess

    @property
    def name(self) -> str:
        return os.path.splitext(os.path.basename(self.source.split(":")[0]))[0] or "model"


def parse_input_shapes(items: Sequence[str]) -> Dict[str, Tuple[int, ...]]:
    """`name=1,3,224,224` (repeatable) -> {name: shape}; every dim a positive integer."""
    out: Dict[str, Tuple[int, ...]] = {}
    for it in items or []:
        name, sep, dims = it.partition("=")
        if not sep or not name or not dims:
            raise UsageError(f"--input-shape {it!r}: expected NAME=D0,D1,... e.g. image=1,3,224,224")
        try:
            shape = tuple(int(d) for d in dims.replace("x", ",").split(","))
        except ValueError:
            raise UsageError(f"--input-shape {it!r}: dims must be integers, e.g. {name}=1,3,224,224") from None
        if any(d < 1 for d in shape):
            raise UsageError(f"--input-shape {it!r}: every dim must be at least 1")
        out[name] = shape
    return out


def load_model(spec: str, input_shapes: Optional[Mapping[str, Sequence[int]]] = None) -> LoadedModel:
    """The model at `spec`: .onnx, .tflite, .graph or a graph-building function."""
    shapes = dict(input_shapes or {})
    low = spec.lower()
    if low.endswith(".onnx"):
        return _onnx(input_file(spec), shapes)
    if low.endswith(".tflite"):
        return _tflite(input_file(spec))
    if low.endswith(".graph"):
        from .graph_io import GraphFileError, load_graph  # deferred: apps.graph_io loads flatbuffers, protobuf
        input_file(spec)
        try:
            g, ins, outs = load_graph(spec)
        except GraphFileError as e:
            raise UsageError(str(e)) from None
        return LoadedModel(g, dict(ins), dict(outs), spec, "graph file", "isthmus import")
    if low.endswith(".isth"):
        raise UsageError(f"MODEL {spec}: an edge model file is already converted; this command takes "
                         f"the source model ({MODEL_KINDS})")
    where, sep, fn = spec.rpartition(":")
    if not sep or not fn or not where:
        if os.path.exists(spec):
            raise UsageError(f"MODEL {spec}: unknown model format; expected {MODEL_KINDS}")
        raise UsageError(f"MODEL {spec}: no such file; expected {MODEL_KINDS}")
    if where.endswith(".py"):
        input_file(where)
    from .partition import load_model as load_function  # deferred: apps.partition loads scipy
    graph, outputs = load_function(spec)
    if not outputs:
        raise UsageError(f"MODEL {spec}: the function returned a Graph without outputs; return (graph, [outputs])")
    ins = {n.name: n.outputs[0] for n in graph.nodes if n.op == "Placeholder"}
    outs = {t.name: t for t in outputs}
    return LoadedModel(graph, ins, outs, spec, "python function", spec)


def _onnx(path: str, shapes: Dict[str, Tuple[int, ...]]) -> LoadedModel:
    import onnx  # deferred: onnx is a heavy or optional dependency
    # deferred: the graph machinery (isthmus.core), loaded only by the commands that need it
    from isthmus.converters.onnx_import import OnnxImportError, from_onnx
    # deferred: the graph machinery (isthmus.core), loaded only by the commands that need it
    from isthmus.core.errors import GraphError
    try:
        proto = onnx.load(path)
    except Exception as e:  # noqa: BLE001  (protobuf's DecodeError and friends)
        raise UsageError(f"MODEL {path}: not an ONNX model ({type(e).__name__}: {' '.join(str(e).split())})") from None
    if not proto.graph.node:
        raise UsageError(f"MODEL {path}: the ONNX graph has no nodes (not a model, or truncated)")
    inits = {i.name for i in proto.graph.initializer}
    real = [vi for vi in proto.graph.input if vi.name not in inits]
    unknown = sorted(set(shapes) - {vi.name for vi in real})
    if unknown:
        raise UsageError(f"--input-shape {unknown[0]}: the model has no input of that name "
                         f"(its inputs: {', '.join(vi.name for vi in real)})")
    for vi in real:
        tt = vi.type.tensor_type
        if vi.name in shapes:
            want = shapes[vi.name]
            if tt.HasField("shape") and len(tt.shape.dim) != len(want):
                raise UsageError(f"--input-shape {vi.name}: {len(want)} dims given, the model's input has "
                                 f"{len(tt.shape.dim)}")
            del tt.shape.dim[:]
            for d in want:
                tt.shape.dim.add().dim_value = d
        elif not tt.HasField("shape"):
            raise UsageError(f"MODEL {path}: input '{vi.name}' has no shape in the file; give it with "
                             f"--input-shape {vi.name}=D0,D1,...")
    try:
        graph, inputs, outputs = from_onnx(proto)
    except (OnnxImportError, GraphError, ValueError, TypeError, KeyError) as e:
        raise UsageError(f"MODEL {path}: cannot import: {' '.join(str(e).split())}") from None
    names = [o.name or f"output{k}" for k, o in enumerate(proto.graph.output)]
    producer = f"{proto.producer_name} {proto.producer_version}".strip()
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0)
    return LoadedModel(graph, dict(inputs), dict(zip(names, outputs)), path, "ONNX", producer, {"opset": opset})


def _tflite(path: str) -> LoadedModel:
    from .graph_io import GraphFileError, import_model  # deferred: apps.graph_io loads flatbuffers, protobuf
    try:
        graph, inputs, outputs, names = import_model(path)
    except GraphFileError as e:
        raise UsageError(f"MODEL {e}") from None
    return LoadedModel(graph, dict(inputs), dict(zip(names, outputs)), path, "TFLite", "TensorFlow Lite")


# ---- input arrays -------------------------------------------------------------------------------------
def _load_array(path: str, flag: str) -> object:
    input_file(path, flag)
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as e:
        raise UsageError(f"{flag} {path}: not a .npy/.npz array file ({' '.join(str(e).split())})") from None
    except Exception as e:  # noqa: BLE001  (a truncated or corrupt .npy)
        raise UsageError(f"{flag} {path}: cannot read it as .npy/.npz ({type(e).__name__}: {e})") from None


def read_inputs(items: Sequence[str], names: Sequence[str], flag: str = "--input") -> Dict[str, np.ndarray]:
    """`--input` values: `name=x.npy` (several), `x.npy` per input in order, or one .npz holding
    the arrays by input name (or in order). Returns {input name: array}."""
    names = list(names)
    out: Dict[str, np.ndarray] = {}
    positional: List[str] = []
    for it in items or []:
        name, sep, path = it.partition("=")
        if sep and name in names:
            arr = _load_array(path, f"{flag} {name}=")
            if isinstance(arr, np.lib.npyio.NpzFile):
                raise UsageError(f"{flag} {it}: name=FILE takes a .npy file, not an .npz")
            out[name] = arr
        elif sep and not os.path.exists(it):
            raise UsageError(f"{flag} {it}: the model has no input '{name}' (its inputs: {', '.join(names)})")
        else:
            positional.append(it)
    if len(positional) == 1 and positional[0].lower().endswith(".npz"):
        with _load_array(positional[0], flag) as z:
            keys = list(z.keys())
            if all(n in keys for n in names if n not in out):
                out.update({n: z[n] for n in names if n not in out})
            elif len(keys) == len(names) and not out:
                out.update({n: z[k] for n, k in zip(names, keys)})
            else:
                raise UsageError(f"{flag} {positional[0]}: holds {keys}; the model takes {', '.join(names)}")
        return out
    rest = [n for n in names if n not in out]
    if positional and len(positional) != len(rest):
        raise UsageError(f"{flag}: the model takes {len(names)} inputs ({', '.join(names)}); "
                         f"got {len(positional)} unnamed file(s) for {len(rest)} of them")
    for n, p in zip(rest, positional):
        arr = _load_array(p, flag)
        if isinstance(arr, np.lib.npyio.NpzFile):
            raise UsageError(f"{flag} {p}: an .npz with other inputs; give one .npz or name=x.npy per input")
        out[n] = arr
    return out


def random_inputs(specs: Mapping[str, Tuple[Sequence[int], object]], seed: int = 0) -> Dict[str, np.ndarray]:
    """Uniform [0, 1) floats (or small integers) of each input's (shape, dtype)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in specs.items():
        dt = np.dtype(dtype)
        out[name] = rng.random(shape).astype(dt) if dt.kind == "f" else rng.integers(0, 2, shape).astype(dt)
    return out


def check_input(name: str, arr: np.ndarray, shape: Sequence[Optional[int]], dtype, flag: str = "--input") -> np.ndarray:
    """`arr` fits an input of `shape` (None or -1 for any) and `dtype` (cast when the kind agrees)."""
    shape = [None if d in (None, -1) else d for d in shape]
    if arr.ndim != len(shape) or any(d is not None and d != a for d, a in zip(shape, arr.shape)):
        want = "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
        raise UsageError(f"{flag} {name}: shape {list(arr.shape)} does not fit the model's {want}")
    dt = np.dtype(dtype)
    if arr.dtype != dt:
        if arr.dtype.kind in "fiub" and (dt.kind == arr.dtype.kind or dt.kind == "f"):
            arr = arr.astype(dt)
        else:
            raise UsageError(f"{flag} {name}: dtype {arr.dtype}, the model takes {dt}")
    return arr


__all__ = ["LoadedModel", "load_model", "parse_input_shapes", "read_inputs", "random_inputs", "check_input",
           "MODEL_KINDS"]
