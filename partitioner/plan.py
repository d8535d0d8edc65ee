"""Split plans: a placement with its predicted cost, able to explain itself; and the adaptive
choice among plans precomputed for a range of bandwidths."""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ..core.graph import Graph
from .costmodel import CostModel
from ..wire.link import LinkModel
from .partition import Partition, partition
from .placement import solve_exhaustive, solve_greedy, solve_layer_split, solve_mincut, solve_preferring
from .problem import Breakdown, Constraints, Fetch, Forced, Move, Placement, PlacementError, Problem

ALGORITHMS: Dict[str, Callable[[Problem], np.ndarray]] = {
    "mincut": solve_mincut,
    "greedy": solve_greedy,
    "exhaustive": solve_exhaustive,
    "layer_split": solve_layer_split,
    "edge_only": lambda p: solve_preferring(p, p.edge),
    "cloud_only": lambda p: solve_preferring(p, p.role("cloud")),
}


@dataclass
class SplitPlan:
    algorithm: str
    placement: Placement
    link: LinkModel
    predicted: Breakdown
    baselines: Dict[str, Breakdown]     # edge_only, cloud_only
    forced: List[Forced]
    problem: Problem = field(repr=False)
    client_s: float = 0.0               # of predicted.compute on the edge: the client's own work (client_cost.py)

    @property
    def total(self) -> float:
        return self.predicted.total

    def predict(self, link: LinkModel) -> float:
        """This placement's predicted latency over another link, in O(1)."""
        return link_terms(self.predicted, self.problem.cost.edge, self.problem.cost.client.byte_s).at(link)

    def partition(self) -> Partition:
        p = self.problem
        ret = p.devices[p.return_to] if p.return_to is not None else None
        return partition(p.graph, self.placement, p.outputs, return_to=ret)

    def explain(self) -> str:
        p = self.problem
        short = {d: _role(d, p.cost.edge) for d in p.devices}
        if len(set(short.values())) < len(short):  # several devices of one job: name them in full
            short = {d: "edge" if d == p.cost.edge else d for d in p.devices}
        lines = [f"split plan ({self.algorithm}) for {len(p.nodes)} nodes; link {self.link}; "
                 f"batch {p.cost.batch_size}"]
        lines.append("placement:")
        for d in p.devices:
            names = [n.name for n in p.nodes if self.placement[n.name] == d]
            if names:
                shown = ", ".join(names[:12]) + (f", ... ({len(names) - 12} more)" if len(names) > 12 else "")
                lines.append(f"  {short[d]:<6} {d}: {len(names)} nodes: {shown}")
        lines.append("predicted latency:")
        edge = p.cost.edge
        part_s = 0.0
        if p.edge is not None:
            a = p.assignment(self.placement)
            part_s = part_seconds(p, a, self.predicted, p.breakdown(a).compute.get(edge, 0.0) + self.client_s)
        rows = [(f"compute on {short[d]}", s - (self.client_s + part_s if d == edge else 0.0))
                for d, s in self.predicted.compute.items() if s > 0]
        if part_s > 0:
            rows.append((f"edge part on {short[edge]} beyond its kernels (invoke, boundary bytes, weights from memory, "
                         "cold caches)", part_s))
        if self.client_s > 0:
            rows.append((f"client on {short[edge]} (request, part, calls, bytes)", self.client_s))
        rows += [(f"transfer {m.tensor} {short[m.src]}->{short[m.dst]} ({_bytes(m.nbytes)})", m.seconds)
                 for m in self.predicted.moves]
        rows.append(("total", self.total))
        width = max(len(r[0]) for r in rows)
        lines += [f"  {label:<{width}} {_ms(sec)}" for label, sec in rows]
        alts = {k: b.total for k, b in self.baselines.items()}
        lines.append("alternatives: " + ", ".join(f"{k} {_ms(v).strip()}" for k, v in alts.items()))
        if alts and self.total > 0:
            name, best = min(alts.items(), key=lambda kv: kv[1])
            if self.total < best * (1 - 1e-9):
                lines.append(f"  the split is {best / self.total:.3g}x faster than the best of them ({name})")
            else:
                lines.append(f"  the split is no faster than {name}: running that way is the best plan")
        for f in self.forced:
            lines.append(f"constraint: '{f.node}' ({f.op}) only on {', '.join(short[d] for d in f.devices)}: {f.reason}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()


def plan_split(graph: Graph, cost: CostModel, outputs: Optional[Sequence[Fetch]] = None,
               constraints: Constraints = Constraints(), algorithm: str = "mincut",
               problem: Optional[Problem] = None) -> SplitPlan:
    """Place `graph` (the part computing `outputs`) and predict what the placement costs."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown placement algorithm {algorithm!r}; known: {sorted(ALGORITHMS)}")
    p = problem or Problem(graph, cost, outputs, constraints)
    assign = ALGORITHMS[algorithm](p)
    baselines, assigns = {}, {}
    if p.edge is not None and len(p.devices) > 1:
        for name in ("edge_only", "cloud_only"):
            assigns[name] = ALGORITHMS[name](p)
            baselines[name] = priced(p, assigns[name])[0]
    predicted, client_s = priced(p, assign)
    if algorithm == "mincut" and baselines:
        # the client's fixed costs are no s-t cut: every split pays them all (a part on each side,
        # one call), so the min cut is the best split, and only running all on one side can beat it
        name = min(baselines, key=lambda k: baselines[k].total)
        if baselines[name].total < predicted.total * (1 - 1e-12):
            assign = assigns[name]
            predicted, client_s = priced(p, assign)
    return SplitPlan(algorithm, p.placement(assign), p.cost.link, predicted, baselines, list(p.forced), p, client_s)


_NO_WORK = ("Placeholder", "Const", "Constant", "NoOp")


def priced(p: Problem, assign) -> "tuple[Breakdown, float]":
    """The assignment's breakdown with the client's own cost (CostModel.client) added to the edge's
    compute, and that cost: per request, per edge part (when an op with work runs on the edge), per
    remote call (one per request when anything runs off the edge). Its per-byte term is already in
    the edge transfers (CostModel.transfer_time). The edge part's own cost beyond its kernels (the
    edge profile's `part`, part_cost.py) joins the edge's compute too, not the returned client cost."""
    b = p.breakdown(assign)
    if p.edge is None:
        return b, 0.0
    b.moves = one_latency_each_way(b.moves, p.devices[p.edge], p.cost.link)
    a = np.asarray(assign)
    edge_part = any(a[i] == p.edge and n.op not in _NO_WORK for i, n in enumerate(p.nodes))
    calls = int(bool((a != p.edge).any()))
    c = p.cost.client.seconds(edge_part, calls, 0.0)
    edge = p.devices[p.edge]
    b.compute[edge] = b.compute.get(edge, 0.0) + c + part_seconds(p, a, b, b.compute.get(edge, 0.0) + c)
    return b, c


def one_latency_each_way(moves: List[Move], edge: str, link: LinkModel) -> List[Move]:
    """The moves with the link's latency (RTT / 2 + the call's cost / 2 each way) paid once per
    direction: the offload client sends every tensor of a cut in one call and gets every answer in
    its response, so a cut of three tensors pays one round trip, not three halves each way (the
    min cut's edges price each tensor's half round trip; this is what a plan costs once chosen)."""
    out, seen = [], set()
    for m in moves:
        way = "up" if m.src == edge else "down" if m.dst == edge else None
        if way is not None and way in seen:
            m = replace(m, seconds=max(m.seconds - link.latency_s / 2, 0.0))
        seen.add(way)
        out.append(m)
    return out


def part_seconds(p: Problem, assign: np.ndarray, b: Breakdown, edge_s: float) -> float:
    """The edge part's cost beyond its kernels (DeviceProfile.part): one run of the edge's interpreter
    per request (whatever the plan: a cloud-only plan's part still takes the inputs and sends them),
    and the bytes crossing its boundary: the inputs placed there, the tensors it computed and sends,
    those it receives, the outputs it returns (apps/part_measure.py counts the same); and the weights
    its products read beyond what the edge's cache holds (weights_from_memory). A part's
    whole weights decide that, so the min cut's per-node prices leave it out; every plan is priced with it.
    And the caches its segments of kernels find cold (PartCost.cold): the first after the idle before
    the request (PartCost.sleep_ratio x the request's edge time, `edge_s` with these terms), each
    after a remote call after the call (its transfers and the cloud's compute). That is a price per
    plan, not per node, and the same for every split with one call, so the min cut leaves it out too."""
    edge = p.devices[p.edge]
    stream = weights_from_memory(p, assign)
    part = p.cost.profiles[edge].part
    if part is None:
        return stream
    inputs = {f.name: f.nbytes for f in p.flows if p.nodes[f.producer].op == "Placeholder" and assign[f.producer] == p.edge}
    nbytes = sum(inputs.values())
    nbytes += sum(m.nbytes for m in b.moves if (m.src == edge and m.tensor not in inputs) or m.dst == edge)
    if p.return_to == p.edge:
        nbytes += sum(f.nbytes for f in p.flows if f.is_output)
    fixed = part.seconds(1, nbytes) + stream
    return fixed + cold_seconds(p, assign, b, part, edge_s + fixed)


def weights_from_memory(p: Problem, assign: np.ndarray) -> float:
    """Seconds the edge part's kernels lose to weights read from memory: as far as the part's weights
    exceed the edge's cache (DeviceProfile.weight_fraction), the extra of each of its weight-bound
    kernels (Problem.streamed), and the older whole-part measure (DeviceProfile.weight_streaming)."""
    prof = p.cost.profiles[p.devices[p.edge]]
    w = edge_weights(p, assign)
    frac = prof.weight_fraction(w)
    mine = np.asarray(assign) == p.edge
    return prof.weight_streaming(w) + (frac * float(p.streamed[mine].sum()) if frac > 0.0 else 0.0)


def cold_seconds(p: Problem, assign: np.ndarray, b: Breakdown, part, edge_s: float) -> float:
    """What the edge's segments of work pay for cold caches (PartCost.cold): the request's first after
    the idle before the request (of kernels when the edge runs one before any call, with the part's
    weights, else of moving tensors: the inputs sent), and, in a plan with a call, the one after it,
    after the call (of kernels when an edge kernel reads what the cloud computed, else of taking the
    answer; its weights counted with the first segment's, which idled the longer)."""
    if part.cold_s == 0.0 and part.cold_io_s == 0.0 and part.cold_w_s == 0.0:
        return 0.0
    a = np.asarray(assign)
    works = [bool(a[i] == p.edge) and n.op not in _NO_WORK for i, n in enumerate(p.nodes)]
    later = [bool(x != p.edge) for x in a]  # off the edge, or reading what came back from it
    for f in sorted(p.flows, key=lambda f: f.producer):  # nodes are in run order
        if later[f.producer]:
            for c in f.consumers:
                later[c] = True
    first = any(w and not x for w, x in zip(works, later))
    after_call = any(w and x for w, x in zip(works, later))
    edge = p.devices[p.edge]
    cold = part.cold(part.sleep_ratio * edge_s, kernels=first,
                     weights=edge_weights(p, assign) if first and part.cold_w_s else 0.0)
    if any(later):  # a call: its answer comes back after the link and the cloud's compute
        call_s = sum(m.seconds for m in b.moves) + sum(v for d, v in b.compute.items() if d != edge)
        cold += part.cold(call_s, kernels=after_call)
    return cold


WEIGHT_OPS = ("MatMul", "FusedMatMul", "Conv2D", "FusedConv2D")  # what reads a weight per request


def edge_weights(p: Problem, assign: np.ndarray) -> int:
    """Elements of the constants that the edge part's products read (their weights and biases): what
    the edge keeps in its cache between requests, or streams from memory (DeviceProfile.weight_streaming)."""
    total = 0
    for c, readers in p.const_readers.items():
        if any(assign[i] == p.edge and p.nodes[i].op in WEIGHT_OPS for i in readers):
            total += int(np.prod(c.outputs[0].shape))
    return total


# ---- adaptive choice ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LinkTerms:
    """A plan's latency as a function of the link: fixed + bits up / up_bandwidth_bps + bits down / down_bandwidth_bps + rtt terms."""
    fixed: float
    up_bits: float
    n_up: int
    down_bits: float
    n_down: int

    def at(self, link: LinkModel) -> float:
        return (self.fixed + self.up_bits / link.up_bandwidth_bps + self.down_bits / link.down_bandwidth_bps
                + (self.n_up + self.n_down) * link.latency_s / 2)


def link_terms(b: Breakdown, edge: Optional[str], byte_s: float = 0.0) -> LinkTerms:
    """`byte_s`: the client's time per byte across the cut (ClientCost.byte_s), whatever the link."""
    fixed = sum(b.compute.values())
    ub = db = 0.0
    nu = nd = 0
    for m in b.moves:
        if m.src == edge:
            ub, nu, fixed = ub + 8.0 * m.nbytes, 1, fixed + byte_s * m.nbytes
        elif m.dst == edge:
            db, nd, fixed = db + 8.0 * m.nbytes, 1, fixed + byte_s * m.nbytes
        else:
            fixed += m.seconds
    return LinkTerms(fixed, ub, nu, db, nd)  # one latency each way (one_latency_each_way)


class AdaptivePlanner:
    """Plans precomputed over a range of uplink bandwidths (the downlink keeping its ratio);
    `choose(link)` finds the measured bandwidth's neighbours by bisection and returns the
    better of their two plans over that link: O(log n) in the number of plans."""

    def __init__(self, graph: Graph, cost: CostModel, outputs: Optional[Sequence[Fetch]] = None,
                 constraints: Constraints = Constraints(), algorithm: str = "mincut",
                 bandwidths: Sequence[float] = tuple(np.logspace(5, 9, 41))):
        bws = sorted(float(b) for b in bandwidths)
        if not bws:
            raise ValueError("AdaptivePlanner needs at least one bandwidth")
        self.bandwidths: List[float] = bws
        self.plans: List[SplitPlan] = []
        problems = []
        for bw in bws:
            c = cost.with_link(cost.link.with_uplink(bw))
            problems.append(Problem(graph, c, outputs, constraints))
            self.plans.append(plan_split(graph, c, outputs, constraints, algorithm, problem=problems[-1]))
        self._terms = [link_terms(p.predicted, cost.edge, cost.client.byte_s) for p in self.plans]
        self._best_of_all(problems)

    def _best_of_all(self, problems: List[Problem]) -> None:
        """At each bandwidth, the best of all the plans found: a min cut prices half a round trip per
        tensor each way, a chosen plan one each way (one call: one_latency_each_way), so a cut of
        several tensors found at one bandwidth can beat, at another, the cut found there."""
        terms = list(self._terms)
        for i, (p, plan) in enumerate(zip(problems, list(self.plans))):
            j = min(range(len(terms)), key=lambda j: (terms[j].at(p.cost.link), j))
            if terms[j].at(p.cost.link) < terms[i].at(p.cost.link) * (1 - 1e-12):
                predicted, client_s = priced(p, p.assignment(self.plans[j].placement))
                self.plans[i] = SplitPlan(plan.algorithm, dict(self.plans[j].placement), p.cost.link, predicted,
                                          plan.baselines, plan.forced, p, client_s)
                self._terms[i] = link_terms(predicted, p.cost.edge, p.cost.client.byte_s)

    def choose(self, link: LinkModel) -> SplitPlan:
        i = bisect.bisect_left(self.bandwidths, link.up_bandwidth_bps)
        cands = {max(i - 1, 0), min(i, len(self.plans) - 1)}
        best = min(cands, key=lambda j: (self._terms[j].at(link), j))
        return self.plans[best]

    def distinct(self) -> List[SplitPlan]:
        """The plans that differ from their lower-bandwidth neighbour (the breakpoints)."""
        out = []
        for p in self.plans:
            if not out or p.placement != out[-1].placement:
                out.append(p)
        return out


def _role(device: str, edge: Optional[str]) -> str:
    if device == edge:
        return "edge"
    job = device.split("/job:")[1].split("/")[0] if "/job:" in device else device
    return job


def _ms(s: float) -> str:
    return f"{s * 1e3:10.3f} ms"


def _bytes(n: float) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n:.0f} B"


__all__ = ["SplitPlan", "plan_split", "AdaptivePlanner", "ALGORITHMS", "PlacementError"]
