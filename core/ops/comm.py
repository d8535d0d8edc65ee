"""Send and Recv: the two ends of a tensor crossing from one device's part to another's.

The partitioner puts a Send in the producing part and a Recv in the consuming part, with
the same rendezvous key (naming source device, destination device and tensor). Both
kernels exchange values through the session's rendezvous (`Session(graph, rendezvous=...)`,
see core/rendezvous.py).

Steps pair without a step id: each kernel counts its own invocations, and the n-th Send of
a key meets the n-th Recv of that key. So a part must be run with one fetch signature
(one compiled plan) for its whole life, and two steps of the same parts must not overlap.
"""
from __future__ import annotations

import itertools

from .. import dtypes as _dt
from ..errors import ExecutionError
from ..registry import REQUIRED, Cost, OpDef, register
from ..graph import get_default_graph
from ..shapes import as_shape, compatible, fmt
from .base import convert, make


def _rendezvous(node, ctx):
    rv = ctx.state.rendezvous
    if rv is None:
        raise ExecutionError(f"node '{node.name}' ({node.op}) needs a rendezvous for key "
                             f"'{node.attrs['key']}': build the session as Session(graph, rendezvous=...)",
                             node.name, node.op)
    return rv


def _kernel_send(node, ctx):
    rv = _rendezvous(node, ctx)
    key = node.attrs["key"]
    step = itertools.count()  # next() on a count is atomic under the GIL
    copy = ctx.xp.array

    def send(x):
        # a copy, as a wire would make: the producer may be a variable updated later in the step
        rv.send((key, next(step)), copy(x))
    return send


def _kernel_recv(node, ctx):
    rv = _rendezvous(node, ctx)
    key = node.attrs["key"]
    dtype, shape = node.attrs["dtype"], node.attrs["shape"]
    step = itertools.count()

    def recv():
        v = rv.recv((key, next(step)))
        if getattr(v, "dtype", None) != dtype or not compatible(v.shape, shape):
            got = f"{v.dtype}{fmt(v.shape)}" if hasattr(v, "shape") else type(v).__name__
            raise ExecutionError(f"node '{node.name}' (Recv): key '{key}' carried {got}; "
                                 f"expected {dtype.name}{fmt(shape)}", node.name, "Recv")
        return v
    return recv


def _cost_transfer(node) -> Cost:
    return Cost(0.0, 0.0, 0.0)  # the partitioner prices transfers with its link model


register(OpDef(
    "Send", inputs=("x",), attrs={"key": REQUIRED, "src_device": REQUIRED, "dst_device": REQUIRED},
    infer=lambda node: [], kernel=_kernel_send, cost=_cost_transfer, stateful=True,
    doc="Deposit x in the session's rendezvous under `key` (one value per step).",
))
register(OpDef(
    "Recv", inputs=(), attrs={"key": REQUIRED, "src": REQUIRED, "dst": REQUIRED,
                              "dtype": REQUIRED, "shape": REQUIRED},
    infer=lambda node: [(node.attrs["dtype"], node.attrs["shape"])],
    kernel=_kernel_recv, cost=_cost_transfer, stateful=True,
    doc="Take the value sent under `key` from the session's rendezvous (waits, bounded).",
))


def send(x, key: str, src_device: str, dst_device: str, name=None):
    return make("Send", (convert(x),), {"key": key, "src_device": src_device, "dst_device": dst_device},
                name=name or "Send")


def recv(key: str, src: str, dst: str, dtype, shape, name=None, graph=None):
    return make("Recv", (), {"key": key, "src": src, "dst": dst, "dtype": _dt.as_dtype(dtype),
                             "shape": as_shape(shape)},
                name=name or "Recv", graph=graph or get_default_graph()).outputs[0]


__all__ = ["send", "recv"]
