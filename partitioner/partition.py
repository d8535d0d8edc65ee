"""Partitioning: rewrite a placed graph into one subgraph per device, joined by Send/Recv.

Every tensor that crosses devices crosses once per destination device, however many nodes
read it there: one Send in the producing part, one Recv in the consuming part, sharing a
rendezvous key "src;dst;tensor". A control dependency that crosses devices becomes a
token (a scalar) sent the same way. Constants are copied into each part that reads them.

Each part keeps the original node names, so it can be fetched and fed by them, and its
variables are the original variables (sessions key variables by name).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..core.devices import DeviceSpec
from ..core.errors import GraphError
from ..core.graph import Graph, Node, Tensor
from .problem import Fetch, PlacementError, needed_nodes, replicable, resolve_outputs
from .runner import SplitSession


@dataclass(frozen=True)
class Transfer:
    key: str          # "src;dst;tensor" (tensor "^node" for a control token)
    tensor: str       # the original tensor's name (or ^node)
    src: str
    dst: str
    send: str         # the Send node's name in the src part
    recv: str         # the Recv node's name in the dst part


@dataclass
class Part:
    device: str
    graph: Graph
    outputs: Dict[str, str] = field(default_factory=dict)  # original output name -> fetch name here
    sends: List[str] = field(default_factory=list)
    feeds: List[str] = field(default_factory=list)          # placeholders fed to this part

    @property
    def fetches(self) -> List[str]:
        """What one step of this part runs: its outputs and every Send."""
        return list(self.outputs.values()) + self.sends


@dataclass
class Partition:
    parts: Dict[str, Part]
    transfers: List[Transfer]
    outputs: List[str]        # original output names, in the order asked for
    source: Optional[Graph] = None  # the unsplit graph

    def session(self, rendezvous=None, timeout: float = 60.0):
        """A SplitSession running these parts together (one Session per part)."""
        return SplitSession(self, rendezvous=rendezvous, timeout=timeout)

    def run(self, feed_dict: Optional[Mapping] = None, timeout: float = 60.0) -> list:
        """One step in fresh sessions: the outputs' values, in order."""
        with self.session(timeout=timeout) as s:
            return s.run(feed_dict)

    def __str__(self) -> str:
        lines = []
        for d, p in self.parts.items():
            lines.append(f"# part {d}: {len(p.graph.nodes)} nodes")
            lines.append(str(p.graph))
        return "\n".join(lines)


def transfer_key(src: str, dst: str, tensor: str) -> str:
    return f"{src};{dst};{tensor}"


def partition(graph: Graph, placement: Mapping[str, str], outputs: Optional[Sequence[Fetch]] = None,
              return_to: Optional[str] = None) -> Partition:
    """One subgraph per device of `placement` (node name -> device) computing `outputs`.

    `return_to`: a device the fetched tensors are sent to (the edge, where the answer is
    wanted); None fetches each output in the part that computes it.
    """
    outs = resolve_outputs(graph, outputs)
    return _Builder(graph, placement, return_to).build(outs)


class _Builder:
    def __init__(self, graph: Graph, placement: Mapping[str, str], return_to: Optional[str]):
        self.src = graph
        self.placement = placement
        self.return_to = return_to
        self.taken = {n.name for n in graph.nodes}
        self.parts: Dict[str, Part] = {}
        self.local: Dict[Tuple[Tensor, str], Tensor] = {}   # (original tensor, device) -> tensor there
        self.local_node: Dict[Tuple[Node, str], Node] = {}
        self.tokens: Dict[Tuple[Node, str], Node] = {}       # (original node, device) -> Recv of its token
        self.transfers: List[Transfer] = []

    def build(self, outs: List[Union[Tensor, Node]]) -> Partition:
        nodes = needed_nodes(outs)
        for n in nodes:
            if not replicable(n):
                self._copy(n, self._device(n))
        names = []
        for f in outs:
            names.append(f.name)
            if isinstance(f, Node):
                d = self._device(f)
                self._part(d).outputs[f.name] = self.local_node[(f, d)].name
                continue
            d = self.return_to or (self._device(f.node) if not replicable(f.node) else self._any_device())
            self._part(d).outputs[f.name] = self._tensor_on(f, d).name
        for part in self.parts.values():
            part.graph.verify()
        return Partition(self.parts, self.transfers, names, self.src)

    # ---- devices and parts --------------------------------------------------------------------
    def _device(self, n: Node) -> str:
        d = self.placement.get(n.name)
        if d is None:
            raise PlacementError(f"node '{n.name}' ({n.op}) has no device in the placement")
        if d not in self.parts:
            try:
                DeviceSpec.parse(d)
            except ValueError as e:
                raise PlacementError(f"node '{n.name}' is placed on {d!r}: {e}") from None
        return d

    def _any_device(self) -> str:
        return next(iter(self.parts)) if self.parts else next(iter(self.placement.values()))

    def _part(self, d: str) -> Part:
        p = self.parts.get(d)
        if p is None:
            p = self.parts[d] = Part(d, Graph(seed=self.src.seed))
        return p

    def _fresh(self, g: Graph, base: str) -> str:
        name, k = base, 0
        while name in self.taken or name in g:
            k += 1
            name = f"{base}_{k}"
        return name

    # ---- copying nodes ------------------------------------------------------------------------
    def _copy(self, n: Node, d: str) -> Node:
        part = self._part(d)
        ins = []
        for k, t in enumerate(n.inputs):
            if k in n.opdef.ref_inputs:
                if t.node.op != "Variable" or self._device(t.node) != d:
                    raise PlacementError(f"node '{n.name}' ({n.op}) on {d} updates variable '{t.node.name}' "
                                         f"on {self._device(t.node)}: a variable and its updates must share a device")
                ins.append(self.local[(t, d)])
            else:
                ins.append(self._tensor_on(t, d))
        ctrls = [self._control_on(c, d) for c in n.control_inputs]
        try:
            new = part.graph.add_node(n.op, ins, dict(n.attrs), name=n.name, control_inputs=ctrls,
                                      device=d, exact_name=True)
        except (GraphError, ValueError) as e:
            raise PlacementError(f"node '{n.name}' ({n.op}) cannot be built on {d}: {e}") from e
        self.local_node[(n, d)] = new
        for t, nt in zip(n.outputs, new.outputs):
            self.local[(t, d)] = nt
        if n.op == "Placeholder":
            part.feeds.append(n.name)
        return new

    def _tensor_on(self, t: Tensor, d: str) -> Tensor:
        """Tensor t as seen on device d: local, a constant's copy, or a Recv (one per device)."""
        got = self.local.get((t, d))
        if got is not None:
            return got
        if replicable(t.node):
            return self._copy(t.node, d).outputs[t.index]
        src = self._device(t.node)
        if (t, src) not in self.local:
            raise PlacementError(f"tensor '{t.name}' is read on {d} before it is computed on {src}")
        sent = self.local[(t, src)]
        recv = self._transfer(sent, t.name, src, d, t.node.name.replace(":", "_") + f"_{t.index}")
        self.local[(t, d)] = recv.outputs[0]
        return recv.outputs[0]

    def _control_on(self, c: Node, d: str) -> Node:
        if replicable(c):
            return self._copy(c, d) if (c, d) not in self.local_node else self.local_node[(c, d)]
        src = self._device(c)
        if src == d:
            return self.local_node[(c, d)]
        got = self.tokens.get((c, d))
        if got is None:
            sp = self._part(src)
            token = sp.graph.add_node("Const", (), {"value": _token()}, exact_name=True,
                                      name=self._fresh(sp.graph, f"_token/{c.name}"),
                                      control_inputs=[self.local_node[(c, src)]], device=src)
            got = self.tokens[(c, d)] = self._transfer(token.outputs[0], "^" + c.name, src, d,
                                                       f"token_{c.name}")
        return got

    def _transfer(self, sent: Tensor, what: str, src: str, dst: str, label: str) -> Node:
        key = transfer_key(src, dst, what)
        sp, dp = self._part(src), self._part(dst)
        send = sp.graph.add_node("Send", (sent,), {"key": key, "src_device": src, "dst_device": dst},
                                 name=self._fresh(sp.graph, f"_send/{label}"), exact_name=True, device=src)
        recv = dp.graph.add_node("Recv", (), {"key": key, "src": src, "dst": dst, "dtype": sent.dtype,
                                              "shape": sent.shape},
                                 name=self._fresh(dp.graph, f"_recv/{label}"), exact_name=True, device=dst)
        sp.sends.append(send.name)
        self.transfers.append(Transfer(key, what, src, dst, send.name, recv.name))
        return recv


def _token() -> np.ndarray:
    v = np.zeros((), dtype=np.bool_)
    v.flags.writeable = False
    return v
