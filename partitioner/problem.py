"""The placement problem: which nodes, on which devices they may run, and what each costs.

Every placement algorithm reads a Problem, built once from a graph, the fetches wanted
and a cost model, with the constraints applied:

- nodes pinned by the user (`node.device`) run there;
- ops a device does not support never run there (reported in `forced`, never an error
  later during conversion);
- a Variable and the ops that update it (through a reference input, also from inside a cond or
  while body) are colocated, and so are a producer and consumers of an opaque (variant) value,
  which cannot cross a wire (colocation.py, the rule the cluster placement applies too);
- graph inputs (placeholders) live where the data does (the sensor is on the edge);
- the fetched outputs are returned to one device (the edge), their transfer priced;
- the edge's memory budget (weights plus outputs resident there, a conservative count).

The objective of a placement is the end-to-end latency of one step run as a sequence:
the compute of every node on its device plus one transfer per tensor per destination
device (a tensor read by several nodes on the other side crosses once).
Constants are not placed: each part that reads one gets its own copy, for free
(their placement entry names one reader's device).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..core.devices import DeviceSpec
from ..core.errors import IsthmusError
from ..core.executor import prune
from ..core.graph import Graph, Node, Tensor
from .colocation import colocation_groups, updated_variables
from .costmodel import CostModel

Placement = Dict[str, str]  # node name -> device name
Fetch = Union[Tensor, Node, str]
TOKEN_BYTES = 1  # a control dependency crossing devices carries a token


class PlacementError(IsthmusError, ValueError):
    """The constraints cannot all hold (or a placement given breaks them)."""


@dataclass(frozen=True)
class Constraints:
    """Placement rules beyond what the graph says. Device roles are 'edge', 'cloud' or a device name."""
    inputs_on: Optional[str] = "edge"     # placeholders run here (None: anywhere)
    outputs_to: Optional[str] = "edge"    # fetched tensors are returned here (None: fetched in place)
    respect_pins: bool = True             # honour node.device
    edge_memory_budget: Union[float, str, None] = "profile"  # bytes; "profile": the edge profile's; None: none


@dataclass(frozen=True)
class Forced:
    """A node that could not go everywhere, and why."""
    node: str
    op: str
    devices: Tuple[str, ...]  # where it may run
    reason: str


@dataclass
class Flow:
    """One value leaving a node: a tensor (or a control token) and the nodes reading it."""
    tensor: Optional[Tensor]        # None: a control dependency (a token)
    producer: int
    consumers: Tuple[int, ...]
    is_output: bool
    nbytes: int
    name: str                       # the tensor's name, or ^producer for a token
    times: np.ndarray = field(repr=False, default=None)  # [D, D] transfer seconds src -> dst


@dataclass(frozen=True)
class Move:
    """One transfer of a placement: a tensor (or ^token) from src to dst."""
    tensor: str
    src: str
    dst: str
    nbytes: int
    seconds: float


@dataclass
class Breakdown:
    compute: Dict[str, float]   # device -> seconds of compute there
    moves: List[Move]

    @property
    def total(self) -> float:
        return sum(self.compute.values()) + sum(m.seconds for m in self.moves)


class Problem:
    def __init__(self, graph: Graph, cost: CostModel, outputs: Optional[Sequence[Fetch]] = None,
                 constraints: Constraints = Constraints(), devices: Optional[Sequence[str]] = None):
        self.graph = graph
        self.cost = cost
        self.constraints = constraints
        self.devices: List[str] = list(devices or cost.devices)
        unknown = [d for d in self.devices if d not in cost.profiles]
        if unknown:
            raise PlacementError(f"devices {unknown} have no profile in the cost model")
        self.outputs: List[Union[Tensor, Node]] = resolve_outputs(graph, outputs)
        self.edge = self.devices.index(cost.edge) if cost.edge in self.devices else None
        self.return_to = self.role(constraints.outputs_to)
        self.forced: List[Forced] = []
        self._collect_nodes()
        self._collect_flows()
        self._apply_constraints()
        self.budget = self._budget()

    # ---- which nodes -------------------------------------------------------------------------
    def _collect_nodes(self) -> None:
        everything = needed_nodes(self.outputs)
        self.consts: List[Node] = [n for n in everything if replicable(n)]
        const_set = set(self.consts)
        self.nodes: List[Node] = [n for n in everything if n not in const_set]
        self.index: Dict[Node, int] = {n: i for i, n in enumerate(self.nodes)}
        # bytes a node keeps resident where it runs: its outputs (weights, for variables)
        self.node_memory = np.array([sum(self.cost.tensor_bytes(t) for t in n.outputs) for n in self.nodes],
                                    dtype=np.float64)
        # priced as the Session runs them: after its passes (fusion, folding), see executed.py
        self.roles = self.cost.roles(everything, self.outputs)
        self.times = np.array([[self.cost.run_time(n, d, self.roles) for d in self.devices] for n in self.nodes],
                              dtype=np.float64).reshape(len(self.nodes), len(self.devices))
        # what each node's edge kernel adds with its weights from memory (a part's price: plan.part_seconds)
        self.streamed = np.array([0.0 if self.edge is None else
                                  self.cost.streamed_extra(n, self.devices[self.edge], self.roles) for n in self.nodes],
                                 dtype=np.float64)

    def _collect_flows(self) -> None:
        idx = self.index
        readers: Dict[Tensor, List[int]] = {}
        ctrl_readers: Dict[Node, List[int]] = {}
        const_readers: Dict[Node, List[int]] = {c: [] for c in self.consts}
        for n in self.nodes:
            i = idx[n]
            for k, t in enumerate(n.inputs):
                if k in n.opdef.ref_inputs:
                    continue  # a reference: colocated, nothing crosses
                if t.node in const_readers:
                    const_readers[t.node].append(i)
                else:
                    readers.setdefault(t, []).append(i)
            for c in n.control_inputs:
                if c in idx:
                    ctrl_readers.setdefault(c, []).append(i)
        outs = {f for f in self.outputs if isinstance(f, Tensor)}
        self.flows: List[Flow] = []
        for n in self.nodes:
            for t in n.outputs:
                cons = tuple(sorted(set(readers.get(t, ()))))
                if cons or t in outs:
                    self.flows.append(Flow(t, idx[n], cons, t in outs, self.cost.tensor_bytes(t), t.name))
            if n in ctrl_readers:
                self.flows.append(Flow(None, idx[n], tuple(sorted(set(ctrl_readers[n]))), False,
                                       TOKEN_BYTES, "^" + n.name))
        D = len(self.devices)
        for f in self.flows:
            f.times = np.array([[self.cost.transfer_time(f.nbytes, a, b) for b in self.devices]
                                for a in self.devices]).reshape(D, D)
        self.const_readers = {c: tuple(sorted(set(r))) for c, r in const_readers.items()}
        self.const_bytes = {c: self.cost.tensor_bytes(c.outputs[0]) for c in self.consts}
        # outputs that are constants are read by the device they are returned to
        self.const_outputs = {t.node for t in outs if t.node in const_readers}

    # ---- constraints ---------------------------------------------------------------------------
    def _apply_constraints(self) -> None:
        n, D = len(self.nodes), len(self.devices)
        allowed = np.ones((n, D), dtype=bool)
        for i, node in enumerate(self.nodes):
            ok = np.array([self.cost.supports(d, node) for d in self.devices])
            if not ok.all():
                if not ok.any():
                    raise PlacementError(f"node '{node.name}' ({node.op}): no device in the plan supports it")
                allowed[i] &= ok
                no = [d for d, y in zip(self.devices, ok) if not y]
                self._force(node, allowed[i], f"{node.op} is not supported on {', '.join(map(_short, no))}")
            pin = node.device if self.constraints.respect_pins else None
            if pin:
                match = np.array([_pin_matches(pin, d) for d in self.devices])
                if not match.any():
                    self._force(node, allowed[i], f"pinned to '{pin}', which matches no device here: pin ignored")
                elif not (allowed[i] & match).any():
                    raise PlacementError(f"node '{node.name}' ({node.op}) is pinned to '{pin}', "
                                         f"which does not support {node.op}")
                else:
                    allowed[i] &= match
            elif node.op == "Placeholder" and self.constraints.inputs_on is not None:
                d = self.role(self.constraints.inputs_on)
                allowed[i] = False
                allowed[i, d] = True
        self.group = self._groups()
        sizes = np.bincount(self.group, minlength=n)
        for root in np.flatnonzero(sizes > 1):  # single nodes keep their own row
            members = np.flatnonzero(self.group == root)
            both = allowed[members].all(axis=0)
            if not both.any():
                names = ", ".join(f"'{self.nodes[m].name}'" for m in members)
                raise PlacementError(f"nodes {names} must share a device (a variable and its updates, or "
                                     "an opaque value), but their pins and supported ops leave none in common")
            if not (allowed[members] == both).all():
                for m in members:
                    if not (allowed[m] == both).all():
                        self._force(self.nodes[m], both, "colocated with the rest of its group "
                                    f"({len(members)} nodes sharing a variable or an opaque value)")
            allowed[members] = both
        self.allowed = allowed

    def _groups(self) -> np.ndarray:
        """Each node's group root (the group's smallest index): colocation.py's rule."""
        group = np.arange(len(self.nodes), dtype=np.int64)
        for members in colocation_groups(self.nodes).values():
            ids = [self.index[m] for m in members]
            group[ids] = min(ids)
        return group

    def _force(self, node: Node, allowed_row: np.ndarray, reason: str) -> None:
        where = tuple(d for d, y in zip(self.devices, allowed_row) if y)
        self.forced.append(Forced(node.name, node.op, where, reason))

    def role(self, role: Optional[str]) -> Optional[int]:
        """The index of a device named by role ('edge', 'cloud') or by name; None for None."""
        if role is None:
            return None
        if role == "edge":
            if self.edge is None:
                raise PlacementError("constraint names the edge, but the plan has no edge device")
            return self.edge
        if role == "cloud":
            for i, d in enumerate(self.devices):
                if i != self.edge:
                    return i
            raise PlacementError("constraint names the cloud, but the plan has only the edge")
        if role in self.devices:
            return self.devices.index(role)
        raise PlacementError(f"unknown device {role!r}; devices: {self.devices}")

    def _budget(self) -> Optional[float]:
        b = self.constraints.edge_memory_budget
        if b == "profile":
            b = self.cost.profiles[self.cost.edge].memory_budget if self.edge is not None else None
        return None if b is None else float(b)

    # ---- evaluating placements ----------------------------------------------------------------

    def assignment(self, placement: Mapping[str, str]) -> np.ndarray:
        """Device indices, one per node of the problem, read from a placement."""
        out = np.empty(len(self.nodes), dtype=np.int64)
        for i, n in enumerate(self.nodes):
            d = placement.get(n.name)
            if d is None:
                raise PlacementError(f"node '{n.name}' ({n.op}) has no device in the placement")
            if d not in self.devices:
                raise PlacementError(f"node '{n.name}' is placed on unknown device {d!r}; devices: {self.devices}")
            out[i] = self.devices.index(d)
        return out

    def placement(self, assign: Sequence[int]) -> Placement:
        """The placement (node name -> device) of device indices; constants go with a reader."""
        p = {n.name: self.devices[int(a)] for n, a in zip(self.nodes, assign)}
        for c in self.consts:
            r = self.const_readers[c]
            p[c.name] = self.devices[int(assign[r[0]])] if r else self.devices[self.return_to or 0]
        return p

    def total(self, assign: np.ndarray):
        """Predicted step latency of assignments [k, n] (an array), or of one assignment [n] (a float)."""
        a = np.atleast_2d(np.asarray(assign, dtype=np.int64))
        k, n = a.shape
        total = self.times[np.arange(n)[None, :], a].sum(axis=1) if n else np.zeros(k)
        for f in self.flows:
            src = a[:, f.producer]
            for d in range(len(self.devices)):
                need = (a[:, list(f.consumers)] == d).any(axis=1) if f.consumers else np.zeros(k, bool)
                if f.is_output and self.return_to == d:
                    need = np.ones(k, bool)
                need &= src != d
                total = total + np.where(need, f.times[src, d], 0.0)
        return total if np.ndim(assign) == 2 else float(total[0])

    def breakdown(self, assign: Sequence[int]) -> "Breakdown":
        """What one assignment costs, item by item (the same sum as `total`)."""
        a = np.asarray(assign, dtype=np.int64)
        compute = {d: 0.0 for d in self.devices}
        for i, dev in enumerate(a):
            compute[self.devices[dev]] += float(self.times[i, dev])
        moves = []
        for f in self.flows:
            src = a[f.producer]
            dests = {int(a[c]) for c in f.consumers}
            if f.is_output and self.return_to is not None:
                dests.add(self.return_to)
            for d in sorted(dests - {src}):
                moves.append(Move(f.name, self.devices[src], self.devices[d], f.nbytes, float(f.times[src, d])))
        return Breakdown(compute, moves)

    def feasible(self, assign: np.ndarray) -> np.ndarray:
        """Which assignments [k, n] respect the allowed devices, the groups and the memory budget."""
        a = np.atleast_2d(np.asarray(assign, dtype=np.int64))
        n = a.shape[1]
        ok = self.allowed[np.arange(n)[None, :], a].all(axis=1)
        ok &= (a == a[:, self.group]).all(axis=1)
        if self.budget is not None and self.edge is not None:
            ok &= self.edge_memory(a) <= self.budget
        return ok

    def edge_memory(self, assign: np.ndarray) -> np.ndarray:
        a = np.atleast_2d(np.asarray(assign, dtype=np.int64))
        on_edge = a == self.edge
        mem = (on_edge * self.node_memory[None, :]).sum(axis=1)
        for c, readers in self.const_readers.items():
            read = on_edge[:, list(readers)].any(axis=1) if readers else np.zeros(len(a), bool)
            if c in self.const_outputs and self.return_to == self.edge:
                read |= True
            mem = mem + read * self.const_bytes[c]
        return mem


def needed_nodes(outputs: Sequence[Union[Tensor, Node]]) -> List[Node]:
    """The nodes that computing `outputs` runs, and the variables their updates name; in order."""
    needed = prune([f.node if isinstance(f, Tensor) else f for f in outputs], set())
    refs = {v for n in needed for v in updated_variables(n)}  # also those a cond/while body updates
    return sorted(set(needed) | refs, key=lambda n: n.index)


def replicable(n: Node) -> bool:
    """A constant is copied into every part that reads it, instead of crossing devices."""
    return n.op == "Const" and not n.control_inputs


def _pin_matches(pin: str, device: str) -> bool:
    p, d = DeviceSpec.parse(pin), DeviceSpec.parse(device)
    return all(getattr(p, f) is None or getattr(p, f) == getattr(d, f) for f in ("job", "task", "kind", "index"))


def _short(device: str) -> str:
    s = DeviceSpec.parse(device)
    return s.job or device


def resolve_outputs(graph: Graph, outputs: Optional[Iterable[Fetch]]) -> List[Union[Tensor, Node]]:
    if outputs is None:  # the graph's sinks: nodes nobody reads
        read = {t.node for n in graph.nodes for t in n.inputs} | {c for n in graph.nodes for c in n.control_inputs}
        out: List[Union[Tensor, Node]] = []
        for n in graph.nodes:
            if n not in read:
                out.extend(n.outputs) if n.outputs else out.append(n)
        return out
    res = []
    for f in outputs:
        if isinstance(f, str):
            f = graph.tensor(f) if ":" in f else graph.node(f)
            if isinstance(f, Node) and len(f.outputs) == 1:
                f = f.outputs[0]
        elif hasattr(f, "_as_tensor") and not isinstance(f, Tensor):
            f = f._as_tensor()
        if not isinstance(f, (Tensor, Node)) or f.graph is not graph:
            raise PlacementError(f"output {f!r} is not a tensor or node of this graph")
        res.append(f)
    return res
