"""Measured node times: price a graph by timing its own kernels on the device (profile-guided).

A profile's regression predicts any graph from single-op measurements; when the graph to split
is known and its kernels can be run on the device (the edge interpreter on the phone, the
cloud's Session), their measured times predict its parts more closely still. What runs is the
graph after the passes: a fused kernel (product + bias + activation) is one measurement, named
after the last node of its group (as core fusion and the edge exporter name it). This module
shares each measured kernel's time among the original nodes it runs, in proportion to what the
cost model prices them at, so that any placement's part sums to what its kernels took:

    times = node_times_from_kernels(cost, graph, [y], {"block1/depthwise/Relu6": 1.8e-3, ...})
    cost = CostModel(profiles, link, node_times={EDGE_DEVICE: times})

Nodes no measurement covers keep the profile's regression.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Sequence

from ..core.graph import Graph, Node
from .costmodel import CostModel
from .executed import ABSORBED, FREE
from .problem import needed_nodes, resolve_outputs


def kernel_groups(cost: CostModel, graph: Graph, outputs: Sequence) -> Dict[str, List[Node]]:
    """Executed kernel name -> the original nodes it runs (a fused kernel: its product and the
    steps absorbed into it; any other kernel: itself). Free nodes (folded, merged) run nowhere."""
    outs = resolve_outputs(graph, outputs)
    nodes = needed_nodes(outs)
    roles = cost.roles(nodes, outs)
    absorbed_into: Dict[Node, Node] = {}
    for n in nodes:  # a fused group ends at an absorbed node no other absorbed node reads through inputs[0]
        if roles.of(n) == ABSORBED and n.inputs:
            absorbed_into[n] = n.inputs[0].node
    has_absorbed_reader = set(absorbed_into.values())
    groups: Dict[str, List[Node]] = {}
    for n in nodes:
        role = roles.of(n)
        if role == FREE or n in has_absorbed_reader:
            continue
        members = [n]
        cur = n
        while cur in absorbed_into:
            cur = absorbed_into[cur]
            members.append(cur)
        groups[n.name] = members
    return groups


def node_times_from_kernels(cost: CostModel, graph: Graph, outputs: Sequence, kernel_seconds: Mapping[str, float],
                            device: str = None, scale: float = 1.0) -> Dict[str, float]:
    """Seconds per original node from seconds per executed kernel (named as kernel_groups names
    them), each kernel's time shared among its group by the cost model's prices on `device`
    (default: the edge), times `scale` (an emulated slowdown). Kernel names that the graph does
    not run are an error naming them: a timing of another graph would mislead the plan."""
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    device = device or cost.edge
    groups = kernel_groups(cost, graph, outputs)
    kernel_seconds = _attach_quantize_steps(kernel_seconds, groups)
    unknown = sorted(set(kernel_seconds) - set(groups))
    if unknown:
        raise ValueError(f"measured kernels {unknown[:5]}{' ...' if len(unknown) > 5 else ''} are not kernels of "
                         f"this graph after its passes (known: {sorted(groups)[:5]} ...)")
    roles = cost.roles(needed_nodes(resolve_outputs(graph, outputs)), resolve_outputs(graph, outputs))
    out: Dict[str, float] = {}
    for name, seconds in kernel_seconds.items():
        if not (0 <= seconds < float("inf")):
            raise ValueError(f"kernel '{name}': {seconds!r} is not a time in seconds")
        members = groups[name]
        prices = [cost.model_time(m, device, roles) for m in members]
        total = sum(prices)
        for m, p in zip(members, prices):
            share = p / total if total > 0 else 1.0 / len(members)
            out[m.name] = scale * seconds * share
    return out


def _attach_quantize_steps(kernel_seconds: Mapping[str, float], groups) -> Dict[str, float]:
    """An int8 edge model quantizes its inputs and dequantizes its outputs in steps of their own,
    named '<tensor>/quant' and '<tensor>/dequant' (converters/quantize): their time joins the
    kernel (or the placeholder) whose tensor they convert."""
    out: Dict[str, float] = {}
    for name, s in kernel_seconds.items():
        base, _, suffix = name.rpartition("/")
        if name not in groups and suffix in ("quant", "dequant") and base.split(":")[0] in groups:
            name = base.split(":")[0]
        out[name] = out.get(name, 0.0) + s
    return out


__all__ = ["kernel_groups", "node_times_from_kernels"]
