"""Measure what an edge part costs beyond its kernels on this machine (issue 27): edge parts of
several sizes of four CNNs (a chain, fire modules whose cuts send several tensors, a wide
chain with a network's worth of kernels, and a network-sized one whose maps leave the caches), int8
or fp32, each run by the real offload client against an in-process service; per part, the edge's
CPU time per request less its node kernels' (each timed alone, hot, in run order), fitted into a
PartCost (partitioner/part_cost.py), with the cold caches after idle measured apart (cold_samples) and taken out first. Timed hot in a loop, the interpreter's own overhead is 10-40
us a part here; per request it was 100-250 us: the client's glue around the part and the caches a
request finds cold after its round trip, which is what a plan must price. `isthmus profile --parts int8|fp32` writes it into the
profile's `part` section, which every plan prices (partitioner/plan.py, part_seconds)."""
from __future__ import annotations

import os
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Dict, List

import isthmus as ism
import numpy as np

BOUNDARY_OPS = ("Quantize", "Dequantize")  # the quantizer's borders: part of the part, no graph node


def _graphs():
    """(graph, placeholder, output) of the chain, the fire-module CNN, a wide chain whose kernels
    take what a whole network's do (what fits the part's kernel scale) and a network-sized CNN (_big),
    random constant weights."""
    rng = np.random.default_rng(0)

    def conv(h, out, k, stride=1):
        w = (rng.standard_normal((out, h.shape[1], k, k)) * np.sqrt(2.0 / (h.shape[1] * k * k))).astype(np.float32)
        y = ism.conv2d(h, ism.constant(w), strides=stride, padding="SAME")
        return ism.relu(ism.bias_add(y, ism.constant(np.zeros(out, np.float32)), axis=1))
    out = []
    for kind in ("chain", "fire", "wide"):
        g = ism.Graph(seed=0)
        with g.as_default():
            x = ism.placeholder("float32", (1, 3, 64, 64), name="x")
            h = conv(x, 16 if kind != "wide" else 32, 3, 2)
            if kind == "wide":  # a network's worth of kernels (2-4 ms here), maps from 32x32 to 2x2
                for c, k, st in ((64, 3, 1), (64, 3, 2), (128, 3, 1), (128, 3, 2), (256, 1, 1), (256, 3, 2),
                                 (512, 1, 1), (512, 3, 2), (128, 1, 1)):
                    h = conv(h, c, k, st)
            for c in ((24, 32, 48, 64) if kind == "chain" else (16, 32, 48) if kind == "fire" else ()):
                if kind == "chain":
                    h = conv(h, c, 3, 2 if c in (32, 64) else 1)
                else:
                    s = conv(h, c // 2, 1)
                    h = ism.max_pool(ism.concat([conv(s, c, 1), conv(s, c, 3)], axis=1), 2, 2, "VALID")
            w = (rng.standard_normal((h.shape[1], 10)) * 0.1).astype(np.float32)
            y = ism.matmul(ism.global_avg_pool(h), ism.constant(w), name="y")
        out.append((g, x, y))
    out.append(_big(conv))
    return out


def _big(conv):
    """A network-sized part: maps from 96x96 down to 6x6 whose working set leaves the core's caches,
    3x3 pools at stride 2, two-branch joins. Its kernels run 1.14-1.20x their one-node prices in a
    request emulated at 8x/20x (measured here), as the benchmark networks' do (1.1-1.35x), where the
    three small parts' run at 1.0-1.06x: without it the fit priced networks' kernels at 1.03-1.06x."""
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 3, 96, 96), name="x")
        h = conv(conv(x, 32, 3, 2), 64, 1)
        h = ism.max_pool(conv(h, 64, 3), 3, 2, "SAME")
        for c in (48, 96):
            s = conv(h, c // 2, 1)
            h = ism.concat([conv(s, c, 1), conv(s, c, 3)], axis=1)
            h = ism.max_pool(h, 3, 2, "SAME")
        h = conv(conv(h, 256, 1), 128, 3)
        w = (np.random.default_rng(3).standard_normal((h.shape[1], 10)) * 0.1).astype(np.float32)
        y = ism.matmul(ism.global_avg_pool(h), ism.constant(w), name="y")
    return g, x, y


def _plans(g, y, count: int):
    """SplitPlans of `count` prefixes of the graph on the edge (topological order; 0: cloud-only,
    all: edge-only), for PinnedPlans."""
    from isthmus.partitioner import CostModel, LinkModel, plan_split  # deferred: partitioner loads scipy
    from isthmus.partitioner.devices import CLOUD_DEVICE, EDGE_DEVICE  # deferred: partitioner.devices loads scipy
    from isthmus.partitioner.problem import Constraints, Problem  # deferred: partitioner.problem loads scipy
    cm = CostModel.edge_cloud(LinkModel(10e6, 10e6, 0.01))
    p = Problem(g, cm, [y], Constraints(edge_memory_budget=None))
    base = plan_split(g, cm, [y], p.constraints, algorithm="edge_only", problem=p)
    n = len(p.nodes)
    plans, seen = [], set()
    for k in np.unique(np.linspace(0, n, count).astype(int)):
        assign = np.where(np.arange(n) < k, p.edge, 1 - p.edge)
        assign[[i for i, node in enumerate(p.nodes) if node.op == "Placeholder"]] = p.edge
        pl = p.placement(assign)
        key = tuple(sorted(pl.items()))
        if key not in seen:
            seen.add(key)
            plans.append(replace(base, placement=pl))
    return plans, {EDGE_DEVICE, CLOUD_DEVICE}


def _zeros_remote(interp_box: list):
    """A remote callback answering every part with zeros of the shapes the interpreter expects."""
    def call(part, arrays):
        it = interp_box[0]
        return [np.zeros(it.remote_shapes[i], it.model.tensors[i].dtype) for i in part.outputs]
    return call


def _at_reference(timed, ref: float) -> float:
    """The median of (seconds, probe beside them) pairs at the reference speed state (speed_state)."""
    from isthmus.partitioner.speed_state import median_at_reference  # deferred: isthmus.partitioner loads scipy
    return median_at_reference(timed, ref)


def _time_part(interp, inputs, runs: int) -> Dict[str, float]:
    """Median CPU seconds of the whole invoke and of its node kernels (all steps but the
    quantizer's borders and the remote call), each timed in run order, hot."""
    steps = [step for _, step in interp.kernels]
    node = [kind == "op" and op not in BOUNDARY_OPS for kind, op in interp.steps_info]
    interp.invoke(*inputs)
    wholes, kernels = [], []
    for _ in range(runs):
        c = time.thread_time()
        interp.invoke(*inputs)
        wholes.append(time.thread_time() - c)
        interp.set_inputs(*inputs)
        total = 0.0
        for step, is_node in zip(steps, node):
            c = time.thread_time()
            step()
            if is_node:
                total += time.thread_time() - c
        kernels.append(total)
    return {"whole_s": float(np.median(wholes)), "kernels_s": float(np.median(kernels))}


def _priced(g, y, plans, profile) -> List[float]:
    """Each plan's edge kernels as `profile` prices them (its part section left out: what is fitted;
    its weights from memory too: they are priced beside the part, not scaled with its kernels)."""
    from isthmus.partitioner import CostModel, LinkModel  # deferred: partitioner loads scipy
    from isthmus.partitioner.devices import CLOUD_DEVICE, EDGE_DEVICE  # deferred: partitioner.devices loads scipy
    from isthmus.partitioner.plan import priced  # deferred: partitioner.plan loads scipy
    from isthmus.partitioner.problem import Constraints, Problem  # deferred: partitioner.problem loads scipy
    edge = replace(profile, part=None, client=None, kernel_table="edge", weight_stream_s=0.0,
                   weight_cache_hi=0.0)
    p = Problem(g, CostModel({EDGE_DEVICE: edge, CLOUD_DEVICE: edge}, LinkModel(10e6, 10e6, 0.01)), [y],
                Constraints(edge_memory_budget=None))
    return [priced(p, p.assignment(plan.placement))[0].compute.get(EDGE_DEVICE, 0.0) for plan in plans]


def part_samples(int8: bool = True, cuts: int = 7, requests: int = 9, slowdown: float = 10.0,
                 rtt_s: float = 0.02, profile=None, rounds: int = 3, slowdowns=None,
                 cold=None) -> List[Dict[str, float]]:
    """Per edge part of the four CNNs and slowdown: {"seconds": its edge CPU time per request less its
    node kernels' (timed hot, one by one), "nbytes": bytes entering and leaving it, "edge_s", "kernels_s",
    "model", "cut", "slowdown", "cold_s"}, and with a `profile` (a DeviceProfile of this machine, 1x)
    "priced_s": its kernels as the profile prices them (PartCost.fit then fits the profile's kernel_scale
    too). The edge time is the real OffloadClient's, against an in-process service over a link
    emulated with `rtt_s` (a request finds the caches as cold as after a real round trip), with the
    edge emulated `slowdown` (or each of `slowdowns`) x slower by CPU time (edge_s / slowdown is the
    CPU time, whatever the load of this machine). One BLAS thread. The `requests` of each part are
    spread over `rounds` passes over every part of every model and slowdown (medians of all): this VM's
    speed moves 1.5-1.8x for seconds at a time (neighbours on the host, invisible to the load average
    and to CPU time), and parts timed one after another in one such stretch fitted kernel scales from
    1.0 to 1.54; slowdowns measured apart fitted 1.29 and 1.61. "cold_s": what the part's kernels lose
    to the caches the idle before the request left cold, by `cold` ((cold_s, cold_tau_s), the curve
    cold_samples measures: a PartCost's cold terms; None: 0), after the idle the emulation sleeps
    ((slowdown - 1) x its CPU time), of kernels where the part runs any, else of moving tensors; and a
    part with a call once more, after the call (the emulated round trip), of moving tensors (the
    calibration parts run no kernel after their call). Each part's group of requests and its hot
    kernels are timed between two speed probes (partitioner/speed_state.py) and taken to the fast
    state of all the probes read ("probe_s": the part's median probe, "reference_s": that state):
    the spread passes alone still fitted kernel scale 1.49 once, all its probes slow."""
    from isthmus.partitioner.part_cost import PartCost  # deferred: partitioner.part_cost loads scipy
    from isthmus.partitioner.speed_state import reference, speed_probe  # deferred: isthmus.partitioner loads scipy
    from isthmus.partitioner.threads import limited_blas_threads  # deferred: partitioner.threads loads scipy
    if rounds < 1 or requests < 1:
        raise ValueError(f"need rounds >= 1 and requests >= 1, got rounds={rounds}, requests={requests}")
    rounds, slowdowns = min(rounds, requests), [float(x) for x in (slowdowns or [slowdown])]
    curve = PartCost() if cold is None else cold
    models = _models(int8, cuts, profile)
    with _clients(models, rtt_s) as clients, limited_blas_threads(1):
        hot = [[_hot_interpreter(c, k) for k in range(len(m[0].cuts))] for c, m in zip(clients, models)]
        edge: Dict[tuple, List[tuple]] = {}  # (seconds, the probe beside them)
        kernels: Dict[tuple, List[tuple]] = {}
        per_round = [requests // rounds + (r < requests % rounds) for r in range(rounds)]
        for r, n in enumerate(per_round):
            for sd in (slowdowns if r % 2 == 0 else slowdowns[::-1]):
                for mi, (client, m) in enumerate(zip(clients, models)):
                    client.edge_slowdown = sd
                    for k in range(len(m[0].cuts)):
                        probe = speed_probe()
                        client.selector.switch(k)
                        client.invoke(m[5])  # untimed: the switch (and the caches the probe took)
                        times = []
                        for _ in range(n):
                            client.invoke(m[5])
                            times.append(client.last["edge_s"] / sd)
                        kern = _time_part(hot[mi][k], [m[5]], 7)["kernels_s"]
                        probe = (probe + speed_probe()) / 2  # the state of the group: probed before and after
                        edge.setdefault((mi, k, sd), []).extend((t, probe) for t in times)
                        kernels.setdefault((mi, k), []).append((kern, probe))
    ref = reference(p for v in edge.values() for _, p in v)
    out = []
    for sd in slowdowns:
        for mi, (sp, prices, sizes, x, y, _, weights) in enumerate(models):
            io = sizes[x.name] + sizes[y.name]
            for k, info in enumerate(sp.cuts):
                e, kern = _at_reference(edge[(mi, k, sd)], ref), _at_reference(kernels[(mi, k)], ref)
                probe = float(np.median([p for _, p in edge[(mi, k, sd)]]))
                sent = [n for n in info.inputs if n != x.name]  # an input sent as it came is counted once
                nbytes = io + sum(sizes[n] for n in sent + info.outputs)
                c = curve.cold((sd - 1.0) * e, kernels=kern > 0, weights=weights[k])
                if info.cloud_part:
                    c += curve.cold(rtt_s, kernels=False)
                out.append({"seconds": max(e - kern - c, 0.0), "nbytes": float(nbytes), "edge_s": e,
                            "kernels_s": kern, "model": mi, "cut": k, "slowdown": sd, "cold_s": c,
                            "probe_s": probe, "reference_s": ref,
                            "edge_raw_s": float(np.median([t for t, _ in edge[(mi, k, sd)]])),
                            **({"priced_s": prices[k]} if prices is not None else {})})
    return out


IDLES = (0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)  # seconds of idle cold_samples puts before a request


def cold_samples(int8: bool = True, reps: int = 9, idles=IDLES, seed: int = 0) -> List[Dict[str, float]]:
    """What a request's edge work loses to caches gone cold while the core idled: per model (the four
    CNNs, run by the real OffloadClient at this machine's speed, one BLAS thread), kind ("kernels": the
    edge-only part; "io": the cloud-only one, which only sends the input and takes the answer, the link
    at zero) and idle {"idle_s", "cold_s": the median edge CPU seconds of a request (its remote calls'
    left out) after that idle less the median of one right after another, "hot_s", "model", "kind"}.
    Each timed request follows an untimed one and then the idle, the idles in a random order per
    pass: this VM's speed drifts over seconds, a pass takes less. Each model's and kind's idles are
    timed between two speed probes and taken to the fast state of all of them (as part_samples)."""
    from isthmus.partitioner.speed_state import reference, speed_probe  # deferred: isthmus.partitioner loads scipy
    from isthmus.partitioner.threads import limited_blas_threads  # deferred: partitioner.threads loads scipy
    if reps < 1 or 0.0 not in idles or len(idles) < 3:
        raise ValueError(f"need reps >= 1 and idles with 0 and two others, got reps={reps}, idles={idles}")
    models = _models(int8, 2, None)
    rng = np.random.default_rng(seed)
    times: Dict[tuple, List[float]] = {}
    with _clients(models, 0.02) as clients, limited_blas_threads(1):
        for _ in range(reps):
            for mi, (client, m) in enumerate(zip(clients, models)):
                client.edge_slowdown = 1.0
                client.link.set(1e9, 0.0)
                for kind, k in (("kernels", len(m[0].cuts) - 1), ("io", 0)):  # edge-only; cloud-only
                    client.selector.switch(k)
                    probe, got = speed_probe(), []
                    for idle in rng.permutation(idles):
                        client.invoke(m[5])
                        time.sleep(idle)
                        c = time.thread_time()
                        client.invoke(m[5])
                        got.append((float(idle), time.thread_time() - c - client.last["remote_cpu_s"]))
                    probe = (probe + speed_probe()) / 2
                    for idle, cpu in got:
                        times.setdefault((mi, kind, idle), []).append((cpu, probe))
    ref = reference(p for v in times.values() for _, p in v)
    out = []
    for mi in range(len(models)):
        for kind in ("kernels", "io"):
            hot = _at_reference(times[(mi, kind, 0.0)], ref)
            w = models[mi][6][-1] if kind == "kernels" else 0  # the edge-only part's weights; a cloud-only part reads none
            out += [{"idle_s": float(i), "cold_s": _at_reference(times[(mi, kind, float(i))], ref) - hot, "hot_s": hot,
                     "model": mi, "kind": kind, "weights": float(w)} for i in idles]
    return out


def fit_cold_curve(samples: List[Dict[str, float]]):
    """The cold terms of a PartCost from cold_samples: the kernels' curve (part_cost.fit_cold: its time
    constant), its amplitude as a fixed term plus one per weight element where the samples carry the
    parts' weights in two counts or more (part_cost.fit_cold_weights), and the io segments' amplitude
    on the same time constant."""
    # deferred: partitioner.part_cost loads scipy
    from isthmus.partitioner.part_cost import PartCost, fit_cold, fit_cold_weights
    kern = [s for s in samples if s.get("kind", "kernels") == "kernels"]
    cold_s, tau = fit_cold(kern)
    cold_w_s = 0.0
    if all("weights" in s for s in kern) and len({s["weights"] for s in kern}) > 1:
        cold_s, cold_w_s = fit_cold_weights(kern, tau)
    io = [s for s in samples if s.get("kind") == "io"]
    cold_io_s = fit_cold(io, tau=tau)[0] if io else 0.0
    return PartCost(cold_s=cold_s, cold_tau_s=tau, cold_io_s=cold_io_s, cold_w_s=cold_w_s)


def _models(int8: bool, cuts: int, profile):
    """The four CNNs exported as splits of `cuts` prefixes: (split, prices or None, tensor bytes, x, y, feed)."""
    # deferred: converters.split_export loads flatbuffers, scipy
    from isthmus.converters.split_export import export_split
    from isthmus.partitioner.pinned import PinnedPlans  # deferred: partitioner.pinned loads scipy
    models = []
    for mi, (g, x, y) in enumerate(_graphs()):
        plans, _ = _plans(g, y, cuts)
        prices = _priced(g, y, plans, profile) if profile is not None else None
        rng = np.random.default_rng(mi)
        feeds = [{x.node.name: rng.standard_normal(x.shape).astype(np.float32)} for _ in range(4)]
        sp = export_split(g, [y], PinnedPlans(plans), int8=int8, calibration=feeds, model_name=f"parts{mi}")
        if prices is not None and len(sp.cuts) != len(plans):
            raise RuntimeError(f"parts{mi}: {len(plans)} plans made {len(sp.cuts)} cuts ({sp.skipped})")
        sizes = {t.name: int(np.prod(t.shape)) * 4 for n in g.nodes for t in n.outputs}
        models.append((sp, prices, sizes, x, y, feeds[0][x.node.name], [_edge_weights(g, pl) for pl in plans]))
    return models


def _edge_weights(g, plan) -> int:
    """Weight elements of the constants the plan's edge products read (partitioner.plan.edge_weights's
    count, from a SplitPlan's placement)."""
    from isthmus.partitioner.devices import EDGE_DEVICE  # deferred: partitioner.devices loads scipy
    from isthmus.partitioner.plan import WEIGHT_OPS  # deferred: partitioner.plan loads scipy
    seen, total = set(), 0
    for n in g.nodes:
        if n.op in WEIGHT_OPS and plan.placement.get(n.name) == EDGE_DEVICE:
            for t in n.inputs[1:]:
                if t.node.op == "Const" and t.node.name not in seen:
                    seen.add(t.node.name)
                    total += int(np.prod(t.shape))
    return total


@contextmanager
def _clients(models, rtt_s: float):
    """An OffloadClient per model of `_models`, each against its own in-process service."""
    with tempfile.TemporaryDirectory(prefix="isthmus-part-cost-") as d, ExitStack() as stack:
        yield [stack.enter_context(_part_client(m[0], os.path.join(d, f"m{mi}"), 1.0, rtt_s))
               for mi, m in enumerate(models)]


@contextmanager
def _part_client(sp, base: str, slowdown: float, rtt_s: float):
    """The split `sp` saved under `base`, served in-process, and an OffloadClient on it (warm, pinned)."""
    from isthmus.cloud.offload import OffloadServer  # deferred: cloud.offload loads grpc, protobuf, scipy
    # deferred: cloud.offload_model loads protobuf, scipy
    from isthmus.cloud.offload_model import cloud_part, save_cloud_parts
    # deferred: the edge interpreter, loaded only by the commands that need it
    from isthmus.edge.link_emulation import EmulatedLink
    from isthmus.edge.offload_client import OffloadClient  # deferred: edge.offload_client loads protobuf
    from isthmus.partitioner.pinned import PinnedPlans  # deferred: partitioner.pinned loads scipy
    model, cloud = sp.save(base + ".isth"), base + ".cloud"
    save_cloud_parts(cloud, [cloud_part(sp.graph, i, o, n) for n, i, o in sp.cloud_signatures()])
    server = OffloadServer(cloud, max_batch_size=1, max_queue_delay_ms=0.0)
    try:
        with OffloadClient(model, server.address, link=EmulatedLink(1e9, rtt_s), deadline_ms=60000,
                           adapt=False, initial_bandwidth_bps=PinnedPlans.bandwidth(0), ping_every=10 ** 6,
                           warm="now", edge_slowdown=slowdown) as client:
            yield client
    finally:
        server.stop(grace=0)


def _hot_interpreter(client, k: int):
    """A second interpreter of cut k's edge model whose remote parts answer zeros: its kernels timed alone."""
    from isthmus.edge.interpreter import Interpreter  # deferred: loaded only by the commands that need it
    it = client._full if not client.split.cuts[k].cloud_part else client._interp[k]
    box: list = []
    hot = Interpreter(it.model, remote=_zeros_remote(box))
    box.append(hot)
    return hot


def repriced(samples: List[Dict[str, float]], profile, cuts: int = 7) -> List[Dict[str, float]]:
    """`samples` of part_samples (made with the same `cuts`) with "priced_s" by another profile: the
    same measured parts fitted against other prices (PartCost.fit)."""
    out = []
    for mi, (g, x, y) in enumerate(_graphs()):
        plans, _ = _plans(g, y, cuts)
        prices = _priced(g, y, plans, profile)
        out += [dict(s, priced_s=prices[s["cut"]]) for s in samples if s["model"] == mi]
    return out


QUICK = dict(reps=3, cuts=3, requests=3)  # `isthmus profile --parts --quick`: a rough fit in about a third of the time


def measure_part_cost(int8: bool = True, slowdown: float = 1.0, profile=None, slowdowns=(8.0, 20.0),
                      quick: bool = False):
    """The PartCost fitted here, scaled to a device `slowdown` times slower; with `profile` (of this
    machine at 1x) its kernel_scale against that profile's prices too. The cold curve is measured
    first (cold_samples), each part sample's cold taken out with it, and the rest fitted once over the
    parts run at `slowdowns` interleaved (their idles differ; their kernel scale does not). quick:
    fewer repetitions, parts and requests (QUICK), for a smoke run rather than a profile to plan with."""
    reps, cuts, requests = (QUICK["reps"], QUICK["cuts"], QUICK["requests"]) if quick else (9, 7, 9)
    cold = fit_cold_curve(cold_samples(int8, reps=reps))
    fit = fit_parts(part_samples(int8, cuts=cuts, requests=requests, profile=profile, slowdowns=slowdowns,
                                 cold=cold), cold)
    return fit.scaled(slowdown) if slowdown != 1.0 else fit


def fit_parts(samples: List[Dict[str, float]], cold) -> "PartCost":
    """PartCost.fit of part_samples (their cold taken out), with the cold terms of `cold` (a PartCost) kept."""
    from isthmus.partitioner.part_cost import PartCost  # deferred: partitioner.part_cost loads scipy
    return replace(PartCost.fit(samples), cold_s=cold.cold_s, cold_tau_s=cold.cold_tau_s, cold_io_s=cold.cold_io_s,
                   cold_w_s=cold.cold_w_s)


__all__ = ["measure_part_cost", "part_samples", "cold_samples", "fit_cold_curve", "fit_parts", "repriced"]
