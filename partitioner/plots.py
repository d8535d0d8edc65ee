"""Pictures of split plans, as plain SVG (no plotting library needed):

- graph_svg(plan): the graph in layers, each node coloured by its device, the edges that
  cross the cut drawn in red;
- latency_svg(planner): predicted latency against uplink bandwidth for edge-only,
  cloud-only and the chosen split (log-log).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple
from xml.sax.saxutils import escape

from .plan import AdaptivePlanner, SplitPlan

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948")
CUT = "#e15759"


def _svg(w: float, h: float, body: List[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" '
            f'viewBox="0 0 {w:.0f} {h:.0f}" font-family="sans-serif" font-size="11">\n'
            + "\n".join(body) + "\n</svg>\n")


def _write(text: str, path: Optional[str]) -> str:
    if path:
        with open(path, "w") as f:
            f.write(text)
    return text


def graph_svg(plan: SplitPlan, path: Optional[str] = None, max_label: int = 18) -> str:
    p = plan.problem
    colour = {d: PALETTE[i % len(PALETTE)] for i, d in enumerate(p.devices)}
    layer = [0] * len(p.nodes)
    preds: Dict[int, List[int]] = {i: [] for i in range(len(p.nodes))}
    for f in p.flows:
        for c in f.consumers:
            preds[c].append(f.producer)
    for i in range(len(p.nodes)):  # nodes are in topological order: one pass finds the longest paths
        layer[i] = 1 + max((layer[j] for j in preds[i]), default=-1)
    rows: Dict[int, List[int]] = {}
    for i, l in enumerate(layer):
        rows.setdefault(l, []).append(i)
    bw, bh, gx, gy = 130, 24, 30, 46
    width = max(max(len(r) for r in rows.values()) * (bw + gx) + gx, 190 * (len(p.devices) + 1))
    height = len(rows) * (bh + gy) + gy + 20
    pos: Dict[int, Tuple[float, float]] = {}
    for l, members in rows.items():
        off = (width - len(members) * (bw + gx) + gx) / 2
        for k, i in enumerate(members):
            pos[i] = (off + k * (bw + gx), gy / 2 + 20 + l * (bh + gy))
    body = []
    dev = [plan.placement[n.name] for n in p.nodes]
    for f in p.flows:
        x0, y0 = pos[f.producer]
        for c in f.consumers:
            x1, y1 = pos[c]
            cut = dev[f.producer] != dev[c]
            body.append(f'<line x1="{x0 + bw / 2:.1f}" y1="{y0 + bh:.1f}" x2="{x1 + bw / 2:.1f}" y2="{y1:.1f}" '
                        f'stroke="{CUT if cut else "#999"}" stroke-width="{2.5 if cut else 1}"'
                        + (' stroke-dasharray="5,3"' if cut else "") + "/>")
    for i, n in enumerate(p.nodes):
        x, y = pos[i]
        label = n.name if len(n.name) <= max_label else n.name[: max_label - 1] + "…"
        body.append(f'<g><title>{escape(n.name)} ({n.op}) on {escape(dev[i])}</title>'
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw}" height="{bh}" rx="4" fill="{colour[dev[i]]}"/>'
                    f'<text x="{x + bw / 2:.1f}" y="{y + 16:.1f}" text-anchor="middle" fill="white">'
                    f'{escape(label)}</text></g>')
    legend = [f'<rect x="{10 + 190 * k}" y="4" width="12" height="12" fill="{colour[d]}"/>'
              f'<text x="{26 + 190 * k}" y="14">{escape(d.split("/device:")[0])}</text>'
              for k, d in enumerate(p.devices)]
    legend.append(f'<line x1="{10 + 190 * len(p.devices)}" y1="10" x2="{40 + 190 * len(p.devices)}" y2="10" '
                  f'stroke="{CUT}" stroke-width="2.5" stroke-dasharray="5,3"/>'
                  f'<text x="{46 + 190 * len(p.devices)}" y="14">cut</text>')
    return _write(_svg(width, height, legend + body), path)


def latency_series(planner: AdaptivePlanner) -> Dict[str, List[Tuple[float, float]]]:
    """(bandwidth bit/s, predicted seconds) for edge-only, cloud-only and the chosen split."""
    out: Dict[str, List[Tuple[float, float]]] = {"edge_only": [], "cloud_only": [], "split": []}
    for bw, plan in zip(planner.bandwidths, planner.plans):
        out["split"].append((bw, plan.total))
        for k in ("edge_only", "cloud_only"):
            if k in plan.baselines:
                out[k].append((bw, plan.baselines[k].total))
    return out


def latency_svg(planner: AdaptivePlanner, path: Optional[str] = None, title: str = "") -> str:
    series = latency_series(planner)
    pts = [pt for s in series.values() for pt in s]
    xs = [math.log10(x) for x, _ in pts]
    ys = [math.log10(max(y, 1e-9)) for _, y in pts]
    x_lo, x_hi = min(xs), max(max(xs), min(xs) + 1)
    y_lo = math.floor(min(ys))
    y_hi = max(math.ceil(max(ys)), y_lo + 1)
    W, H, L, B, T, R = 640, 400, 70, 50, 30, 150

    def sx(v: float) -> float:
        return L + (math.log10(v) - x_lo) / (x_hi - x_lo) * (W - L - R)

    def sy(v: float) -> float:
        return H - B - (math.log10(max(v, 1e-9)) - y_lo) / (y_hi - y_lo) * (H - B - T)

    body = [f'<text x="{W / 2:.0f}" y="18" text-anchor="middle" font-size="13">{escape(title or "predicted latency")}</text>',
            f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - B - T}" fill="none" stroke="#333"/>']
    for e in range(math.ceil(x_lo), math.floor(x_hi) + 1):
        x = sx(10 ** e)
        body.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{H - B}" stroke="#ddd"/>'
                    f'<text x="{x:.1f}" y="{H - B + 15}" text-anchor="middle">{10 ** e / 1e6:g}</text>')
    for e in range(y_lo, y_hi + 1):
        y = sy(10 ** e)
        body.append(f'<line x1="{L}" y1="{y:.1f}" x2="{W - R}" y2="{y:.1f}" stroke="#ddd"/>'
                    f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{_seconds(10 ** e)}</text>')
    body.append(f'<text x="{(L + W - R) / 2:.0f}" y="{H - 12}" text-anchor="middle">uplink bandwidth (Mbit/s)</text>')
    styles = {"edge_only": (PALETTE[0], ""), "cloud_only": (PALETTE[1], ""), "split": ("#222", ' stroke-dasharray="6,3"')}
    for k, (name, s) in enumerate(series.items()):
        if not s:
            continue
        colour, dash = styles[name]
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        body.append(f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="2"{dash}>'
                    f'<title>{name}</title></polyline>')
        body.append(f'<line x1="{W - R + 12}" y1="{T + 14 + 18 * k}" x2="{W - R + 36}" y2="{T + 14 + 18 * k}" '
                    f'stroke="{colour}" stroke-width="2"{dash}/><text x="{W - R + 42}" y="{T + 18 + 18 * k}">{name}</text>')
    return _write(_svg(W, H, body), path)


def _seconds(s: float) -> str:
    return f"{s * 1e3:g} ms" if s < 1 else f"{s:g} s"


__all__: Sequence[str] = ["graph_svg", "latency_svg", "latency_series"]
