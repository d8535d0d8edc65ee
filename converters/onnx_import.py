"""Import ONNX models into isthmus graphs (`from_onnx`): the handler table, the node loop, errors.

Handlers are chosen by opset: the highest version not above the model's. Initializers become
constants, or trainable variables with `trainable=True` (to fine-tune an imported model).
Unsupported ops are listed all at once, with counts and node names. Every failure reaches the
caller as `OnnxImportError` naming the op, the node and the opset; an attribute a handler does not
declare is refused by name rather than ignored. The handlers live in onnx_elementwise, onnx_nn,
onnx_shapes, onnx_control, onnx_resize and onnx_rnn; constants are folded by onnx_fold.
"""
from __future__ import annotations

import re
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple, Union

import numpy as np

import isthmus.core as ism
from isthmus.core.dtypes import as_dtype
from isthmus.core.errors import GraphError
from isthmus.core.graph import Graph, Tensor, get_default_graph
from isthmus.core.ops.base import make


class ImportError_(GraphError):
    """The model cannot be imported (unsupported ops or attributes, malformed graph)."""


OnnxImportError = ImportError_

Handler = Callable[["_Ctx", object, List[Optional[Tensor]]], Sequence[Tensor]]
_HANDLERS: Dict[str, List[Tuple[int, Handler]]] = {}  # op -> [(since, handler)], sorted by since
# (op, since) -> the attribute names that version's handler honours (absent: it checks them itself)
_ATTRS: Dict[Tuple[str, int], FrozenSet[str]] = {}


def handler(op: str, since: int = 1, attrs: Optional[Sequence[str]] = None):
    """Register `f` for ONNX `op` from opset `since` (a later registration at the same `since` wins,
    keeping the declared attributes unless it declares its own). `attrs` names every attribute `f`
    honours; a node carrying another one is refused by name (None: the handler checks them itself)."""
    def deco(f: Handler) -> Handler:
        _HANDLERS.setdefault(op, []).append((since, f))
        _HANDLERS[op].sort(key=lambda p: p[0])
        if attrs is not None:
            _ATTRS[(op, since)] = frozenset(attrs)
        return f
    return deco


def _entry(op: str, opset: int):
    """(since, handler, declared attributes or None) chosen for `op` at `opset`, or None."""
    best = None
    for since, f in _HANDLERS.get(op, ()):
        if since <= opset:
            best = (since, f, _ATTRS.get((op, since)))
    return best


def wrap_each_version(op: str, wrap: Callable[[Handler], Handler]) -> None:
    """Put `wrap(before)` in front of each version of `op`'s handler: registered at the same `since`
    (so it is the one picked, with the same declared attributes), `before` being the handler it
    shadows, which the wrapper may fall through to (how a module adds ranks or forms to an op)."""
    winners = {since: f for since, f in _HANDLERS.get(op, ())}  # the last registered at each since
    if not winners:
        raise KeyError(f"no ONNX handler for {op!r} to wrap; known: {supported_ops()}")
    for since, before in sorted(winners.items()):
        handler(op, since)(wrap(before))


def _pick(op: str, opset: int) -> Optional[Handler]:
    e = _entry(op, opset)
    return None if e is None else e[1]


def declared_attrs(op: str, opset: int) -> Optional[FrozenSet[str]]:
    """The attributes the handler chosen for (op, opset) honours (None: it checks them itself)."""
    e = _entry(op, opset)
    return None if e is None else e[2]


def supported_ops() -> List[str]:
    return sorted(_HANDLERS)


class _Ctx:
    def __init__(self, graph: Graph, consts: Dict[str, np.ndarray]):
        self.g = graph
        self.consts = consts  # names known at import time (initializers, Constant nodes, folded)
        self.opset = 1
        self.versions: Dict[str, int] = {}  # other domains' opset versions (ai.onnx.ml, ai.onnx.preview.training)

    def key(self, node) -> Tuple[str, int]:
        """The handler-table name of `node`'s op (domain-qualified outside the default domain) and the
        opset version its domain is imported at."""
        return _key(node, self.opset, self.versions)

    def const_value(self, name: str, what: str, node) -> np.ndarray:
        if name not in self.consts:
            raise ImportError_(f"{what} must be a constant (initializer or Constant), '{name}' is computed at run time")
        return self.consts[name]

    def const_or_none(self, node, k: int) -> Optional[np.ndarray]:
        """Input k's value when it is known at import, None when absent or computed at run time."""
        if len(node.input) <= k or not node.input[k]:
            return None
        return self.consts.get(node.input[k])

    def has_input(self, node, k: int) -> bool:
        return len(node.input) > k and bool(node.input[k])


def owned_constant(arr: np.ndarray, name: str) -> Tensor:
    """A Const over `arr` without the private copy `ism.constant` makes: importers own the arrays
    they read (or hold read-only views of the model file) and never write them. A 90 MB model is
    then imported without copying its weights a second time."""
    if not isinstance(arr, np.ndarray) or arr.ndim == 0 or not arr.flags.c_contiguous \
            or as_dtype(arr.dtype) != arr.dtype:
        return ism.constant(arr, dtype=np.asarray(arr).dtype, name=name)
    arr.flags.writeable = False
    return make("Const", (), {"value": arr}, name=name, graph=get_default_graph()).outputs[0]


def _attrs(node) -> Dict[str, object]:
    from onnx import helper  # deferred: onnx is a heavy or optional dependency
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def refuse_unless(cond: bool, message: str) -> None:
    if not cond:
        raise ImportError_(message)


# ---- the importer --------------------------------------------------------------------------------------
def from_onnx(model: Union[str, bytes, "object"], trainable: bool = False, graph: Optional[Graph] = None,
              external_data_dir: Optional[str] = None):
    """Import an ONNX model. Returns (graph, inputs, outputs): inputs maps ONNX input names to
    placeholders, outputs is the list of output tensors in the model's order.

    Weights stored outside the model file (external data) are read only from `external_data_dir`,
    or from the model file's own folder when `model` is a path; never through `..`, an absolute
    path or a symlink leading out of that folder."""
    from .onnx_external import load_model  # cycle: converters.onnx_import <-> converters.onnx_external
    model, base, raws = load_model(model, external_data_dir)
    try:
        return _import(model, trainable, graph, base, raws)
    except ImportError_:
        raise
    except Exception as e:  # noqa: BLE001  (protobuf, onnx and numpy errors on a malformed model)
        raise ImportError_(f"cannot import the model: {type(e).__name__}: {e}") from e
    finally:
        if raws is not None:
            raws.close()


def _import(model, trainable: bool, graph: Optional[Graph], base: Optional[str], raws):
    from onnx import helper  # deferred: onnx is a heavy or optional dependency
    from .onnx_external import read_initializer  # cycle: converters.onnx_import <-> converters.onnx_external
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)
    versions = {o.domain: o.version for o in model.opset_import if o.domain not in ("", "ai.onnx")}
    g_onnx = model.graph
    _check_ops(g_onnx, opset, versions)
    g = graph or Graph(seed=0)
    values: Dict[str, Tensor] = {}
    consts: Dict[str, np.ndarray] = {}
    with g.as_default():
        inits = {i.name for i in g_onnx.initializer}
        for k, init in enumerate(g_onnx.initializer):
            arr = read_initializer(init, base, raws, k)
            consts[init.name] = arr
            if trainable and arr.dtype.kind == "f" and arr.ndim >= 1:
                values[init.name] = ism.Variable(arr, name=_clean(init.name))
            else:
                values[init.name] = owned_constant(arr, _clean(init.name))
        inputs = {}
        for vi in g_onnx.input:
            if vi.name in inits:
                continue
            if not vi.type.HasField("tensor_type"):
                raise ImportError_(f"graph input '{_text(vi.name)}': only tensor inputs are supported "
                                   f"(it is a {vi.type.WhichOneof('value') or 'value of no type'})")
            tt = vi.type.tensor_type
            try:
                dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
            except Exception:
                raise ImportError_(f"graph input '{_text(vi.name)}': unsupported element type {tt.elem_type}") from None
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            try:
                t = ism.placeholder(dtype, dims if tt.HasField("shape") else None, name=_clean(vi.name))
            except (TypeError, ValueError) as e:
                raise ImportError_(f"graph input '{_text(vi.name)}': {e}") from None
            values[vi.name] = inputs[vi.name] = t
        c = _Ctx(g, consts)
        c.opset, c.versions = opset, versions
        _run_nodes(c, g_onnx.node, values)
        unknown_out = [o.name for o in g_onnx.output if o.name not in values]
        if unknown_out:
            raise ImportError_(f"graph outputs {unknown_out} are produced by no node")
        outputs = [values[o.name] for o in g_onnx.output]
    return g, inputs, outputs


def _key(node, opset: int, versions: Dict[str, int]) -> Tuple[str, int]:
    if node.domain in ("", "ai.onnx"):
        return node.op_type, opset
    return f"{_text(node.domain)}.{node.op_type}", versions.get(node.domain, 0)


def _check_ops(g_onnx, opset: int, versions: Dict[str, int]) -> None:
    """Refuse, all at once, every op (in subgraphs too) no handler covers at this opset."""
    missing: Dict[str, List[str]] = {}

    def scan(nodes) -> None:
        for n in nodes:
            if _pick(*_key(n, opset, versions)) is None:
                missing.setdefault(_text(f"{_text(n.domain) + '.' if n.domain else ''}{_text(n.op_type)}"), []).append(
                    _text(n.name or (n.output[0] if n.output else "?")))
            for a in n.attribute:
                if a.type == a.GRAPH:
                    scan(a.g.node)
    scan(g_onnx.node)
    if missing:
        raise ImportError_(f"cannot import (opset {opset}): " + "; ".join(
            f"{op} x{len(v)} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})" for op, v in sorted(missing.items()))
            + f". Supported: {', '.join(supported_ops())}")


_PREFIX = re.compile(r"^node '[^']*' \([A-Za-z]+\): ")


def _run_nodes(c: "_Ctx", nodes, values) -> None:
    """Import `nodes` into the default graph (a cond or loop body when called for a subgraph),
    reading and writing `values` (name -> Tensor; a body sees its enclosing graph's names too)."""

    from .onnx_fold import try_fold  # cycle: converters.onnx_import <-> converters.onnx_fold
    g = get_default_graph()
    for k, n in enumerate(nodes):
        where = f"node {k} '{_text(n.name or n.op_type)}' ({_text(n.op_type)}, opset {c.opset})"
        missing_in = [i for i in n.input if i and i not in values]
        if missing_in:
            raise ImportError_(f"{where}: input(s) {missing_in} are defined by no earlier node, initializer "
                               "or graph input (the model is malformed or not topologically sorted)")
        taken = [o for o in n.output if o and o in values]
        if taken:
            raise ImportError_(f"{where}: output(s) {taken} are already defined by an initializer, a graph input "
                               "or an earlier node (ONNX names are assigned once)")
        ins = [values[i] if i else None for i in n.input]
        with g.name_scope(_clean(n.name or n.op_type)):
            try:
                op, version = c.key(n)
                _check_attrs(n, op, version)
                outs = try_fold(c, n, ins)
                if outs is None:
                    f = _pick(op, version)
                    outs = list(f(c, n, ins, values) if n.op_type in _SUBGRAPH_OPS else f(c, n, ins))
            except ImportError_ as e:
                raise ImportError_(f"{where}: {_PREFIX.sub('', str(e))}") from None
            except Exception as e:  # noqa: BLE001  (malformed attributes or inputs: say where, keep one error type)
                raise ImportError_(f"{where}: {type(e).__name__}: {_PREFIX.sub('', str(e))}") from e
        if len(outs) < len([o for o in n.output if o]):
            raise ImportError_(f"{where}: declares {len(n.output)} outputs, the op makes {len(outs)}")
        for name, t in zip(n.output, outs):
            if name:
                values[name] = t


def _check_attrs(node, op: str, opset: int) -> None:
    """Refuse an attribute the chosen handler does not honour; for a handler that declares none, at least
    one the ONNX spec does not define for this op at this opset."""
    allowed = declared_attrs(op, opset)
    if allowed is None:
        allowed = _spec_attrs(node.op_type, opset) if op == node.op_type else None
        if allowed is None:
            return
        extra = sorted(_text(a.name) for a in node.attribute if a.name not in allowed)
        if extra:
            raise ImportError_(f"attribute(s) {extra} are not defined for {node.op_type} at opset {opset}")
        return
    extra = sorted(_text(a.name) for a in node.attribute if a.name not in allowed)
    if extra:
        raise ImportError_(f"attribute(s) {extra} are not supported (it reads {sorted(allowed) or 'none'})")


_SPEC_ATTRS: Dict[Tuple[str, int], Optional[FrozenSet[str]]] = {}


def _spec_attrs(op: str, opset: int) -> Optional[FrozenSet[str]]:
    key = (op, opset)
    if key not in _SPEC_ATTRS:
        import onnx.defs  # deferred: onnx is a heavy or optional dependency
        try:
            _SPEC_ATTRS[key] = frozenset(onnx.defs.get_schema(op, opset).attributes)
        except Exception:  # noqa: BLE001  (no schema: nothing to check against)
            _SPEC_ATTRS[key] = None
    return _SPEC_ATTRS[key]


_SUBGRAPH_OPS = {"If", "Loop", "Scan"}


def _text(v) -> str:
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)


def _clean(name) -> str:
    if isinstance(name, bytes):  # protobuf hands back bytes for a name that is not valid UTF-8
        name = name.decode("utf-8", errors="replace")
    out = "".join(ch if ch.isalnum() or ch in "_-." else "_" for ch in name)
    return out or "onnx"


from . import onnx_composites, onnx_losses  # noqa: E402,F401,I001  (losses, bitwise ops and other compositions)
# the handlers register themselves into the table above
from . import onnx_control, onnx_elementwise, onnx_nn, onnx_resize, onnx_rnn, onnx_shapes  # noqa: E402,F401
from . import onnx_ops_elementwise, onnx_ops_indexing, onnx_ops_norm, onnx_ops_conv, onnx_ops_quant, onnx_ops_attention  # noqa: E402,F401,I001  (issue 20: the added ops' handlers)
from . import onnx_gridsample, onnx_ops_extra, onnx_ops_training  # noqa: E402,F401,I001  (GridSample; Shrink...AffineGrid; optimizers, ml)
