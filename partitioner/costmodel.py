"""The cost model: each node's time on each device, each tensor's time on each link.

A node's time comes from its op's registered cost (FLOPs, bytes read and written; see
core/registry.py) put through the device profile's per-op-type regression. Unknown
dimensions are taken as the batch size.
"""
from __future__ import annotations

import weakref
from typing import Dict, List, Mapping, Optional, Sequence, Union

from ..core.graph import Node, Tensor
from ..core.registry import Cost, default_cost
from ..wire.link import LinkModel
from .client_cost import ClientCost
from .devices import CLOUD, CLOUD_DEVICE, EDGE, EDGE_DEVICE, DeviceProfile
from .executed import ABSORBED, FREE, Roles, as_run, unchanged

# between two cloud devices (the many-device case): a datacenter network
LAN = LinkModel(up_bandwidth_bps=10e9, down_bandwidth_bps=10e9, rtt_s=100e-6)
NARROW_ROWS = 16  # products of up to this many rows are priced as weight-streaming ("MatMul:narrow")
NARROW_PIXELS = 16  # convolutions with up to this many output pixels too ("Conv2D:narrow")
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


def cost_key(node: Node, batch_size: int = 1) -> str:
    """The name a node's time is fitted under: its op, or a variant the op's FLOP and byte counts
    do not tell apart. A grouped (depthwise) convolution is a loop of small products, several
    times slower per FLOP than one large GEMM, so it gets its own regression. A product of one
    row by a matrix runs BLAS's matrix-vector kernel, which streams the weights once, several
    times faster per byte than the packing a many-row GEMM does (measured here: 1x1024 @
    1024x1024 in 61 us, 2x512 @ 512x2048, the same weight bytes, in 300 us). A product of a
    few rows is bound by packing the weights (about 10 GB/s here), a many-row one by FLOPs:
    one line through both regimes fits neither, so few-row products have their own too. And
    among those, OpenBLAS runs a row count that is a multiple of 4 through its small-GEMM kernel
    but the rows left over one at a time (measured here, 1024x1024 weights, one thread: 2 rows
    370 us, 3 rows 527, 4 rows 298, 6 rows 486, 8 rows 428): "MatMul:narrow_odd" for those.
    A 1x1 convolution at stride 1 is "Conv2D:pointwise" (one GEMM over the pixels, no window
    gathered); a profile without that key prices it as "Conv2D" (op_time falls back to the op).
    A dense convolution with at most NARROW_PIXELS output pixels (a ResNet's last stages) is
    "Conv2D:narrow": its GEMM has few columns and large weights, bound by streaming them as a
    narrow product is (the int8 interpreter ran ResNet-50-shaped 4x4 and 2x2 stages 2-3x slower
    than a fit over wide convolutions said, issue 27). A 2x2 max pool at stride 2, unpadded, is
    "MaxPool:2x2": the edge runs it in one compiled pass, the other windows one pass per tap (the
    fire-module calibration part's 2x2 pools took 2.3-2.9 us each, priced at 42-53 by the 3x3 fit).
    A pool of a WIDE_POOLS window (k x k, any stride and padding) is "MaxPool:kxk" / "AvgPool:kxk": one pass
    per tap costs it k^2 passes of fixed work that the 3x3 fit's per-output price leaves out (two-tower's
    8x8 AvgPool: 0.133 ms measured in the model, 0.074 priced by the 3x3 fit, issue 27)."""
    if node.op in ("Conv2D", "FusedConv2D"):
        if node.attrs.get("groups", 1) != 1:
            return f"{node.op}:grouped"
        if 0 < _pixels(node, batch_size) <= NARROW_PIXELS:
            return f"{node.op}:narrow"
        return f"{node.op}:pointwise" if _pointwise(node) else node.op
    if node.op == "MaxPool" and _pool_2x2(node):
        return "MaxPool:2x2"
    if node.op in ("MaxPool", "AvgPool") and _wide_window(node):
        k = node.attrs["ksize"][0]
        return f"{node.op}:{k}x{k}"
    if node.op in ("MatMul", "FusedMatMul"):
        rows = _rows(node, batch_size)
        if rows == 1:
            return f"{node.op}:vector"
        if 1 < rows <= NARROW_ROWS:
            return f"{node.op}:narrow" if rows % 4 == 0 else f"{node.op}:narrow_odd"
    return node.op


def _pixels(node: Node, batch_size: int) -> int:
    """Output pixels of an NCHW convolution (its GEMM's columns); 0 when its output is not 4-D."""
    y = node.outputs[0].shape if node.outputs else ()
    if len(y) != 4:
        return 0
    n, _, h, w = (batch_size if d is None else d for d in y)
    return n * h * w


WIDE_POOLS = (7, 8)  # square pooling windows priced by their own calibration (the end of a network, an image's)


def _wide_window(node: Node) -> bool:
    """A square WIDE_POOLS window, without dilation."""
    k = tuple(node.attrs.get("ksize", ()))
    return len(k) == 2 and k[0] == k[1] and k[0] in WIDE_POOLS and tuple(node.attrs.get("dilations", (1, 1))) == (1, 1)


def _pool_2x2(node: Node) -> bool:
    """A 2x2 window at stride 2 with no padding or dilation."""
    a = node.attrs
    pads = a.get("pads", ((0, 0), (0, 0)))
    return (tuple(a.get("ksize", ())) == (2, 2) and tuple(a.get("strides", ())) == (2, 2)
            and all(p == 0 for pair in pads for p in pair) and tuple(a.get("dilations", (1, 1))) == (1, 1))


def _pointwise(node: Node) -> bool:
    """A 1x1 convolution at stride 1: one GEMM over the pixels, no window to gather (a 3x3's im2col
    copies nine times its input first), so its time per FLOP is its own."""
    w = node.inputs[1].shape if len(node.inputs) > 1 else ()
    strides = node.attrs.get("strides", (1, 1))
    strides = (strides, strides) if isinstance(strides, int) else tuple(strides)
    return len(w) == 4 and tuple(w[2:]) == (1, 1) and all(int(v) == 1 for v in strides)


def _rows(node: Node, batch_size: int) -> int:
    a = node.inputs[0]
    if len(a.shape) != 2:
        return 0  # a batched product: not one vector
    d = a.shape[1] if node.attrs.get("transpose_a") else a.shape[0]
    return batch_size if d is None else d


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
                 batch_size: int = 1, lan: LinkModel = LAN, passes: bool = True,
                 node_times: Optional[Mapping[str, Mapping[str, float]]] = None, client: ClientCost = ClientCost()):
        """`node_times` {device: {node name: seconds}}: measured times of this graph's nodes on a
        device (see measured.py), used instead of the profile's regression for the nodes it names.
        `client`: the edge client's own cost per request, part, call and byte (client_cost.py),
        priced in every plan (plan.py); its per-byte term is part of each edge transfer's time."""
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
        self.client = client
        self.passes = passes  # price the graph the Session runs after its passes (fusion, folding)
        self.node_times: Dict[str, Dict[str, float]] = {}
        for d, times in (node_times or {}).items():
            if d not in self.profiles:
                raise ValueError(f"node_times for device {d!r}, which has no profile; profiles: {sorted(profiles)}")
            bad = {n: s for n, s in times.items() if not (isinstance(s, (int, float)) and 0 <= s < float("inf"))}
            if bad:
                raise ValueError(f"node_times for {d}: times must be finite seconds >= 0, got {dict(list(bad.items())[:3])}")
            self.node_times[d] = {str(n): float(s) for n, s in times.items()}
        self._costs: "weakref.WeakKeyDictionary[Node, Cost]" = weakref.WeakKeyDictionary()
        self._roles: "weakref.WeakKeyDictionary[object, tuple]" = weakref.WeakKeyDictionary()

    @classmethod
    def edge_cloud(cls, link: LinkModel = LinkModel(), edge: DeviceProfile = EDGE, cloud: DeviceProfile = CLOUD,
                   batch_size: int = 1, passes: bool = True, client: Optional[ClientCost] = None) -> "CostModel":
        """The edge/cloud pair over `link`; `client` (default: none, priced at zero) as in __init__."""
        return cls({EDGE_DEVICE: edge, CLOUD_DEVICE: cloud}, link, EDGE_DEVICE, batch_size, passes=passes,
                   client=client or ClientCost())

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
        """The node's time run as it is (no pass applied)."""
        if node.op in _FREE_OPS:
            return 0.0
        c = self.cost(node)
        return self.profiles[device].op_time(cost_key(node, self.batch_size), c.flops, c.bytes_read + c.bytes_written)

    def node_times(self, node: Node, devices: Optional[Sequence[str]] = None) -> List[float]:
        return [self.node_time(node, d) for d in (devices or self.devices)]

    # ---- the graph the executor runs -----------------------------------------------------------------
    def roles(self, nodes: Sequence[Node], outputs: Sequence) -> Roles:
        """What the Session's passes make of `nodes` (cached per graph, nodes and outputs)."""
        if not self.passes or not nodes:
            return unchanged(nodes)
        graph = nodes[0].graph
        key = (len(graph.nodes), tuple(n.name for n in nodes), tuple(f.name for f in outputs))
        hit = self._roles.get(graph)
        if hit is not None and hit[0] == key:
            return hit[1]
        try:
            roles = as_run(nodes, outputs)
        except Exception:  # a pass failing must never stop placement: price the graph as written
            roles = unchanged(nodes)
        self._roles[graph] = (key, roles)
        return roles

    def run_time(self, node: Node, device: str, roles: Roles) -> float:
        """The node's share of what runs after the passes (see executed.py); its measured time
        when `node_times` has one for this device."""
        measured = self.node_times.get(device)
        if measured is not None and node.name in measured:
            return measured[node.name]
        return self.model_time(node, device, roles)

    def model_time(self, node: Node, device: str, roles: Roles) -> float:
        """run_time by the profile's regression alone (no measured node times)."""
        role = roles.of(node)
        if role == FREE:
            return 0.0
        if role == ABSORBED:
            return self._absorbed_time(node, device)
        m = roles.runs_as.get(node, node)
        return self.node_time(m, device)

    def streamed_extra(self, node: Node, device: str, roles: Roles) -> float:
        """What the node's kernel takes beyond run_time when its weights come from memory, not the
        shared cache (DeviceProfile.streamed_extra; a part's whole weights decide how far: plan.py)."""
        if roles.of(node) in (FREE, ABSORBED):
            return 0.0
        m = roles.runs_as.get(node, node)
        if m.op in _FREE_OPS:
            return 0.0
        c = self.cost(m)
        return self.profiles[device].streamed_extra(cost_key(m, self.batch_size), c.flops,
                                                    c.bytes_read + c.bytes_written)

    def _absorbed_time(self, node: Node, device: str) -> float:
        """An elementwise step inside a fused kernel: priced as its op, fixed cost included (the
        fused kernel still makes one numpy call per step; only the executor's dispatch, which no
        kernel timing holds, is saved), times the device's `fused_steps` (the int8 edge
        interpreter does them inside its requantization: about nothing)."""
        prof = self.profiles[device]
        if not prof.fused_steps:
            return 0.0
        if node.op != "BatchNorm":
            return prof.fused_steps * self.node_time(node, device)
        t = node.outputs[0]  # folded into the weights: what is left is adding its offset
        n = 1
        for d in t.shape:
            n *= self.batch_size if d is None else d
        return prof.fused_steps * prof.op_time("BiasAdd", n, 3 * n * t.dtype.itemsize)

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
            return self.link.upload_time(nbytes) + self.client.byte_s * nbytes
        if dst == self.edge:
            return self.link.download_time(nbytes) + self.client.byte_s * nbytes
        return self.lan.upload_time(nbytes)

    def supports(self, device: str, op: Union[str, Node]) -> bool:
        """Whether `device` runs an op type, or (given a node) this node with its attributes and dtypes."""
        if isinstance(op, str):
            return self.profiles[device].supports(op)
        return self.profiles[device].supports(op.op, op)
