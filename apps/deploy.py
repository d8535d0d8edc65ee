"""`deploy_split`: from a model to the files a split deployment runs from (edge file, cloud file,
plan JSON + SVG, report), in one step above converters/, cloud/ and partitioner/."""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from isthmus.wire.link import LinkModel, parse_bandwidth, parse_duration

from .errors import UsageError
from .model_source import LoadedModel, _load_array, load_model

PROFILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")
PHONE_PROFILE = os.path.join(PROFILES, "phone.json")
PHONE_LITERT_PROFILE = os.path.join(PROFILES, "phone-litert.json")   # benchmarks/tflite_profile.py writes it
PHONE_ORT_PROFILE = os.path.join(PROFILES, "phone-ort.json")         # ... --runtime onnxruntime
SHIPPED_PROFILES = {"phone": PHONE_PROFILE, "phone-litert": PHONE_LITERT_PROFILE, "phone-ort": PHONE_ORT_PROFILE}
SWEEP_BPS = tuple(float(b) for b in np.geomspace(0.1e6, 1000e6, 25))  # the cuts the client may switch among


@dataclass
class Deployment:
    """What deploy_split wrote, and what it predicts."""
    out_dir: str
    edge_file: str
    cloud_file: Optional[str]
    plan_json: str
    plan_svg: str
    report_file: str
    report: str
    chosen_cut: str
    predicted: Dict[str, float] = field(default_factory=dict)   # seconds: split, edge_only, cloud_only
    seconds: float = 0.0
    drift: Optional[tuple] = None  # int8: (max abs, relative, top-1 agreement) of the full model vs fp32
    client: Optional[object] = None  # the ClientCost the plans were priced with
    client_source: str = ""          # where it came from (the edge profile, the caller, the default)
    planner: Optional[object] = None  # the AdaptivePlanner behind the cuts (its sweep, `choose(link)`)
    plan: Optional[object] = None     # the SplitPlan at exactly this link (explain(), baselines)
    split: Optional[object] = None    # the exported SplitExport (report(), cuts, cloud signatures)
    scales_from: Optional[str] = None  # int8: where the scales came from (calibration, the model's QDQ nodes)


def load_profile(path: Optional[str], flag: str = "--edge-profile"):
    """A DeviceProfile from a JSON file (`isthmus profile` writes them); 'phone', 'phone-litert' and
    'phone-ort' name the ones that ship (apps/profiles/)."""
    from isthmus.partitioner.devices import DeviceProfile  # deferred: partitioner.devices loads scipy
    if path in (None, ""):
        return None
    path = SHIPPED_PROFILES.get(path, path)
    if not os.path.isfile(path):
        raise UsageError(f"{flag} {path}: no such file (or {' / '.join(map(repr, SHIPPED_PROFILES))} for the "
                         "profiles that ship with isthmus)")
    try:
        return DeviceProfile.load(path)
    except (ValueError, TypeError) as e:
        raise UsageError(f"{flag} {path}: not a device profile: {' '.join(str(e).split())}") from None


def parse_link(bandwidth: str, rtt: str, downlink: Optional[str] = None):
    """A LinkModel from the flags, errors naming the flag."""
    for flag, v, fn in (("--bandwidth", bandwidth, parse_bandwidth), ("--rtt", rtt, parse_duration),
                        ("--downlink", downlink, parse_bandwidth)):
        if v is None:
            continue
        try:
            x = fn(v)
        except ValueError as e:
            raise UsageError(f"{flag} {v}: {e}") from None
        if flag != "--rtt" and not x > 0:
            raise UsageError(f"{flag} {v}: must be above 0")
    return LinkModel.parse(bandwidth, rtt, downlink)


def calibration_feeds(data: Union[str, Mapping[str, np.ndarray]], model: LoadedModel, limit: int = 0,
                      flag: str = "--calibration-data") -> List[Dict[str, np.ndarray]]:
    """Feed dicts (by placeholder name) of the calibration samples: an .npz (or a dict) holding, per
    model input (by name, or the only array for a one-input model), samples along axis 0."""
    if isinstance(data, str):
        z = _load_array(data, flag)
        if not hasattr(z, "files"):
            z = {"": z}  # a bare .npy: the samples of a one-input model
        arrays = {k: np.asarray(z[k]) for k in (z.files if hasattr(z, "files") else z)}
    else:
        arrays = {k: np.asarray(v) for k, v in data.items()}
    names = list(model.inputs)
    if not arrays:
        raise UsageError(f"{flag} {data}: holds no arrays")
    if all(n in arrays for n in names):
        chosen = {n: arrays[n] for n in names}
    elif len(names) == 1 and len(arrays) == 1:
        chosen = {names[0]: next(iter(arrays.values()))}
    else:
        raise UsageError(f"{flag} {data}: holds {sorted(arrays)}; the model takes {', '.join(names)}")
    counts = set()
    for n, a in chosen.items():
        t = model.inputs[n]
        shape = list(t.shape)
        if a.ndim != len(shape) or a.shape[0] < 1:
            raise UsageError(f"{flag} {data}: '{n}' has shape {list(a.shape)}; the model's input is "
                             f"{['?' if d is None else d for d in shape]} (samples along axis 0)")
        if any(d is not None and d != s for d, s in zip(shape[1:], a.shape[1:])):
            raise UsageError(f"{flag} {data}: '{n}' samples are {list(a.shape[1:])}, the model takes "
                             f"{['?' if d is None else d for d in shape[1:]]}")
        if a.dtype.kind not in "fiub":
            raise UsageError(f"{flag} {data}: '{n}' has dtype {a.dtype}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise UsageError(f"{flag} {data}: '{n}' holds NaN or infinite values")
        counts.add(a.shape[0])
    if len(counts) != 1:
        raise UsageError(f"{flag} {data}: the inputs hold different numbers of samples {sorted(counts)}")
    n = counts.pop()
    step = {k: (model.inputs[k].shape[0] or 1) for k in chosen}
    rows = max(step.values())
    feeds = []
    for i in range(0, n - rows + 1, rows):
        feeds.append({model.inputs[k].node.name: a[i:i + rows].astype(np.dtype(model.inputs[k].dtype))
                      for k, a in chosen.items()})
        if limit and len(feeds) >= limit:
            break
    return feeds


def deploy_split(model: Union[str, LoadedModel], out_dir: str, bandwidth: str = "5mbps", rtt: str = "40ms",
                 edge_profile: Optional[str] = None, cloud_profile: Optional[str] = None, int8: bool = False,
                 calibration: Union[None, str, Mapping[str, np.ndarray]] = None, downlink: Optional[str] = None,
                 input_shapes: Optional[Mapping[str, Sequence[int]]] = None, batch: int = 1,
                 force: bool = False, client=None, cost=None, stem: str = "model") -> Deployment:
    """Plan `model` for the link and write, into `out_dir`: model.isth (the edge parts of every cut
    over a sweep of bandwidths, plus the full model for fallback; int8 with `int8=True`),
    model.cloud (what `isthmus serve` serves), plan.json, plan.svg and report.txt. Every plan prices
    the edge client's own cost per request (`client`, a ClientCost; default: the edge profile's
    `client` section, else client_cost.HERE scaled to the built-in edge, see client_cost_for).
    `cost`: a CostModel to plan with instead (e.g. with measured node times); its link, profiles and
    client then replace `bandwidth`, `rtt`, `downlink`, the profiles, `client` and `batch`.
    `stem`: the edge and cloud files are STEM.isth and STEM.cloud."""
    t0 = time.perf_counter()
    # deferred: cloud.offload_model loads protobuf, scipy
    from isthmus.cloud.offload_model import cloud_part, save_cloud_parts
    # deferred: converters.quantize_qdq loads the graph machinery (isthmus.core)
    from isthmus.converters.quantize_qdq import fp32_graph, has_qdq
    # deferred: converters.split_export loads flatbuffers, scipy
    from isthmus.converters.split_export import export_split
    # deferred: the graph machinery (isthmus.core), loaded only by the commands that need it
    from isthmus.core.passes import freeze
    from isthmus.edge import cut_for  # deferred: the edge runtime, loaded only by the commands that need it
    from isthmus.partitioner import AdaptivePlanner, plan_split  # deferred: partitioner loads scipy
    from isthmus.partitioner.costmodel import CostModel  # deferred: partitioner.costmodel loads scipy
    from isthmus.partitioner.devices import CLOUD, EDGE  # deferred: partitioner.devices loads scipy
    from isthmus.partitioner.plots import graph_svg  # deferred: partitioner.plots loads scipy
    if cost is None:
        link = parse_link(bandwidth, rtt, downlink)
        edge = load_profile(edge_profile) or EDGE
        cloud = load_profile(cloud_profile, "--cloud-profile") or CLOUD
    else:
        link, edge, cloud, batch = cost.link, cost.profiles[cost.edge], cost.profiles[cost.cloud], cost.batch_size
    if batch < 1:
        raise UsageError(f"--batch {batch}: must be at least 1")
    m = model if isinstance(model, LoadedModel) else load_model(model, input_shapes)
    qdq = int8 and has_qdq(m.graph.nodes)  # a QDQ model: planned as its float graph, int8 with its own scales
    if int8 and calibration is None and not qdq:
        raise UsageError("--int8 needs --calibration-data (an .npz of sample inputs) unless the model is in "
                         "QDQ form (QuantizeLinear/DequantizeLinear with its own scales)")
    files = _paths(out_dir, force, stem)
    feeds = calibration_feeds(calibration, m) if int8 and calibration is not None else None
    sess = m.session()
    outs = list(m.outputs.values())
    if qdq:
        frozen, outs, qdq_params = fp32_graph(sess, outs)
    else:
        frozen, qdq_params = freeze(sess, outs), None
        outs = [frozen.tensor(t.name) for t in outs]
    if cost is None:
        client, client_source = client_cost_for(edge, edge_profile, client)
        cost = CostModel.edge_cloud(link, edge, cloud, batch_size=batch, client=client)
    else:
        client, client_source = cost.client, "the given cost model"
    planner = AdaptivePlanner(frozen, cost, outputs=outs, bandwidths=SWEEP_BPS)
    at_link = plan_split(frozen, cost, outputs=outs)
    sp = export_split(frozen, outs, planner, int8=int8, calibration=feeds, batch=batch, model_name=m.name,
                      qdq_params=qdq_params)
    sp.save(files["edge"])
    sigs = sp.cloud_signatures()
    if sigs:
        save_cloud_parts(files["cloud"], [cloud_part(sp.graph, i, o, n) for n, i, o in sigs], model=m.name)
    elif os.path.exists(files["cloud"]):
        os.remove(files["cloud"])
    chosen = sp.cuts[cut_for(sp.cuts, link.up_bandwidth_bps)]
    graph_svg(at_link, files["svg"])
    predicted = {"split": at_link.total, **{k: b.total for k, b in at_link.baselines.items()}}
    plan = {"model": m.source, "int8": int8, "link": str(link), "edge_profile": edge.name,
            "cloud_profile": cloud.name, "chosen_cut": chosen.name, "predicted_s": predicted,
            "client_cost_s": client.to_dict(), "client_cost_source": client_source,
            "placement": dict(sorted(at_link.placement.items())),
            "cuts": [c.to_json() for c in sp.cuts], "skipped": sp.skipped}
    with open(files["json"], "w") as f:
        json.dump(plan, f, indent=1, sort_keys=True)
    dep = Deployment(out_dir, files["edge"], files["cloud"] if sigs else None, files["json"], files["svg"],
                     files["report"], "", chosen.name, predicted, client=client, client_source=client_source,
                     planner=planner, plan=at_link, split=sp)
    dep.scales_from = ("the model's QDQ nodes" + (" (calibration for the rest)" if feeds else "")
                       if qdq else "calibration") if int8 else None
    if int8 and feeds:  # the whole int8 model (the fallback, and the most quantized cut) against fp32
        from isthmus.edge import load_split  # deferred: the edge runtime, loaded only by the commands that need it
        from .cmd_quantize import measure_drift  # cycle: apps.deploy <-> apps.cmd_quantize
        dep.drift = measure_drift(load_split(files["edge"]).full, sess, m, feeds)
    dep.seconds = time.perf_counter() - t0
    dep.report = _report(dep, m, link, edge, chosen, sp, at_link)
    with open(files["report"], "w") as f:
        f.write(dep.report + "\n")
    return dep


def client_cost_for(edge, edge_profile: Optional[str], client=None):
    """(the ClientCost to price plans with, where it came from): the caller's, else the edge profile's
    `client` section, else the default: client_cost.HERE (measured on this machine kind) scaled by the
    built-in edge's slowdown, for a profile that does not say how slow its client is."""
    # deferred: partitioner.client_cost loads scipy
    from isthmus.partitioner.client_cost import DEFAULT_EDGE_SLOWDOWN, HERE
    if client is not None:
        return client, "given"
    if edge.client is not None:
        return edge.client, f"edge profile {edge_profile or edge.name}"
    return HERE.scaled(DEFAULT_EDGE_SLOWDOWN), (f"default: this machine's client {DEFAULT_EDGE_SLOWDOWN:g}x slower "
                                                "(the edge profile has no client section)")


def _paths(out_dir: str, force: bool, stem: str = "model") -> Dict[str, str]:
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"-o {out_dir}: exists and is not a folder")
    names = {"edge": f"{stem}.isth", "cloud": f"{stem}.cloud", "json": "plan.json", "svg": "plan.svg",
             "report": "report.txt"}
    if not stem or os.sep in stem or stem in (".", ".."):
        raise UsageError(f"stem {stem!r}: must be a plain file name (the edge file is STEM.isth)")
    files = {k: os.path.join(out_dir, v) for k, v in names.items()}
    there = [p for p in files.values() if os.path.exists(p)]
    if there and not force:
        raise UsageError(f"-o {out_dir}: already holds {os.path.basename(there[0])}; pass --force to overwrite")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise UsageError(f"-o {out_dir}: cannot create the folder ({e.strerror or e})") from None
    return files


def _ms(s: float) -> str:
    return "n/a" if s is None or math.isnan(s) else f"{s * 1e3:.2f} ms"


def _report(dep: Deployment, m: LoadedModel, link, edge, chosen, sp, at_link) -> str:
    p = dep.predicted
    where = (f"the edge sends {', '.join(chosen.inputs)} to cloud part '{chosen.cloud_part}'" if chosen.cloud_part
             else "everything runs on the edge")
    lines = [f"split of {m.source} ({m.kind}) for {link}; edge profile: {edge.name}",
             f"at this link: {chosen.name}: {where}",
             f"predicted: split {_ms(p['split'])}, edge only {_ms(p.get('edge_only'))}, "
             f"cloud only {_ms(p.get('cloud_only'))}",
             f"client cost assumed on the edge: {dep.client.describe()} ({dep.client_source})",
             sp.report(),
             *([] if dep.scales_from is None else [f"int8 scales from {dep.scales_from}"]),
             *([] if dep.drift is None else [
                 "int8 drift vs fp32 on the calibration data (the whole int8 model): max abs "
                 f"{dep.drift[0]:.4g} ({dep.drift[1]:.2%} of the largest output)"
                 + ("" if dep.drift[2] is None else f", top-1 agreement {dep.drift[2]:.1%}")]),
             f"wrote {dep.edge_file} ({os.path.getsize(dep.edge_file):,} bytes)"
             + (f", {dep.cloud_file} ({os.path.getsize(dep.cloud_file):,} bytes)" if dep.cloud_file
                else " (no cloud file: every cut keeps the model on the edge)"),
             f"wrote {dep.plan_json}, {dep.plan_svg}, {dep.report_file} in {dep.seconds:.1f} s",
             ("next: isthmus serve " + dep.cloud_file + " --port 7070   and   "
              f"isthmus edge-run {dep.edge_file} --cloud 127.0.0.1:7070 --input x.npy" if dep.cloud_file else
              f"next: isthmus edge-run {dep.edge_file} --input x.npy (nothing to serve at this link and profile)")]
    return "\n".join(lines)


__all__ = ["deploy_split", "Deployment", "client_cost_for", "load_profile", "parse_link", "calibration_feeds", "PHONE_PROFILE"]
