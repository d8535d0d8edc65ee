"""Placement algorithms. Each returns a placement: a plain dict node name -> device name.

- place_mincut: the exact minimum of the edge/cloud latency objective (problem.py) on any
  DAG, as a minimum s-t cut (DADS, 2019). s is the edge, t the cloud; a node costs its
  cloud time when cut to the cloud side and its edge time when on the edge side. A tensor
  read by several nodes on the other side is paid once: an auxiliary vertex per tensor
  (producer -> aux priced by the upload, aux -> each reader infinite; readers -> aux'
  infinite, aux' -> producer priced by the download).
- place_greedy: the whitepaper's simulated placer: nodes in topological order, each on the
  device where it would finish earliest, transfers included; any number of devices.
- place_exhaustive: every assignment, for small graphs (the oracle of the tests).
- place_layer_split: the best single split point in topological order (Neurosurgeon's space).
- edge_only / cloud_only: the baselines.
"""
from __future__ import annotations

import itertools
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from ..core.graph import Graph
from .costmodel import CostModel
from .problem import Constraints, Fetch, Placement, PlacementError, Problem

_INT_RANGE = 1 << 28   # finite capacities are scaled so that their sum fits here
_INF = 1 << 30         # scipy's max flow takes int32 capacities


def _problem(g: Union[Graph, Problem], cost: Optional[CostModel], outputs, constraints) -> Problem:
    if isinstance(g, Problem):
        return g
    if cost is None:
        raise ValueError("place_* needs a cost model (or a Problem)")
    return Problem(g, cost, outputs, constraints)


# ---- min cut ---------------------------------------------------------------------------------
def place_mincut(graph: Union[Graph, Problem], cost: Optional[CostModel] = None,
                 outputs: Optional[Sequence[Fetch]] = None, constraints: Constraints = Constraints()) -> Placement:
    p = _problem(graph, cost, outputs, constraints)
    return p.placement(solve_mincut(p))


def solve_mincut(p: Problem, max_cuts: Optional[int] = None, exhaustive_up_to: int = 16) -> np.ndarray:
    """Device indices minimising p.total within p.allowed, the groups and the edge memory budget.

    Without a binding budget this is one minimum cut, exact. A binding budget makes the problem
    a knapsack-like one (NP-hard in general): with at most `exhaustive_up_to` free choices every
    assignment is tried; otherwise the edge memory gets a price (a Lagrangian multiplier, found by
    bisection) whose cut fits, and a branch and bound over the nodes the price leaves in
    contention, bounded by the Lagrangian dual, proves that cut optimal or finds a better one.
    It is exact when it finishes within `max_cuts` minimum cuts (default: about 200,000 / nodes,
    between 50 and 4,000); past that the best placement found within the budget is returned."""
    if len(p.devices) != 2 or p.edge is None:
        raise PlacementError(f"mincut places on an edge and one cloud device; this problem has {p.devices} "
                             "(use place_greedy for more devices)")
    assign = _cut(p, 0.0)
    if p.budget is None or p.edge_memory(assign)[0] <= p.budget:
        return assign
    roots = np.unique(p.group)
    if int(p.allowed[roots].all(axis=1).sum()) <= exhaustive_up_to:
        return solve_exhaustive(p)
    if max_cuts is None:
        max_cuts = int(np.clip(200_000 // max(1, len(p.nodes)), 50, 4000))
    return _BudgetSearch(p, max_cuts).solve()


def solve_least_edge_memory(p: Problem) -> np.ndarray:
    """The placement of least edge memory the constraints allow (one minimum cut on memory alone):
    the smallest budget that can be met is its edge memory."""
    if len(p.devices) != 2 or p.edge is None:
        raise PlacementError(f"an edge and one cloud device are needed; this problem has {p.devices}")
    return _cut(p, 1.0, time_weight=0.0)


class _BudgetSearch:
    """Branch and bound for the minimum cut under the edge memory budget.

    For any price lam >= 0 on edge memory, the cut minimising total + lam * memory gives the
    lower bound  L(lam) = total(a) + lam * (memory(a) - budget)  on every placement within the
    budget (and within the subproblem's fixings). A subproblem is dropped when its best bound
    reaches the incumbent, solved when its unpriced cut fits, infeasible when even the cut of
    least memory does not fit, and otherwise split on the heaviest node that the cuts just
    below and just above the fitting price place differently."""

    def __init__(self, p: Problem, max_cuts: int):
        self.p = p
        self.cuts_left = max_cuts
        mem_total = float(p.node_memory.sum() + sum(p.const_bytes.values())) or 1.0
        time_total = float(p.times.sum() + sum(f.times.max() for f in p.flows)) or 1.0
        self.price0 = time_total / mem_total
        self.best: Optional[np.ndarray] = None
        self.best_cost = np.inf
        self.tol = 1e-9 * time_total

    def cut(self, allowed: np.ndarray, price: float, time_weight: float = 1.0) -> np.ndarray:
        self.cuts_left -= 1
        return _cut(self.p, price, allowed, time_weight)

    def offer(self, a: np.ndarray) -> None:
        p = self.p
        if p.edge_memory(a)[0] <= p.budget:
            c = p.total(a)
            if c < self.best_cost:
                self.best, self.best_cost = a, c

    def solve(self) -> np.ndarray:
        p = self.p
        least = self.cut(p.allowed, 1.0, time_weight=0.0)  # the least edge memory the constraints allow
        if p.edge_memory(least)[0] > p.budget:
            raise PlacementError(f"the edge memory budget ({p.budget:.0f} bytes) cannot be met: what must run "
                                 f"on the edge (pins, inputs) alone needs {p.edge_memory(least)[0]:.0f} bytes")
        self.offer(least)
        stack = [(p.allowed.copy(), (0.0, self.price0), 12)]
        while stack and self.cuts_left > 0:
            allowed, prices, steps = stack.pop()
            split = self.bound(allowed, prices, steps)
            if split is None:
                continue
            i, first, prices = split
            for side in (1 - first, first):  # the child explored first goes on the stack last
                child = allowed.copy()
                members = p.group == p.group[i]
                child[members, 1 - side] = False
                if child[members].any(axis=1).all():
                    stack.append((child, prices, 5))  # a child's price is near its parent's
        return self.best

    def bound(self, allowed: np.ndarray, prices: Tuple[float, float], steps: int
              ) -> Optional[Tuple[int, int, Tuple[float, float]]]:
        """Bound the subproblem, searching prices from the bracket `prices` with `steps` bisections;
        (node, the side to try first, the final bracket) to split on, or None when it is done."""
        p = self.p
        B = p.budget

        def lagrangian(price: float):
            a = self.cut(allowed, price)
            mem = p.edge_memory(a)[0]
            self.offer(a)
            return a, mem, p.total(a) + price * (mem - B)

        a0, mem0, bound = lagrangian(0.0)
        if mem0 <= B:
            return None  # the unpriced cut fits: optimal for this subproblem
        if bound >= self.best_cost - self.tol:
            return None
        least = self.cut(allowed, 1.0, time_weight=0.0)
        if p.edge_memory(least)[0] > B:
            return None  # nothing in this subproblem fits
        lo, hi, a_lo, a_hi = 0.0, prices[1], a0, None
        if prices[0] > 0:  # where the parent's price crossed the budget
            a, mem, lb = lagrangian(prices[0])
            bound = max(bound, lb)
            if mem <= B:
                hi, a_hi = prices[0], a
            else:
                lo, a_lo = prices[0], a
        for _ in range(40 if a_hi is None else 0):  # a price whose cut fits
            a, mem, lb = lagrangian(hi)
            bound = max(bound, lb)
            if mem <= B:
                a_hi = a
                break
            lo, a_lo, hi = hi, a, hi * 4
        if a_hi is None:
            a_hi = least
        for _ in range(steps):  # narrow the price; every cut tightens the bound or the incumbent
            if bound >= self.best_cost - self.tol or self.cuts_left <= 0:
                return None
            mid = (lo + hi) / 2
            a, mem, lb = lagrangian(mid)
            bound = max(bound, lb)
            if mem <= B:
                hi, a_hi = mid, a
            else:
                lo, a_lo = mid, a
        if bound >= self.best_cost - self.tol:
            return None
        free = allowed.all(axis=1)
        contested = np.flatnonzero(free & (a_lo != a_hi))
        if not len(contested):
            contested = np.flatnonzero(free & (a_lo == p.edge))
        if not len(contested):
            return None
        i = int(contested[np.argmax(p.node_memory[contested] + p.times[contested].max(axis=1) * self.price0)])
        return i, int(a_hi[i]), (lo, hi)


def _cut(p: Problem, mem_price: float, allowed: Optional[np.ndarray] = None, time_weight: float = 1.0) -> np.ndarray:
    """The minimum cut of time_weight * latency + mem_price * edge memory, within `allowed`
    (default p.allowed) and the groups."""
    allowed = p.allowed if allowed is None else allowed
    E = p.edge
    C = 1 - E
    n = len(p.nodes)
    s, t = n, n + 1
    nxt = [n + 2]  # next free vertex id
    rows: List[int] = []
    cols: List[int] = []
    caps: List[float] = []

    def edge(a: int, b: int, c: float) -> None:
        if c > 0:
            rows.append(a)
            cols.append(b)
            caps.append(c)

    def aux() -> int:
        nxt[0] += 1
        return nxt[0] - 1

    inf = float("inf")
    w = time_weight
    for i in range(n):
        edge(s, i, w * p.times[i, C] if allowed[i, C] else 0.0)  # paid when i is on the cloud side
        edge(i, t, w * p.times[i, E] + mem_price * p.node_memory[i])  # paid when i is on the edge side
        if not allowed[i, C]:
            edge(s, i, inf)
        if not allowed[i, E]:
            edge(i, t, inf)
        g = p.group[i]
        if g != i:
            edge(i, g, inf)
            edge(g, i, inf)
    for f in p.flows:
        up, down = w * f.times[E, C], w * f.times[C, E]
        to_cloud = list(f.consumers) + ([t] if f.is_output and p.return_to == C else [])
        to_edge = list(f.consumers) + ([s] if f.is_output and p.return_to == E else [])
        if to_cloud:
            a = aux()
            edge(f.producer, a, up)
            for c in to_cloud:
                edge(a, c, inf)
        if to_edge:
            b = aux()
            edge(b, f.producer, down)
            for c in to_edge:
                edge(c, b, inf)
    if mem_price > 0:
        for c, readers in p.const_readers.items():
            if readers:
                b = aux()
                edge(b, t, mem_price * p.const_bytes[c])
                for r in readers:
                    edge(r, b, inf)
    V = nxt[0]
    cap = np.array(caps, dtype=np.float64)
    finite = np.isfinite(cap)
    total = cap[finite].sum()
    quantum = total / _INT_RANGE if total > 0 else 1.0
    icap = np.where(finite, np.rint(np.where(finite, cap, 0) / quantum), _INF)
    m = sp.coo_matrix((icap, (np.array(rows), np.array(cols))), shape=(V, V)).tocsr()
    m.sum_duplicates()
    np.minimum(m.data, _INF, out=m.data)
    m = sp.csr_matrix((m.data.astype(np.int32), m.indices, m.indptr), shape=(V, V))
    m.eliminate_zeros()
    flow = maximum_flow(m, s, t, method="dinic").flow
    residual = (m - flow).tocsr()
    residual.data[residual.data < 0] = 0
    residual.eliminate_zeros()
    reach = breadth_first_order(residual, s, directed=True, return_predecessors=False)
    side = np.full(V, C, dtype=np.int64)
    side[reach] = E
    return side[:n].copy()


# ---- exhaustive ---------------------------------------------------------------------------------
def place_exhaustive(graph: Union[Graph, Problem], cost: Optional[CostModel] = None,
                     outputs: Optional[Sequence[Fetch]] = None, constraints: Constraints = Constraints(),
                     max_assignments: int = 1 << 20) -> Placement:
    p = _problem(graph, cost, outputs, constraints)
    return p.placement(solve_exhaustive(p, max_assignments))


def solve_exhaustive(p: Problem, max_assignments: int = 1 << 20, chunk: int = 1 << 14) -> np.ndarray:
    """The feasible assignment of least p.total, trying every one (ties: the first)."""
    roots = sorted(set(p.group.tolist()))
    if not roots:
        return np.zeros(0, dtype=np.int64)
    choices = [np.flatnonzero(p.allowed[r]) for r in roots]
    count = int(np.prod([len(c) for c in choices], dtype=np.float64)) if choices else 1
    if count > max_assignments:
        raise PlacementError(f"exhaustive placement would try {count} assignments (limit {max_assignments})")
    col = np.searchsorted(roots, p.group)  # node -> its group's column
    best, best_cost = None, np.inf
    combos = itertools.product(*choices)
    while True:
        block = np.array(list(itertools.islice(combos, chunk)), dtype=np.int64).reshape(-1, len(roots))
        if not len(block):
            break
        assign = block[:, col]
        ok = p.feasible(assign)
        if ok.any():
            costs = np.where(ok, p.total(assign), np.inf)
            j = int(np.argmin(costs))
            if costs[j] < best_cost:
                best, best_cost = assign[j].copy(), costs[j]
    if best is None:
        raise PlacementError("no assignment meets the constraints (memory budget too small?)")
    return best


# ---- greedy (the whitepaper's simulated placer) -----------------------------------------------------
def place_greedy(graph: Union[Graph, Problem], cost: Optional[CostModel] = None,
                 outputs: Optional[Sequence[Fetch]] = None, constraints: Constraints = Constraints()) -> Placement:
    p = _problem(graph, cost, outputs, constraints)
    return p.placement(solve_greedy(p))


def solve_greedy(p: Problem) -> np.ndarray:
    n, D = len(p.nodes), len(p.devices)
    reads: List[List] = [[] for _ in range(n)]     # flows each node waits for
    returned: List[List] = [[] for _ in range(n)]  # its outputs, fetched on the return device
    for f in p.flows:
        for c in f.consumers:
            reads[c].append(f)
        if f.is_output and p.return_to is not None:
            returned[f.producer].append(f)
    assign = np.full(n, -1, dtype=np.int64)
    finish = np.zeros(n)
    free_at = np.zeros(D)
    arrival: Dict[Tuple[int, int], float] = {}  # (flow id, device) -> when the value is there
    group_dev: Dict[int, int] = {}

    def arrives(f, d: int) -> float:
        src = assign[f.producer]
        if src == d:
            return finish[f.producer]
        return arrival.get((id(f), d), finish[f.producer] + f.times[src, d])

    for i in range(n):
        g = p.group[i]
        best = None
        for d in ([group_dev[g]] if g in group_dev else np.flatnonzero(p.allowed[i])):
            end = max([free_at[d]] + [arrives(f, d) for f in reads[i]]) + p.times[i, d]
            home = max((f.times[d, p.return_to] for f in returned[i]), default=0.0)  # answers go home
            key = (end + home, p.times[i, d], end)
            if best is None or key < best[0]:
                best = (key, d)
        d = best[1]
        assign[i], finish[i] = d, best[0][2]
        free_at[d] = finish[i]
        group_dev.setdefault(g, d)
        for f in reads[i]:
            arrival.setdefault((id(f), d), arrives(f, d))
    return assign


# ---- layer split (Neurosurgeon, 2017) -----------------------------------------------------------------
def place_layer_split(graph: Union[Graph, Problem], cost: Optional[CostModel] = None,
                      outputs: Optional[Sequence[Fetch]] = None, constraints: Constraints = Constraints()) -> Placement:
    p = _problem(graph, cost, outputs, constraints)
    return p.placement(solve_layer_split(p))


def solve_layer_split(p: Problem, chunk: int = 256) -> np.ndarray:
    """The best single split point: the first k nodes (in topological order) on the edge, the rest
    on the cloud, for every k; constraints then move what must move. The baseline of layer-wise
    partitioners, which is optimal for chains and not for DAGs."""
    if p.edge is None or len(p.devices) != 2:
        raise PlacementError("a layer split needs an edge and one cloud device")
    E, C = p.edge, 1 - p.edge
    n = len(p.nodes)
    best, best_cost = None, np.inf
    for k0 in range(0, n + 1, chunk):
        ks = np.arange(k0, min(n, k0 + chunk - 1) + 1)
        a = np.where(np.arange(n)[None, :] < ks[:, None], E, C)
        a = np.where(p.allowed[np.arange(n)[None, :], a], a, 1 - a)[:, p.group]
        costs = np.where(p.feasible(a), p.total(a), np.inf)
        j = int(np.argmin(costs))
        if costs[j] < best_cost:
            best, best_cost = a[j].copy(), costs[j]
    if best is None:
        raise PlacementError("no single split point meets the constraints (memory budget too small?)")
    return best


# ---- baselines -------------------------------------------------------------------------------------
def edge_only(graph: Union[Graph, Problem], cost: Optional[CostModel] = None,
              outputs: Optional[Sequence[Fetch]] = None, constraints: Constraints = Constraints()) -> Placement:
    """Everything the edge can run, on the edge (the rest on the cloud, as the constraints force)."""
    p = _problem(graph, cost, outputs, constraints)
    return p.placement(solve_preferring(p, p.edge))


def cloud_only(graph: Union[Graph, Problem], cost: Optional[CostModel] = None,
               outputs: Optional[Sequence[Fetch]] = None, constraints: Constraints = Constraints()) -> Placement:
    """Everything on the cloud but what must stay on the edge (the inputs, where the data lives)."""
    p = _problem(graph, cost, outputs, constraints)
    return p.placement(solve_preferring(p, p.role("cloud")))


def solve_preferring(p: Problem, device: int) -> np.ndarray:
    assign = np.empty(len(p.nodes), dtype=np.int64)
    for i in range(len(p.nodes)):
        ok = p.allowed[i]
        assign[i] = device if ok[device] else int(np.flatnonzero(ok)[0])
    return assign
