"""A split model's edge parts in a phone runtime's format: one file per cut, plus the full model.

    files = write_edge_parts("deploy/model.isth", "deploy/tflite", "tflite")
    # deploy/tflite/cut1.tflite (sends to cloud part cut1), ..., full.tflite (local fallback),
    # deploy/tflite/parts.json (which file is which cut, its link range, wire names)

What `isthmus split --edge-format tflite|onnx` writes beside the .isth file (the command itself is
apps/'s): every cut that has a cloud part becomes <cut>.tflite or <cut>.onnx (and <cut>.post.tflite /
<cut>.post.onnx where the edge works on after the cloud's answer); the split's full model (the
fallback, and the cut of links where everything stays on the edge) becomes full.tflite / full.onnx. parts.json lists
them with each cut's uplink range from the split file, so an app picks the file for its link.
split_cut picks one cut out of a split file for both writers (tflite_write.py, onnx_edge.py).
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple, Union

from isthmus.edge.loader import verify_all
from isthmus.wire.split_format import MAX_BANDWIDTH_KEY, MIN_BANDWIDTH_KEY, SPLIT_KEY

FORMATS = ("tflite", "onnx")


def split_cut(split: Union[bytes, str], cut: Optional[str], error: type) -> Tuple[dict, dict, object, object]:
    """(split metadata, the cut's entry, its edge model, the cloud call it makes) for one cut of a
    split model (bytes or a path); default the first cut with a cloud part. Refusals raise `error`."""
    if isinstance(split, str):
        with open(split, "rb") as f:
            split = f.read()
    models = verify_all(split)
    info = json.loads(models[0].metadata.get(SPLIT_KEY, "null") or "null")
    if not info:
        raise error(f"not a split model: no '{SPLIT_KEY}' metadata")
    cuts = [c for c in info["cuts"] if c["cloud_part"]]
    pick = [c for c in cuts if c["name"] == cut] if cut else cuts[:1]
    if not pick:
        raise error(f"split model: no cut {cut!r} with a cloud part (cuts with one: "
                    f"{', '.join(c['name'] for c in cuts) or 'none'})")
    m = models[pick[0]["subgraph"]]
    return info, pick[0], m, next(r for r in m.remote if r.name == pick[0]["cloud_part"])


def write_edge_parts(split_path: str, out_dir: str, edge_format: str = "tflite", **options) -> List[str]:
    """Write the split's edge parts as `edge_format` files into out_dir; the paths written.
    `options`: edge_to_tflite's (input_type, output_type, layouts) for tflite."""
    if edge_format not in FORMATS:
        raise ValueError(f"edge format {edge_format!r}: one of {', '.join(FORMATS)}")
    with open(split_path, "rb") as f:
        data = f.read()
    models = verify_all(data)
    raw = models[0].metadata.get(SPLIT_KEY)
    if not raw:
        raise ValueError(f"{split_path}: not a split model (no '{SPLIT_KEY}' metadata)")
    info = json.loads(raw)
    os.makedirs(out_dir, exist_ok=True)
    written: List[str] = []
    parts: List[Dict[str, object]] = []

    def put(name: str, blob: bytes) -> str:
        path = os.path.join(out_dir, name)
        with open(path + ".tmp", "wb") as f:
            f.write(blob)
        os.replace(path + ".tmp", path)
        written.append(path)
        return os.path.basename(path)

    if info.get("full") is not None:
        full = models[info["full"]]
        name = put(f"full.{edge_format}", _whole(full, edge_format, options))
        parts.append({"cut": "full", "file": name, "cloud_part": ""})
    for c in info["cuts"]:
        entry = {"cut": c["name"], "cloud_part": c["cloud_part"], "min_bandwidth_bps": c.get(MIN_BANDWIDTH_KEY),
                 "max_bandwidth_bps": c.get(MAX_BANDWIDTH_KEY), "wire_inputs": c["inputs"],
                 "wire_outputs": c["outputs"]}
        if not c["cloud_part"]:
            entry["file"] = f"full.{edge_format}"
        elif edge_format == "tflite":
            from .tflite_write import split_to_tflite  # cycle: converters.edge_formats <-> converters.tflite_write
            part = split_to_tflite(data, cut=c["name"], **options)
            entry["file"] = put(f"{c['name']}.tflite", part.edge)
            if part.post is not None:
                entry["post_file"] = put(f"{c['name']}.post.tflite", part.post)
        else:
            from .onnx_edge import split_to_onnx  # cycle: converters.edge_formats <-> converters.onnx_edge
            part = split_to_onnx(data, cut=c["name"])
            entry["file"] = put(f"{c['name']}.onnx", part.edge.SerializeToString())
            if part.post is not None:
                entry["post_file"] = put(f"{c['name']}.post.onnx", part.post.SerializeToString())
        parts.append(entry)
    put("parts.json", json.dumps({"model": info.get("model", ""), "format": edge_format, "parts": parts},
                                 indent=1, sort_keys=True).encode("utf-8"))
    return written


def _whole(model, edge_format: str, options) -> bytes:
    if edge_format == "tflite":
        from .tflite_write import edge_to_tflite  # cycle: converters.edge_formats <-> converters.tflite_write
        return edge_to_tflite(model, **options)
    from .onnx_edge import edge_to_onnx  # cycle: converters.edge_formats <-> converters.onnx_edge
    return edge_to_onnx(model).SerializeToString()


__all__ = ["write_edge_parts", "FORMATS"]
