"""The cost model: each node's time on each device, each tensor's time on each link.

A node's time comes from its op's registered cost (FLOPs, bytes read and written; see
core/registry.py) put through the device profile's per-op-type regression. Unknown
dimensions are taken as the batch size.
"""
from __future__ import annotations

import weakref
from typing import Dict, List, Mapping, Optional, Sequence

from ..core.graph import Node, Tensor
from ..core.registry import Cost, default_cost
from .devices import CLOUD, CLOUD_DEVICE, EDGE, EDGE_DEVICE, DeviceProfile, LinkModel

# between two cloud devices (the many-device case): a datacenter network
LAN = LinkModel(up_bps=10e9, down_bps=10e9, rtt_s=100e-6)
_FREE_OPS = frozenset({"Const", "Placeholder", "NoOp", "Send", "Recv"})


class _SizedTensor:
    """A tensor whose unknown dims read as the batch size; everything else is the tensor's."""
    __slots__ = ("_t", "shape")

    def __init__(self, t: Tensor, batch: int):
        self._t = t
        self.shape = tuple(batch if d is None else d for d in t.shape)

    def __getattr__(self, name):
        return getattr(self._t, name)


class _SizedNode:
    __slots__ = ("_n", "inputs", "outputs")

    def __init__(self, n: Node, batch: int):
        self._n = n
        self.inputs = tuple(_SizedTensor(t, batch) for t in n.inputs)
        self.outputs = tuple(_SizedTensor(t, batch) for t in n.outputs)

    def __getattr__(self, name):
        return getattr(self._n, name)


def _has_unknown(n: Node) -> bool:
    return any(d is None for t in n.inputs + n.outputs for d in t.shape)


def cost_key(node: Node) -> str:
    """The name a node's time is fitted under: its op, or a variant the op's FLOP and byte counts
    do not tell apart. A grouped (depthwise) convolution is a loop of small products, several
    times slower per FLOP than one large GEMM, so it gets its own regression."""
    groups = node.attrs.get("groups", 1) if node.op.startswith(("Conv2D", "FusedConv2D")) else 1
    return f"{node.op}:grouped" if groups != 1 else node.op


def op_cost(node: Node, batch_size: int = 1) -> Cost:
    """The node's registered cost with unknown dims taken as `batch_size`."""
    fn = node.opdef.cost or default_cost
    view = _SizedNode(node, batch_size) if _has_unknown(node) else node
    try:
        return fn(view)
    except Exception:  # a cost function must never stop placement: fall back to bytes moved
        return default_cost(view)


class CostModel:
    """Times of nodes on devices and of tensors between devices.

    `profiles` maps device names to profiles; `edge` names the device on the far side of
    `link` (transfers from it are uploads, to it downloads). Two cloud devices talk over `lan`.
    """

    def __init__(self, profiles: Mapping[str, DeviceProfile], link: LinkModel, edge: Optional[str] = EDGE_DEVICE,
                 batch_size: int = 1, lan: LinkModel = LAN):
        if not profiles:
            raise ValueError("a cost model needs at least one device profile")
        if edge is not None and edge not in profiles:
            raise ValueError(f"edge device {edge!r} has no profile; profiles: {sorted(profiles)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.profiles: Dict[str, DeviceProfile] = dict(profiles)
        self.edge = edge
        self.devices: List[str] = ([edge] if edge else []) + [d for d in profiles if d != edge]
        self.link = link
        self.lan = lan
        self.batch_size = batch_size
        self._costs: "weakref.WeakKeyDictionary[Node, Cost]" = weakref.WeakKeyDictionary()

    @classmethod
    def edge_cloud(cls, link: LinkModel = LinkModel(), edge: DeviceProfile = EDGE, cloud: DeviceProfile = CLOUD,
                   batch_size: int = 1) -> "CostModel":
        return cls({EDGE_DEVICE: edge, CLOUD_DEVICE: cloud}, link, EDGE_DEVICE, batch_size)

    @property
    def cloud(self) -> str:
        """The first device that is not the edge."""
        for d in self.devices:
            if d != self.edge:
                return d
        raise ValueError("this cost model has no cloud device")

    def with_link(self, link: LinkModel) -> "CostModel":
        """The same devices over another link (node costs already computed are shared)."""
        other = CostModel.__new__(CostModel)
        other.__dict__.update(self.__dict__)
        other.link = link
        return other

    # ---- nodes --------------------------------------------------------------------------------
    def cost(self, node: Node) -> Cost:
        c = self._costs.get(node)
        if c is None:
            c = self._costs[node] = op_cost(node, self.batch_size)
        return c

    def node_time(self, node: Node, device: str) -> float:
        if node.op in _FREE_OPS:
            return 0.0
        c = self.cost(node)
        return self.profiles[device].op_time(cost_key(node), c.flops, c.bytes_read + c.bytes_written)

    def node_times(self, node: Node, devices: Optional[Sequence[str]] = None) -> List[float]:
        return [self.node_time(node, d) for d in (devices or self.devices)]

    # ---- tensors ----------------------------------------------------------------------------------
    def tensor_bytes(self, t: Tensor) -> int:
        n = 1
        for d in t.shape:
            n *= self.batch_size if d is None else d
        return n * t.dtype.itemsize

    def transfer_time(self, nbytes: float, src: str, dst: str) -> float:
        if src == dst:
            return 0.0
        if src == self.edge:
            return self.link.upload_time(nbytes)
        if dst == self.edge:
            return self.link.download_time(nbytes)
        return self.lan.upload_time(nbytes)

    def supports(self, device: str, op: str) -> bool:
        return self.profiles[device].supports(op)
