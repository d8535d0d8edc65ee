"""Channel concatenations that need not be made: a two-part Concat along the channels (NCHW) read
only by pools and 1x1 convolutions (SqueezeNet's fire modules, DenseNet's blocks) is never written.

- A pool is computed channel by channel, so pool(concat(a, b)) = concat(pool(a), pool(b)): the pool
  moves before the Concat, which then joins planes a quarter of the size (a 3x3/2 pool).
- A 1x1 convolution (stride 1, no padding, one group) with constant weights W = [Wa | Wb] computes
  W @ concat(a, b) = Wa @ a + Wb @ b: FusedConv2D(concat(a, b), W, bias, act) becomes
  FusedConv2DAdd(b, Wb, bias, addend=FusedConv2D(a, Wa, 0, none), act). The intermediate has the
  consumer's outputs (a squeeze layer's 16-64 channels), the Concat had both parts' (128-512).

SqueezeNet-96 at batch 32 spent 5.5-6.3 of 39-57 ms in its eight Concats (72 MB copied a run, each
copy into memory it had to fetch). The sums are regrouped, so a consumer's output differs from the
unsplit convolution's in its last bits (each is a float32 dot product over the same terms). An
executor pass (SESSION_PASSES): the edge runtime and the exporters keep the graph's Concat.
"""
from __future__ import annotations

from typing import Dict

import numpy as np

from ..graph import Node, Tensor
from .fusion import Builder, _consumers, _frozen, _pinned, _rebuild, _users
from .simplify import Rewrite

_POOLS = ("MaxPool", "AvgPool")
_SPLIT_ACTS = ("none", "relu", "relu6")  # what FusedConv2DAdd applies after the addend


def _channel_concat(n: Node, pinned: set) -> bool:
    """A two-part Concat along axis 1 of 4-D tensors with static channel counts."""
    if n.op != "Concat" or len(n.inputs) != 2 or n.control_inputs or n in pinned:
        return False
    shape = n.outputs[0].shape
    return (len(shape) == 4 and n.attrs["axis"] in (1, -3)
            and all(len(t.shape) == 4 and t.shape[1] is not None for t in n.inputs))


def _const(t: Tensor):
    return t.node.attrs["value"] if t.node.op == "Const" else None


def _pointwise(n: Node, y: Tensor) -> bool:
    """A FusedConv2D reading y as its input: 1x1, stride 1, no padding or dilation, one group, constant
    float weights and bias, an activation FusedConv2DAdd takes."""
    if n.op != "FusedConv2D" or n.inputs[0] is not y or n.control_inputs:
        return False
    a = n.attrs
    w, b = _const(n.inputs[1]), _const(n.inputs[2])
    return (w is not None and b is not None and w.ndim == 4 and w.shape[2:] == (1, 1)
            and tuple(a["strides"]) == (1, 1) and tuple(a["dilations"]) == (1, 1) and a["groups"] == 1
            and all(p == 0 for pair in a["pads"] for p in pair) and a["activation"] in _SPLIT_ACTS
            and w.dtype.kind == "f" and b.dtype.kind == "f")


def _pools_first(rw: Rewrite) -> Rewrite:
    """pool(concat(a, b)) -> concat(pool(a), pool(b)) where the pool is the Concat's one reader."""
    uses = _consumers(rw.graph, {f for f in rw.fetches if isinstance(f, Tensor)})
    users, pinned = _users(rw), _pinned(rw)
    moved: Dict[Node, Node] = {}  # pool -> the Concat it reads
    for n in rw.graph.nodes:
        y = n.outputs[0] if n.outputs else None
        if not _channel_concat(n, pinned) or uses.get(y, 0) != 1:
            continue
        pool = users[y][0]
        if pool.op in _POOLS and not pool.control_inputs and pool not in pinned:
            moved[pool] = n
    if not moved:
        return rw
    skip = set(moved.values())

    def rewrite(n: Node, b: Builder):
        if n in skip:
            return []
        cat = moved.get(n)
        if cat is None:
            return None
        parts = [b.g.add_node(n.op, [b.map[t]], dict(n.attrs), name=f"{n.name}/part{i}", device=n.device).outputs[0]
                 for i, t in enumerate(cat.inputs)]
        return [b.g.add_node("Concat", parts, dict(cat.attrs), name=cat.name, device=cat.device).outputs[0]]
    return _rebuild(rw, rewrite, "pool_before_concat")


def split_channel_concat(rw: Rewrite) -> Rewrite:
    """Pools moved before two-part channel Concats, then Concats read only by 1x1 FusedConv2Ds
    (constant weights) dropped, each reader summing its two parts' products (module docstring)."""
    rw = _pools_first(rw)
    uses = _consumers(rw.graph, {f for f in rw.fetches if isinstance(f, Tensor)})
    users, pinned = _users(rw), _pinned(rw)
    split: Dict[Node, Node] = {}  # 1x1 convolution -> the Concat it reads
    dropped = set()
    for n in rw.graph.nodes:
        if not _channel_concat(n, pinned):
            continue
        y = n.outputs[0]
        readers = users.get(y, [])
        if not readers or uses.get(y, 0) != len(readers) or not all(_pointwise(r, y) for r in readers):
            continue  # fetched, or read by something that needs the whole tensor
        dropped.add(n)
        for r in readers:
            split[r] = n
    if not split:
        return rw

    def rewrite(n: Node, b: Builder):
        if n in dropped:
            return []
        cat = split.get(n)
        if cat is None:
            return None
        a, c = cat.inputs
        ca = a.shape[1]
        w, bias = _const(n.inputs[1]), _const(n.inputs[2])
        wa = b.g.add_node("Const", (), {"value": _frozen(w[:, :ca])}, name=f"{n.name}/w_part0").outputs[0]
        wc = b.g.add_node("Const", (), {"value": _frozen(w[:, ca:])}, name=f"{n.name}/w_part1").outputs[0]
        zero = b.g.add_node("Const", (), {"value": _frozen(np.zeros_like(bias))}, name=f"{n.name}/no_bias").outputs[0]
        first = b.g.add_node("FusedConv2D", [b.map[a], wa, zero], {**n.attrs, "activation": "none"},
                             name=f"{n.name}/part0", device=n.device).outputs[0]
        out = b.g.add_node("FusedConv2DAdd", [b.map[c], wc, b.map[n.inputs[2]], first], dict(n.attrs), name=n.name,
                           device=n.device)
        return [out.outputs[0]]
    return _rebuild(rw, rewrite, "concat_split")


__all__ = ["split_channel_concat"]
