"""The split model file's constants: the metadata key that holds the cut table, its version, and the
names of a cut's fields. converters/split_export.py writes them; edge/split_model.py reads them.

A split file is an edge model file (proto/edge_model.fbs) with one subgraph per candidate cut and,
optionally, the whole model for local fallback; its metadata entry SPLIT_KEY holds JSON:

    {"version": 1, "model": "name", "full": 0, "rtt_s": 0.04,
     "cuts": [{"name": "cut0", "subgraph": 1, "cloud_part": "cut0" or "",
               "min_bandwidth_bps": 0, "max_bandwidth_bps": 2.4e6 or null,
               "inputs": [...], "outputs": [...], "predicted_s": 0.012}, ...]}
"""
from __future__ import annotations

SPLIT_KEY = "isthmus.split"
SPLIT_VERSION = 1
MIN_BANDWIDTH_KEY = "min_bandwidth_bps"   # the uplink range (bit/s) where a cut is best: [min, max)
MAX_BANDWIDTH_KEY = "max_bandwidth_bps"   # null: no upper bound
LEGACY_BANDWIDTH_KEYS = {MIN_BANDWIDTH_KEY: "min_bps", MAX_BANDWIDTH_KEY: "max_bps"}  # files written before #25

__all__ = ["SPLIT_KEY", "SPLIT_VERSION", "MIN_BANDWIDTH_KEY", "MAX_BANDWIDTH_KEY", "LEGACY_BANDWIDTH_KEYS"]
