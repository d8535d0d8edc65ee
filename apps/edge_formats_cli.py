"""`isthmus split --edge-format tflite|onnx`: a split's edge parts also in a phone runtime's format
(converters/edge_formats.write_edge_parts), written to DIR/<format>/ next to the isthmus files."""
from __future__ import annotations

import os

from .errors import UsageError

FORMATS = ("isth", "tflite", "onnx")


def write_phone_parts(edge_file: str, out_dir: str, edge_format: str, force: bool = False) -> str:
    """Write every cut of the split `edge_file` as `edge_format` files into out_dir/<format>/; a summary line.
    tflite needs the `tflite` extra (and LiteRT to run the files), onnx only onnx."""
    if edge_format == "isth":
        return ""
    if edge_format not in FORMATS:
        raise UsageError(f"--edge-format {edge_format}: one of {', '.join(FORMATS)}")
    # deferred: the graph machinery (isthmus.core), loaded only by the commands that need it
    from isthmus.converters.edge_formats import write_edge_parts
    folder = os.path.join(out_dir, edge_format)
    if os.path.exists(os.path.join(folder, "parts.json")) and not force:
        raise UsageError(f"-o {out_dir}: already holds {edge_format}/parts.json; pass --force to overwrite")
    written = write_edge_parts(edge_file, folder, edge_format)
    return f"{edge_format} edge parts: {len(written) - 1} files and parts.json in {folder}"
