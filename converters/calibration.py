"""Calibration for post-training int8 quantization: the representative dataset (feed dicts, arrays,
an .npy or .npz file) and each activation's range by min-max, percentile or entropy, with a warning
naming any tensor whose calibration values are constant or not finite."""
from __future__ import annotations

import os
import warnings
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

METHODS = ("minmax", "percentile", "entropy")
CHUNK = 32  # rows per calibration run when the data comes as whole arrays
_BINS, _LEVELS = 2048, 128  # entropy: histogram bins over |x|, and int8's levels on one side of zero


def calibration_feeds(data, placeholders: Sequence[str], chunk: int = CHUNK) -> List[Dict[str, np.ndarray]]:
    """Feed dicts (placeholder name -> array) from `data`: an iterable of feed dicts or of arrays (a
    model with one input), an array [N, ...] or a path to an .npy (one input) or .npz (arrays keyed by
    input name) file, cut into runs of `chunk` rows. Files load without pickle."""
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if not os.path.exists(path):
            raise FileNotFoundError(f"calibration data '{path}' does not exist")
        if path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as z:
                data = {k: np.asarray(z[k]) for k in z.files}
        else:
            data = np.load(path, allow_pickle=False)
        if isinstance(data, dict):
            missing, extra = set(placeholders) - set(data), set(data) - set(placeholders)
            if missing or extra:
                raise ValueError(f"calibration file '{path}': arrays {sorted(data)} must be the model's inputs "
                                 f"{sorted(placeholders)} (missing {sorted(missing)}, unknown {sorted(extra)})")
            n = min(len(v) for v in data.values())
            return [{k: v[i:i + chunk] for k, v in data.items()} for i in range(0, n, chunk)]
    if isinstance(data, np.ndarray):
        return [_single(placeholders, data[i:i + chunk]) for i in range(0, len(data), chunk)]
    feeds = []
    for item in data:
        feeds.append(dict(item) if isinstance(item, Mapping) else _single(placeholders, np.asarray(item)))
    if not feeds:
        raise ValueError("calibration data is empty: quantization needs at least one representative input")
    return feeds


def _single(placeholders: Sequence[str], value: np.ndarray) -> Dict[str, np.ndarray]:
    if len(placeholders) != 1:
        raise ValueError(f"calibration arrays without names need a model with one input; it has {list(placeholders)}: "
                         "give feed dicts or an .npz keyed by input name")
    return {placeholders[0]: value}


def calibrate(sess, tensors: Sequence, feeds: Iterable[Dict], method: str = "minmax",
              percentile: Optional[float] = None, keep: Iterable = (),
              warn_for: Optional[Iterable] = None) -> Dict[object, Tuple[float, float]]:
    """(min, max) per tensor over the calibration feeds: the extremes (minmax), the percentile and
    100 - percentile of each run (percentile, default 99.99), or the clipping that keeps the int8
    histogram closest to the float one in KL divergence (entropy, as TensorRT's calibrator). Tensors
    in `keep` (the model's outputs: clipping logits changes the argmax) keep their min-max range.
    Warnings name the tensors of `warn_for` (default: all) whose values are constant or not finite."""
    if method not in METHODS:
        raise ValueError(f"calibration method {method!r}; expected one of {', '.join(METHODS)}")
    feeds = list(feeds)
    pct = percentile if percentile is not None else 99.99
    ranges: Dict[object, List[float]] = {}
    bad = set()
    for feed in feeds:
        for t, v in zip(tensors, sess.run(list(tensors), feed)):
            v = np.asarray(v, np.float64).reshape(-1)
            finite = np.isfinite(v)
            if not finite.all():
                bad.add(t)
                v = v[finite]
            if not v.size:
                continue
            lo, hi = (np.percentile(v, 100 - pct), np.percentile(v, pct)) if method == "percentile" else (v.min(), v.max())
            r = ranges.get(t)
            ranges[t] = [lo, hi] if r is None else [min(r[0], lo), max(r[1], hi)]
    warn = set(tensors if warn_for is None else warn_for)
    for t in tensors:
        ranges.setdefault(t, [0.0, 0.0])
        if t not in warn:
            continue
        name = getattr(t, "name", str(t))
        if t in bad:
            warnings.warn(f"calibration: tensor '{name}' has NaN or Inf values; its range uses the finite ones",
                          RuntimeWarning, stacklevel=3)
        r = ranges[t]
        if r[0] == r[1]:
            warnings.warn(f"calibration: tensor '{name}' is constant ({r[0]:g}) over the calibration data; its int8 "
                          "scale covers [min(0, value), max(0, value)] only", RuntimeWarning, stacklevel=3)
    if method == "entropy":
        keep = set(keep)
        _entropy_ranges(sess, [t for t in tensors if t not in keep], feeds, ranges)
    return {t: (float(r[0]), float(r[1])) for t, r in ranges.items()}


def _entropy_ranges(sess, tensors, feeds, ranges) -> None:
    """Clip each range at the |x| threshold whose 128-level quantization of the |x| histogram is
    closest to it in KL divergence (a second pass over the data, histograms of 2048 bins)."""
    tops = {t: max(abs(ranges[t][0]), abs(ranges[t][1])) for t in tensors}
    hists = {t: np.zeros(_BINS) for t in tensors}
    for feed in feeds:
        for t, v in zip(tensors, sess.run(list(tensors), feed)):
            a = np.abs(np.asarray(v, np.float64).reshape(-1))
            a = a[np.isfinite(a)]
            if tops[t] > 0 and a.size:
                hists[t] += np.histogram(a, bins=_BINS, range=(0.0, tops[t]))[0]
    for t in tensors:
        if tops[t] > 0 and hists[t].sum():
            levels = 2 * _LEVELS if ranges[t][0] >= 0 else _LEVELS  # all 256 codes on one side of zero
            thr = _kl_threshold(hists[t], levels) * tops[t] / _BINS
            ranges[t] = [max(ranges[t][0], -thr), min(ranges[t][1], thr)]


def _kl_threshold(hist: np.ndarray, levels: int) -> int:
    """The number of bins (of 2048) to keep: argmin over candidates of KL(P || Q), P the histogram up
    to there with the rest folded into its last bin, Q the same bins before the fold merged into
    `levels` levels and spread back over P's nonzero bins (the clipped mass is what Q misses)."""
    best, best_i = np.inf, len(hist)
    for i in range(levels, len(hist) + 1, 16):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()
        nz = p > 0
        q = np.zeros(i)
        for chunk in np.array_split(np.arange(i), levels):  # from the unclipped bins: Q lacks the folded tail
            used = chunk[nz[chunk]]
            if used.size:
                q[used] = hist[chunk].sum() / used.size
        ps, qs = p / p.sum(), q / max(q.sum(), 1e-300)
        if np.any(qs[nz] == 0):  # P has mass where Q has none (the folded last bin): infinitely far
            continue
        kl = float(np.sum(ps[nz] * np.log(ps[nz] / qs[nz])))
        if kl < best:
            best, best_i = kl, i
    return best_i
