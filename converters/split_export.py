"""Package a trained graph and its adaptive split plans into ONE edge model file.

    planner = AdaptivePlanner(graph, cost, [y])                 # partitioner/plan.py
    split = export_split(session, [y], planner, int8=True, calibration=feeds)
    split.save("model.isth")                                    # the edge side
    parts = [cloud_part(split.graph, ins, outs, name)           # the cloud side (cloud/offload_model.py;
             for name, ins, outs in split.cloud_signatures()]   # converters may not import cloud/)
    save_cloud_parts("model.cloud", parts)

The file holds one subgraph per candidate cut (the edge part of that cut; its RemotePart names
the cloud part that runs the rest), plus the whole model as a subgraph for local fallback. The
metadata key "isthmus.split" (JSON; the keys are wire/split_format.py's) lists the cuts in order of bandwidth, each with the uplink
range (bit/s) where the partitioner's adaptive planner finds it best:

    {"version": 1, "model": NAME, "full": SUBGRAPH, "rtt_s": RTT,
     "cuts": [{"name": "cut0", "subgraph": 1, "cloud_part": "cut0" or "",
               "min_bandwidth_bps": 0, "max_bandwidth_bps": 2.4e6,
               "inputs": [wire names...], "outputs": [wire names...], "predicted_s": ...,
               "terms": [fixed_s, up_bits, n_up, down_bits, n_down]}, ...]}

`inputs`/`outputs` name, in RemotePart order, the tensors as the cloud part's signature calls them
(the original graph's tensor names, "node:index"). A cut whose placement keeps everything on the
edge has no cloud part ("cloud_part": "") and points at the full model's subgraph. Weights shared
by several subgraphs are stored once. A placement whose edge part would need the cloud twice
(edge -> cloud -> edge -> cloud) is skipped: the report says so, and its range goes to the best
remaining cut.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

import isthmus.core as ism
from isthmus.core.errors import GraphError
from isthmus.core.executor import prune
from isthmus.core.graph import Graph, Tensor
from isthmus.core.passes import freeze
from isthmus.core.session import Session
from isthmus.edge.loader import EdgeModel, loads
from isthmus.edge.writer import ModelWriter

from isthmus.partitioner.partition import partition
from isthmus.partitioner.plan import link_terms
from isthmus.wire.split_format import MAX_BANDWIDTH_KEY, MIN_BANDWIDTH_KEY, SPLIT_KEY, SPLIT_VERSION

from .edge_export import to_edge
from .quantize import quantize_to_edge


@dataclass
class CutInfo:
    name: str
    subgraph: int
    cloud_part: str
    min_bandwidth_bps: float
    max_bandwidth_bps: float
    inputs: List[str]
    outputs: List[str]
    predicted_s: float
    terms: Tuple[float, float, int, float, int]
    placement: Dict[str, str] = field(repr=False, default_factory=dict)

    def to_json(self) -> dict:
        return {"name": self.name, "subgraph": self.subgraph, "cloud_part": self.cloud_part,
                MIN_BANDWIDTH_KEY: self.min_bandwidth_bps,
                MAX_BANDWIDTH_KEY: None if math.isinf(self.max_bandwidth_bps) else self.max_bandwidth_bps,
                "inputs": self.inputs, "outputs": self.outputs, "predicted_s": self.predicted_s,
                "terms": list(self.terms)}


@dataclass
class SplitExport:
    data: bytes
    cuts: List[CutInfo]
    graph: Graph              # the frozen graph the cuts were made from (the cloud parts' source)
    skipped: List[str]        # why a distinct plan got no cut

    def cloud_signatures(self) -> List[Tuple[str, List[str], List[str]]]:
        """(part name, input wire names, output wire names) of each cut that has a cloud part:
        what cloud/offload_model.cloud_part(split.graph, inputs, outputs, name) builds."""
        return [(c.cloud_part, c.inputs, c.outputs) for c in self.cuts if c.cloud_part]

    def save(self, path: str) -> str:
        with open(path + ".tmp", "wb") as f:
            f.write(self.data)
        os.replace(path + ".tmp", path)
        return path

    def report(self) -> str:
        lines = [f"split model: {len(self.cuts)} cuts, {len(self.data):,} bytes"]
        for c in self.cuts:
            hi = "inf" if math.isinf(c.max_bandwidth_bps) else f"{c.max_bandwidth_bps / 1e6:.3g}"
            lines.append(f"  {c.name}: uplink {c.min_bandwidth_bps / 1e6:.3g}..{hi} Mbit/s -> "
                         + (f"cloud part '{c.cloud_part}' ({', '.join(c.inputs)} up, {', '.join(c.outputs)} down)"
                            if c.cloud_part else "edge only (the full model)"))
        lines += [f"  skipped: {s}" for s in self.skipped]
        return "\n".join(lines)


# ---- standalone parts ------------------------------------------------------------------------------
def _standalone(part, transfers, batch_none: bool = True):
    """A copy of a partition part without Send/Recv: every Recv becomes a placeholder. Returns
    (graph, recv placeholders by wire name, sent tensors by wire name, original outputs by name)."""
    by_recv = {t.recv: t for t in transfers if t.dst == part.device}
    by_send = {t.send: t for t in transfers if t.src == part.device}
    g = Graph(seed=part.graph.seed)
    local: Dict[Tensor, Tensor] = {}
    recvs: Dict[str, Tensor] = {}
    sends: Dict[str, Tensor] = {}
    for n in part.graph.nodes:
        if n.op == "Send":
            t = by_send[n.name]
            if t.tensor.startswith("^"):
                raise GraphError(f"control dependency '{t.tensor}' crosses the cut: split export needs data edges only")
            sends[t.tensor] = local[n.inputs[0]]
            continue
        if n.control_inputs:
            raise GraphError(f"node '{n.name}' ({n.op}) has control inputs: split export needs data edges only")
        if n.op == "Recv":
            t = by_recv[n.name]
            if t.tensor.startswith("^"):
                raise GraphError(f"control dependency '{t.tensor}' crosses the cut: split export needs data edges only")
            shape = tuple(n.attrs["shape"])
            if batch_none and shape:
                shape = (None,) + shape[1:]
            new = g.add_node("Placeholder", (), {"dtype": n.attrs["dtype"], "shape": shape}, name=n.name,
                             exact_name=True)
            recvs[t.tensor] = new.outputs[0]
        else:
            new = g.add_node(n.op, [local[t] for t in n.inputs], dict(n.attrs), name=n.name, exact_name=True)
        for t, u in zip(n.outputs, new.outputs):
            local[t] = u
    outs = {orig: g.tensor(fetch if ":" in fetch else fetch + ":0") for orig, fetch in part.outputs.items()}
    return g.verify(), recvs, sends, outs


def _one_round_trip(g: Graph, recvs: Mapping[str, Tensor], sends: Mapping[str, Tensor]) -> bool:
    """True when no sent tensor depends on a received one (one remote call per inference)."""
    recv_nodes = {t.node for t in recvs.values()}
    if not sends or not recv_nodes:
        return True
    return not any(n in recv_nodes for n in prune([t.node for t in sends.values()], set()))


# ---- the writer ------------------------------------------------------------------------------------
class SplitWriter(ModelWriter):
    """A ModelWriter holding several subgraphs: `begin(name)` starts the next one. Operator codes
    and weight buffers are shared by all of them (a weight is stored once)."""

    def __init__(self, producer: str = "isthmus converters/split_export.py"):
        super().__init__(producer)
        self.done: List[dict] = []
        self.name = "main"

    def begin(self, name: str) -> None:
        if self.tensors or self.operators or self.inputs:
            self._finish()
        self.name = name

    def _finish(self) -> None:
        self.done.append(dict(name=self.name, tensors=self.tensors, operators=self.operators, inputs=self.inputs,
                              outputs=self.outputs, remote=self.remote))
        self.tensors, self.operators, self.inputs, self.outputs, self.remote = [], [], [], [], []

    def add_model(self, m: EdgeModel) -> Tuple[List[int], List[int]]:
        """Copy a verified single-subgraph model into the current subgraph; (inputs, outputs)."""
        base = len(self.tensors)
        for t in m.tensors:
            q = dict(scale=t.scale.tolist(), zero_point=t.zero_point.tolist(), axis=t.axis) if len(t.scale) else {}
            self.add_tensor(t.name, t.dtype, t.shape, data=t.data, **q)
        for op in m.operators:
            self.add_operator(op.op, [i + base if i >= 0 else -1 for i in op.inputs], [i + base for i in op.outputs],
                              op.attrs, op.version)
        return [i + base for i in m.inputs], [i + base for i in m.outputs]

    def to_bytes(self) -> bytes:
        if self.tensors or self.operators or self.inputs:
            self._finish()
        return super().to_bytes()

    def _subgraph_tables(self) -> List[dict]:
        return self.done


# ---- export ----------------------------------------------------------------------------------------
def _edge_bytes(g: Graph, outputs: Sequence[Tensor], inputs: Sequence[Tensor], int8: bool,
                calibration: Optional[List[Dict[str, np.ndarray]]], batch: int, qdq_params=None) -> bytes:
    if not int8:
        return to_edge(g, list(outputs), inputs=list(inputs), batch=batch)
    if not calibration and qdq_params is None:
        raise ValueError("int8=True needs calibration feeds (or a QDQ model's parameters)")
    data, _ = quantize_to_edge(ism.Session(g, optimize=False), list(outputs), calibration or None, batch=batch,
                               qdq_params=qdq_params, unquantized="fp32" if not calibration else "error")
    return data


def _ranges(planner, plans: List, lo_bw: float, hi_bw: float) -> List[Tuple[int, float, float]]:
    """(plan index, min bps, max bps) over the planner's grid: at each grid bandwidth the plan
    predicted fastest; a boundary lies where the two neighbours' predictions cross (bisection)."""
    base = planner.plans[0].link

    def best(bw: float) -> int:
        link = base.with_uplink(bw)
        return min(range(len(plans)), key=lambda j: (plans[j].predict(link), j))
    grid = list(planner.bandwidths)
    winners = [best(bw) for bw in grid]
    out: List[List] = []
    for k, (bw, w) in enumerate(zip(grid, winners)):
        if out and out[-1][0] == w:
            continue
        if out:  # boundary between grid[k-1] (winner out[-1][0]) and bw (winner w)
            a, c = math.log(grid[k - 1]), math.log(bw)
            for _ in range(40):
                mid = (a + c) / 2
                link = base.with_uplink(math.exp(mid))
                if plans[out[-1][0]].predict(link) <= plans[w].predict(link):
                    a = mid
                else:
                    c = mid
            edge = math.exp((a + c) / 2)
            out[-1][2] = edge
            out.append([w, edge, math.inf])
        else:
            out.append([w, lo_bw, math.inf])
    out[-1][2] = hi_bw
    return [tuple(r) for r in out]


def export_split(source, outputs: Sequence[Union[Tensor, str]], planner, int8: bool = False,
                 calibration: Optional[Iterable[Mapping]] = None, batch: int = 1, model_name: str = "model",
                 include_full: bool = True, qdq_params=None) -> SplitExport:
    """One edge model file for every distinct plan of `planner` (an AdaptivePlanner built on this
    graph, or on the unfrozen graph it was frozen from: node names are the same) plus the full model.

    `source`: a Session (its variables are frozen) or a Graph without variables. `calibration`:
    feed dicts keyed by placeholder name (int8 only). `qdq_params`: a QDQ model's own scales by tensor
    name (converters.quantize_qdq.fp32_graph gives the float graph to plan and them), used before
    calibration, which may then be None."""
    if hasattr(source, "graph") and hasattr(source, "run"):
        outs0 = [source.graph.tensor(o) if isinstance(o, str) else o for o in outputs]
        graph = freeze(source, outs0)
    else:
        graph = source
        outs0 = [graph.tensor(o) if isinstance(o, str) else o for o in outputs]
    outs = [graph.tensor(t.name) for t in outs0]
    calib = [dict((k if isinstance(k, str) else k.node.name, np.asarray(v)) for k, v in f.items())
             for f in (calibration or [])] if int8 else None
    if int8 and not calib and qdq_params is None:
        raise ValueError("int8=True needs calibration feeds (dicts keyed by placeholder name)")
    edge_dev = planner.plans[0].problem.cost.edge
    w = SplitWriter()
    skipped: List[str] = []

    # the full model (fallback, and the cut for links where everything stays on the edge)
    full_index = None
    placeholders = [n for n in graph.nodes if n.op == "Placeholder"]
    if include_full:
        w.begin("full")
        ins, outs_i = w.add_model(loads(_edge_bytes(graph, outs, [], int8, calib, batch, qdq_params)))
        w.inputs, w.outputs = ins, outs_i
        full_index = 0

    # the plans that can be a cut: one round trip edge -> cloud -> edge per inference
    cand_plans, built = [], []
    for plan in planner.distinct():
        placement = {k: v for k, v in plan.placement.items() if k in graph}
        if all(d == edge_dev for d in placement.values()):
            if full_index is None:
                skipped.append("edge-only plan: the file carries no full model (include_full=False)")
                continue
            cand_plans.append(plan)
            built.append(None)
            continue
        part = partition(graph, placement, outs, return_to=edge_dev)
        edge_part = part.parts.get(edge_dev)
        cloud = [d for d in part.parts if d != edge_dev]
        if edge_part is None or len(cloud) != 1:
            skipped.append(f"plan at {plan.link}: {len(cloud)} cloud devices (one is supported)")
            continue
        eg, recvs, sends, eouts = _standalone(edge_part, part.transfers)
        if not _one_round_trip(eg, recvs, sends):
            skipped.append(f"plan at {plan.link}: its edge part needs the cloud more than once per inference")
            continue
        cand_plans.append(plan)
        built.append((eg, recvs, sends, eouts))
    if not cand_plans:
        raise ValueError("no plan of the planner can be exported: " + "; ".join(skipped))

    lo = 0.0
    ranges = _ranges(planner, cand_plans, lo, math.inf)
    cuts: List[CutInfo] = []
    full_sess = None
    for k, (j, lo_bw, hi_bw) in enumerate(ranges):
        plan, b = cand_plans[j], built[j]
        name = f"cut{k}"
        lt = link_terms(plan.predicted, edge_dev, plan.problem.cost.client.byte_s)
        terms = (lt.fixed, lt.up_bits, lt.n_up, lt.down_bits, lt.n_down)
        mid = plan.link if math.isinf(hi_bw) else plan.link.with_uplink(math.sqrt(max(lo_bw, 1.0) * hi_bw))
        info = CutInfo(name, full_index if b is None else -1, "" if b is None else name, lo_bw, hi_bw, [], [],
                       plan.predict(mid), terms, dict(plan.placement))
        if b is not None:
            eg, recvs, sends, eouts = b
            sent, received = sorted(sends), sorted(recvs)
            ph = [eg.tensor(n.name + ":0") for n in placeholders if n.name in eg]
            e_outs = [sends[s] for s in sent] + [eouts[t.name] for t in outs]
            e_ins = ph + [recvs[r] for r in received]
            ecal = None
            if int8 and calib:  # the received tensors' calibration values come from running the whole model
                if full_sess is None:
                    full_sess = Session(graph)
                ecal = []
                for f in calib:
                    vals = full_sess.run([graph.tensor(r) for r in received], f) if received else []
                    feed = {n.name: f[n.name] for n in placeholders if n.name in eg and n.name in f}
                    feed.update({recvs[r].node.name: v for r, v in zip(received, vals)})
                    ecal.append(feed)
            eq = qdq_params.with_aliases({recvs[r].name: r for r in received}) if qdq_params is not None else None
            m = loads(_edge_bytes(eg, e_outs, e_ins, int8, ecal, batch, eq))
            w.begin(name)
            info.subgraph = len(w.done)
            ins, outs_i = w.add_model(m)
            names = [m.tensors[i].name for i in m.inputs]
            by_name = dict(zip(names, ins))
            w.inputs = [by_name[t.node.name] for t in ph]
            w.outputs = outs_i[len(sent):]
            w.add_remote_part(name, outs_i[:len(sent)], [by_name[recvs[r].node.name] for r in received])
            info.inputs, info.outputs = sent, received
        cuts.append(info)
    w.metadata[SPLIT_KEY] = json.dumps({"version": SPLIT_VERSION, "model": model_name, "full": full_index,
                                        "rtt_s": planner.plans[0].link.rtt_s,
                                        "cuts": [c.to_json() for c in cuts]}, sort_keys=True)
    return SplitExport(w.to_bytes(), cuts, graph, skipped)


__all__ = ["export_split", "SplitExport", "CutInfo", "SplitWriter"]
