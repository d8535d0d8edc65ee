"""The cloud side of a split model: its parts, as one file the offload service loads.

    parts = cloud_parts_from_plans(session, {"cut0": plan_a, "cut1": plan_b})  # or a Partition:
    part = cloud_part_from_partition(partition, "cut0", source=session)
    save_cloud_parts("model.cloud", parts, model="cnn")
    model = load_cloud_parts("model.cloud")          # CloudModel(model, {name: CloudPart})

A CloudPart is a self-contained inference graph (variables frozen to constants) computing the
cloud's outputs from the tensors the edge sends, plus its signature. Signature names are the
ORIGINAL graph's tensor names ("conv3/relu:0"): an input is a tensor the edge part sends
(an edge->cloud transfer of the partition, or a placeholder placed in the cloud), an output a
tensor the edge gets back (a cloud->edge transfer, or an output of the graph computed in the
cloud). `TensorSpec.tensor` names the same value inside the part's own graph. shape[0] is the
batch dimension: -1 when the part accepts any batch (the input's batch dimension is relaxed to
unknown when the part is built, and a probe checks that rows stay independent: one batch of
three rows gives the same rows as three single-row runs). A part that fails that check is kept
with `batchable=False` and the service runs its requests one by one.

The file cannot execute code: it is

    b"ISTHMUS-CLOUD\\n"  | uint32 little-endian manifest length | manifest (UTF-8 JSON) | blobs

where the manifest is {"format": "isthmus-cloud-parts", "version": 1, "model": str, "parts": [
{"name", "batchable", "graph": {"offset", "size", "sha256"}, "inputs": [spec], "outputs": [spec]}]},
a spec is {"name", "tensor", "dtype" (a numpy dtype name), "shape" (ints, -1 unknown)}, and each
graph is the part's GraphDef (cloud/graph_codec.py) at `offset` bytes after the manifest. Loading
checks every field, the blob bounds and hashes, decodes each graph with shape inference on, and
checks that every spec names a tensor of the graph with that dtype and shape (inputs must be
placeholders); any failure is a CloudPartsError naming the file, the part and the field.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..core.errors import IsthmusError
from ..core.executor import prune
from ..core.graph import Graph, Node, Tensor
from ..core.passes import freeze
from ..core.session import Session
from ..partitioner.devices import EDGE_DEVICE
from ..wire import tensor_codec
from . import graph_codec

MAGIC = b"ISTHMUS-CLOUD\n"
FORMAT = "isthmus-cloud-parts"
FORMAT_VERSION = 1
MAX_MANIFEST_BYTES = 16 << 20
MAX_PARTS = 1024
MAX_SPECS = 4096


class CloudPartsError(IsthmusError, ValueError):
    """A cloud part cannot be built, or a cloud-parts file is not valid."""


@dataclass(frozen=True)
class TensorSpec:
    name: str                   # the wire name: the original graph's tensor name
    dtype: np.dtype
    shape: Tuple[int, ...]      # -1: unknown (shape[0] = -1: any batch size)
    tensor: str                 # the same value in the part's graph

    def to_json(self) -> dict:
        return {"name": self.name, "tensor": self.tensor, "dtype": self.dtype.name, "shape": list(self.shape)}


@dataclass
class CloudPart:
    name: str
    graph: Graph
    inputs: List[TensorSpec]
    outputs: List[TensorSpec]
    batchable: bool = True      # requests may be concatenated along dimension 0


@dataclass
class CloudModel:
    model: str
    parts: Dict[str, CloudPart] = field(default_factory=dict)


Source = Union[Graph, object]   # a Graph, or a Session holding the variables' values
Name = Union[str, Tensor]


# ---- building parts ----------------------------------------------------------------------------
def cloud_part(source: Source, inputs: Sequence[Name], outputs: Sequence[Name], name: str,
               check_batching: bool = True) -> CloudPart:
    """The part of `source` computing `outputs` from `inputs` (tensors or their names), with
    variables frozen to their values in `source` (a Session) and the batch dimension relaxed."""
    if not name or not isinstance(name, str):
        raise CloudPartsError(f"a cloud part needs a non-empty name, got {name!r}")
    graph = _frozen(source, outputs)
    ins = _unique([graph.tensor(_tname(t)) for t in inputs])
    outs = _unique([graph.tensor(_tname(t)) for t in outputs])
    if not outs:
        raise CloudPartsError(f"cloud part '{name}' has no outputs")
    relaxed = True
    try:
        g, new_ins, new_outs = _extract(graph, ins, outs, relax=True)
    except CloudPartsError as e:
        raise CloudPartsError(f"cloud part '{name}': {e}") from None
    except (IsthmusError, ValueError):  # an op that fixes the batch size: keep the shapes as they are
        relaxed = False
        try:
            g, new_ins, new_outs = _extract(graph, ins, outs, relax=False)
        except (IsthmusError, ValueError) as e:
            raise CloudPartsError(f"cloud part '{name}': {e}") from None
    batchable = relaxed and all(t.ndim >= 1 for t in new_ins) and all(
        t.ndim >= 1 and t.shape[0] is None for t in new_outs)
    if relaxed and not batchable:  # an op fixes the batch after all: the signature keeps the real sizes
        g, new_ins, new_outs = _extract(graph, ins, outs, relax=False)
    part = CloudPart(name, g, [_spec(o, n) for o, n in zip(ins, new_ins)],
                     [_spec(o, n) for o, n in zip(outs, new_outs)], batchable)
    if part.batchable and check_batching:
        part.batchable = _rows_independent(part)
    return part


def cloud_part_from_partition(partition, name: str, source: Optional[Source] = None,
                              edge: Optional[str] = None, check_batching: bool = True) -> Optional[CloudPart]:
    """The cloud side of a partition (partitioner.partition): every part not on `edge` (default:
    the partitioner's EDGE_DEVICE). None when everything runs on the edge."""
    edge = edge or EDGE_DEVICE
    ins: List[str] = []
    outs: List[str] = []
    for tr in partition.transfers:
        if tr.tensor.startswith("^"):  # a control token: inference parts need no ordering across
            continue
        if tr.src == edge and tr.dst != edge:
            ins.append(tr.tensor)
        elif tr.dst == edge and tr.src != edge:
            outs.append(tr.tensor)
    for d, p in partition.parts.items():
        if d == edge:
            continue
        ins.extend(f"{ph}:0" for ph in p.feeds)
        outs.extend(o for o in p.outputs if ":" in o)
    if not outs:
        return None
    src = source if source is not None else partition.source
    if src is None:
        raise CloudPartsError(f"cloud part '{name}': the partition carries no source graph; pass source=")
    return cloud_part(src, ins, outs, name, check_batching)


def cloud_parts_from_plans(source: Source, plans, check_batching: bool = True) -> List[CloudPart]:
    """Cloud parts for several candidate cuts: `plans` maps a part name to a SplitPlan (or
    Partition); a plain sequence names them "cut0", "cut1", ... by position. Plans that keep
    everything on the edge have no cloud part and are left out."""
    items = plans.items() if isinstance(plans, Mapping) else ((f"cut{i}", p) for i, p in enumerate(plans))
    out = []
    for name, plan in items:
        edge = None
        if hasattr(plan, "problem"):  # a SplitPlan
            edge = plan.problem.cost.edge
            plan = plan.partition()
        part = cloud_part_from_partition(plan, name, source, edge, check_batching)
        if part is not None:
            out.append(part)
    return out


def _tname(t: Name) -> str:
    if isinstance(t, Tensor):
        return t.name
    return t if ":" in t else f"{t}:0"


def _unique(ts: List[Tensor]) -> List[Tensor]:
    seen, out = set(), []
    for t in ts:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def _frozen(source: Source, outputs: Sequence[Name]) -> Graph:
    if isinstance(source, Graph):  # a variable the part needs is refused by _extract, naming it
        return source
    if hasattr(source, "graph") and hasattr(source, "variable_value"):
        return freeze(source, [source.graph.tensor(_tname(t)) for t in outputs])
    raise CloudPartsError(f"source must be a Graph or a Session, got {type(source).__name__}")


def _extract(graph: Graph, ins: List[Tensor], outs: List[Tensor], relax: bool):
    g = Graph(seed=graph.seed)
    m: Dict[Tensor, Tensor] = {}
    nm: Dict[Node, Node] = {}
    fed = set(ins)
    for t in ins:
        shape = ((None,) + tuple(t.shape[1:])) if relax and t.ndim >= 1 else t.shape
        base = t.node.name if t.index == 0 else f"{t.node.name}_{t.index}"
        ph = g.add_node("Placeholder", (), {"dtype": t.dtype, "shape": shape}, name=_free(g, base), exact_name=True)
        m[t] = ph.outputs[0]
    for n in prune([t.node for t in outs], fed):
        if n.outputs and all(t in fed for t in n.outputs):
            continue
        if n.op == "Placeholder":
            raise CloudPartsError(f"the part needs placeholder '{n.name}', which is not among its inputs")
        if n.op == "Variable":
            raise CloudPartsError(f"the part reads variable '{n.name}': pass the Session holding its value "
                                  "(source=session) so that it is frozen into the part")
        if n.op in ("Send", "Recv") or n.opdef.ref_inputs:
            raise CloudPartsError(f"node '{n.name}' ({n.op}) cannot be in an inference part "
                                  "(pass the unsplit graph, not a part of a partition)")
        missing = [t.name for t in n.inputs if t not in m]
        if missing:
            raise CloudPartsError(f"node '{n.name}' ({n.op}) reads {missing}, computed outside the part")
        new = g.add_node(n.op, [m[t] for t in n.inputs], dict(n.attrs), name=_free(g, n.name), exact_name=True,
                         control_inputs=[nm[c] for c in n.control_inputs if c in nm])
        nm[n] = new
        for t, u in zip(n.outputs, new.outputs):
            m.setdefault(t, u)
    g.verify()
    return g, [m[t] for t in ins], [m[t] for t in outs]


def _free(g: Graph, base: str) -> str:
    name, k = base, 0
    while name in g:
        k += 1
        name = f"{base}_{k}"
    return name


def _spec(orig: Tensor, t: Tensor) -> TensorSpec:
    return TensorSpec(orig.name, np.dtype(t.dtype), tuple(-1 if d is None else int(d) for d in t.shape), t.name)


def _sample(spec: TensorSpec, rows: int, rng) -> np.ndarray:
    shape = (rows,) + tuple(1 if d < 0 else d for d in spec.shape[1:])
    if spec.dtype.kind == "f":
        return rng.standard_normal(shape).astype(spec.dtype)
    return np.zeros(shape, spec.dtype)


def _rows_independent(part: CloudPart, rows: int = 3) -> bool:
    """Whether one batch of `rows` rows gives the rows of `rows` single-row runs (no op mixes rows)."""
    rng = np.random.default_rng(0)
    feeds = {s.tensor: _sample(s, rows, rng) for s in part.inputs}
    fetches = [o.tensor for o in part.outputs]
    try:
        with Session(part.graph) as sess:
            whole = sess.run(fetches, feeds)
            singles = [sess.run(fetches, {k: v[i:i + 1] for k, v in feeds.items()}) for i in range(rows)]
    except Exception:  # noqa: BLE001  (cannot probe on synthetic inputs: trust the shapes)
        return True
    for k, w in enumerate(whole):
        w = np.asarray(w)
        if w.ndim == 0 or w.shape[0] != rows:
            return False
        got = np.concatenate([np.asarray(s[k]) for s in singles])
        if got.shape != w.shape or not np.allclose(got.astype(np.float64), w.astype(np.float64),
                                                   rtol=1e-4, atol=1e-5, equal_nan=True):
            return False
    return True


# ---- the file ----------------------------------------------------------------------------------
def save_cloud_parts(path: Union[str, os.PathLike], parts: Sequence[CloudPart], model: str = "model") -> None:
    """Write `parts` (names unique) to one file, atomically (a temporary file renamed into place)."""
    names = [p.name for p in parts]
    if not parts or len(set(names)) != len(names):
        raise CloudPartsError(f"cloud parts need at least one part and unique names; got {names}")
    blobs, entries, offset = [], [], 0
    for p in parts:
        data = graph_codec.to_bytes(p.graph)
        entries.append({"name": p.name, "batchable": bool(p.batchable),
                        "graph": {"offset": offset, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
                        "inputs": [s.to_json() for s in p.inputs], "outputs": [s.to_json() for s in p.outputs]})
        blobs.append(data)
        offset += len(data)
    manifest = json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "model": str(model), "parts": entries},
                          separators=(",", ":")).encode("utf-8")
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(MAGIC + struct.pack("<I", len(manifest)) + manifest)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_cloud_parts(path: Union[str, os.PathLike]) -> CloudModel:
    """Read and verify a cloud-parts file (see the module docstring)."""
    where = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CloudPartsError(f"{where}: cannot read: {e}") from None
    head = len(MAGIC) + 4
    if len(data) < head or not data.startswith(MAGIC):
        raise CloudPartsError(f"{where}: not an isthmus cloud-parts file (no {MAGIC!r} header)")
    (mlen,) = struct.unpack_from("<I", data, len(MAGIC))
    if mlen > MAX_MANIFEST_BYTES or head + mlen > len(data):
        raise CloudPartsError(f"{where}: manifest length {mlen} runs past the file ({len(data)} bytes) "
                              f"or the limit ({MAX_MANIFEST_BYTES})")
    try:
        man = json.loads(data[head:head + mlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # RecursionError: hostile nesting
        raise CloudPartsError(f"{where}: manifest is not UTF-8 JSON: {e}") from None
    blobs = memoryview(data)[head + mlen:]
    _field(man, dict, where, "manifest")
    if man.get("format") != FORMAT:
        raise CloudPartsError(f"{where}: field 'format' is {man.get('format')!r}, not {FORMAT!r}")
    if man.get("version") != FORMAT_VERSION:
        raise CloudPartsError(f"{where}: field 'version' is {man.get('version')!r}; "
                              f"this isthmus reads {FORMAT_VERSION}")
    model = CloudModel(_field(man.get("model"), str, where, "model"))
    entries = _field(man.get("parts"), list, where, "parts")
    if not entries or len(entries) > MAX_PARTS:
        raise CloudPartsError(f"{where}: field 'parts' holds {len(entries)} parts (1 to {MAX_PARTS} allowed)")
    for i, e in enumerate(entries):
        part = _load_part(e, blobs, f"{where}: parts[{i}]")
        if part.name in model.parts:
            raise CloudPartsError(f"{where}: parts[{i}].name {part.name!r} appears twice")
        model.parts[part.name] = part
    return model


def _field(v, kind, where: str, name: str):
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise CloudPartsError(f"{where}: field '{name}' must be {kind.__name__}, got {type(v).__name__}")
    return v


def _load_part(e, blobs: memoryview, where: str) -> CloudPart:
    _field(e, dict, where, "part")
    name = _field(e.get("name"), str, where, "name")
    if not name:
        raise CloudPartsError(f"{where}: field 'name' is empty")
    where = f"{where} ('{name}')"
    gi = _field(e.get("graph"), dict, where, "graph")
    off, size = _field(gi.get("offset"), int, where, "graph.offset"), _field(gi.get("size"), int, where, "graph.size")
    if off < 0 or size <= 0 or off + size > len(blobs):
        raise CloudPartsError(f"{where}: field 'graph' spans bytes {off}..{off + size} "
                              f"of a {len(blobs)}-byte blob area")
    blob = bytes(blobs[off:off + size])
    if hashlib.sha256(blob).hexdigest() != gi.get("sha256"):
        raise CloudPartsError(f"{where}: field 'graph.sha256' does not match the graph's bytes (file corrupt)")
    try:
        graph = graph_codec.from_bytes(blob, verify=True)
    except (IsthmusError, ValueError) as err:
        raise CloudPartsError(f"{where}: field 'graph' is not a valid graph: {err}") from None
    batchable = _field(e.get("batchable", True), bool, where, "batchable")
    specs = {}
    for kind in ("inputs", "outputs"):
        lst = _field(e.get(kind), list, where, kind)
        if len(lst) > MAX_SPECS or (kind == "outputs" and not lst):
            raise CloudPartsError(f"{where}: field '{kind}' holds {len(lst)} tensors")
        specs[kind] = [_load_spec(s, graph, f"{where}: {kind}[{k}]", kind == "inputs") for k, s in enumerate(lst)]
        names = [s.name for s in specs[kind]]
        if len(set(names)) != len(names):
            raise CloudPartsError(f"{where}: field '{kind}' names a tensor twice: {names}")
    if batchable and any(not s.shape or s.shape[0] != -1 for s in specs["inputs"] + specs["outputs"]):
        raise CloudPartsError(f"{where}: field 'batchable' is true but not every tensor has batch dimension -1")
    return CloudPart(name, graph, specs["inputs"], specs["outputs"], batchable)


def _load_spec(s, graph: Graph, where: str, is_input: bool) -> TensorSpec:
    _field(s, dict, where, "spec")
    name = _field(s.get("name"), str, where, "name")
    tname = _field(s.get("tensor"), str, where, "tensor")
    try:
        dtype = np.dtype(_field(s.get("dtype"), str, where, "dtype"))
        tensor_codec.dtype_to_enum(dtype)
    except (TypeError, tensor_codec.TensorCodecError) as err:
        raise CloudPartsError(f"{where} ('{name}'): field 'dtype' {s.get('dtype')!r}: {err}") from None
    shape = _field(s.get("shape"), list, where, "shape")
    if len(shape) > tensor_codec.MAX_RANK or any(isinstance(d, bool) or not isinstance(d, int) or d < -1
                                                 for d in shape):
        raise CloudPartsError(f"{where} ('{name}'): field 'shape' {shape} is not a list of ints >= -1 "
                              f"(rank <= {tensor_codec.MAX_RANK})")
    try:
        t = graph.tensor(tname)
    except (IsthmusError, ValueError) as err:
        raise CloudPartsError(f"{where} ('{name}'): field 'tensor' {tname!r}: {err}") from None
    if is_input and t.node.op != "Placeholder":
        raise CloudPartsError(f"{where} ('{name}'): field 'tensor' {tname!r} is a {t.node.op}, not a Placeholder")
    if np.dtype(t.dtype) != dtype:
        raise CloudPartsError(f"{where} ('{name}'): field 'dtype' is {dtype.name}; "
                              f"the graph's tensor is {np.dtype(t.dtype).name}")
    want = tuple(-1 if d is None else d for d in t.shape)
    if tuple(shape) != want:
        raise CloudPartsError(f"{where} ('{name}'): field 'shape' is {shape}; the graph's tensor is {list(want)}")
    return TensorSpec(name, dtype, tuple(shape), tname)


__all__ = ["CloudPart", "CloudModel", "TensorSpec", "CloudPartsError", "cloud_part", "cloud_part_from_partition",
           "cloud_parts_from_plans", "save_cloud_parts", "load_cloud_parts"]
