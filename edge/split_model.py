"""The split model file (converters/split_export.py writes it): every subgraph verified as
loader.verify does, and the cut table in its metadata checked against them.

edge/loader.py reads single-subgraph models; a split file holds one subgraph per candidate cut and,
optionally, the whole model for local fallback; the metadata's keys are wire/split_format.py's.
"""
from __future__ import annotations

import json
import math
import mmap
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from ..wire.split_format import LEGACY_BANDWIDTH_KEYS, MAX_BANDWIDTH_KEY, MIN_BANDWIDTH_KEY, SPLIT_KEY, SPLIT_VERSION
from .format import EdgeModelError
from .loader import EdgeModel, verify_all


@dataclass
class Cut:
    """One candidate cut: its edge part and the uplink range (bit/s) where it is best."""
    name: str
    model: EdgeModel          # the edge part (the full model for an edge-only cut)
    cloud_part: str           # "" for an edge-only cut
    min_bandwidth_bps: float
    max_bandwidth_bps: float
    inputs: List[str]         # wire names, in RemotePart.inputs order
    outputs: List[str]
    predicted_s: float


@dataclass
class SplitModel:
    """A split model file: its cuts by increasing bandwidth, and the full model for fallback."""
    name: str
    cuts: List[Cut]           # by increasing bandwidth
    full: Optional[EdgeModel]
    rtt_s: float
    metadata: Dict[str, str]

    def cut_for(self, bandwidth_bps: float) -> int:
        """The cut whose uplink range holds `bandwidth_bps`."""
        return cut_for(self.cuts, bandwidth_bps)


def cut_for(cuts: Sequence[Cut], bandwidth_bps: float) -> int:
    """The index of the cut whose uplink range holds `bandwidth_bps` (the last one above them all).
    The one rule for which cut a measured bandwidth picks: the client, the CLI's deploy and the
    demo all call it. `cuts` are contiguous ranges from 0 up (a split file's, or export_split's)."""
    for k, c in enumerate(cuts):
        if bandwidth_bps < c.max_bandwidth_bps:
            return k
    return len(cuts) - 1


def mid_bandwidth_bps(cut: Cut) -> float:
    """A bandwidth inside the cut's uplink range (its middle, an open top taken as 10 Gbit/s):
    given it as its starting estimate, a client starts on that cut."""
    return (cut.min_bandwidth_bps + min(cut.max_bandwidth_bps, 1e10)) / 2


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise EdgeModelError(f"metadata '{SPLIT_KEY}': {what}")


def _names(v, what: str) -> List[str]:
    _check(isinstance(v, list) and all(isinstance(s, str) and 0 < len(s) <= 1024 for s in v),
           f"{what} must be a list of names")
    return list(v)


def _number(v, what: str, allow_none: bool = False) -> float:
    if v is None and allow_none:
        return math.inf
    _check(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
           f"{what} must be a finite number >= 0, got {v!r}")
    return float(v)


def read_split(models: List[EdgeModel]) -> SplitModel:
    """Validate the split metadata of a verified file against its subgraphs."""
    text = models[0].metadata.get(SPLIT_KEY)
    if text is None:
        raise EdgeModelError(f"not a split model: no '{SPLIT_KEY}' metadata "
                             "(export it with converters/split_export.py)")
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise EdgeModelError(f"metadata '{SPLIT_KEY}' is not JSON: {e}") from None
    _check(isinstance(meta, dict), "must be an object")
    _check(meta.get("version") == SPLIT_VERSION, f"version {meta.get('version')!r}; this reader knows {SPLIT_VERSION}")
    full_i = meta.get("full")
    _check(full_i is None or (isinstance(full_i, int) and 0 <= full_i < len(models)),
           f"full subgraph {full_i!r} out of range")
    full = models[full_i] if full_i is not None else None
    if full is not None:
        _check(not full.remote, f"the full model (subgraph {full_i}) has remote parts")
    cuts_j = meta.get("cuts")
    _check(isinstance(cuts_j, list) and cuts_j, "no cuts")
    cuts: List[Cut] = []
    for k, c in enumerate(cuts_j):
        w = f"cut {k}"
        _check(isinstance(c, dict), f"{w} must be an object")
        sgi = c.get("subgraph")
        _check(isinstance(sgi, int) and 0 <= sgi < len(models), f"{w}: subgraph {sgi!r} out of range")
        model = models[sgi]
        part = c.get("cloud_part")
        _check(isinstance(part, str), f"{w}: cloud_part must be a string")
        ins, outs = _names(c.get("inputs"), f"{w} inputs"), _names(c.get("outputs"), f"{w} outputs")
        if part:
            _check(len(model.remote) == 1 and model.remote[0].name == part,
                   f"{w}: subgraph {sgi} must carry exactly one remote part named '{part}'")
            _check(len(ins) == len(model.remote[0].inputs) and len(outs) == len(model.remote[0].outputs),
                   f"{w}: {len(ins)}/{len(outs)} wire names for a remote part of "
                   f"{len(model.remote[0].inputs)}/{len(model.remote[0].outputs)} tensors")
        else:
            _check(not model.remote, f"{w}: an edge-only cut's subgraph {sgi} has remote parts")
        lo_key, hi_key = (k if k in c else LEGACY_BANDWIDTH_KEYS[k] for k in (MIN_BANDWIDTH_KEY, MAX_BANDWIDTH_KEY))
        lo, hi = _number(c.get(lo_key), f"{w} {lo_key}"), _number(c.get(hi_key), f"{w} {hi_key}", allow_none=True)
        _check(lo < hi and (not cuts or lo == cuts[-1].max_bandwidth_bps),
               f"{w}: range {lo}..{hi} does not follow the previous cut's")
        cuts.append(Cut(str(c.get("name", f"cut{k}")), model, part, lo, hi, ins, outs,
                        _number(c.get("predicted_s", 0.0), f"{w} predicted_s")))
    name = meta.get("model", "model")
    rtt = _number(meta.get("rtt_s", 0.0), "rtt_s")
    return SplitModel(str(name), cuts, full, rtt, models[0].metadata)


def load_split(path: str) -> SplitModel:
    """Map a split model file read-only and verify every subgraph and the cut table."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise EdgeModelError(f"cannot open edge model {path}: {e}") from None
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            raise EdgeModelError(f"{path}: empty file")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        models = verify_all(mm)
        split = read_split(models)
    except EdgeModelError as e:
        mm.close()
        raise EdgeModelError(f"{path}: {e}") from None
    for m in models:
        m._keep = mm
    return split


__all__ = ["Cut", "SplitModel", "read_split", "load_split", "cut_for"]
