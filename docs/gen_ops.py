"""Regenerate docs/ops.md from the op registry: `python docs/gen_ops.py` (a test fails when stale)."""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def render() -> str:
    from isthmus.converters.edge_export import EDGE_OPS
    from isthmus.converters.onnx_export import exportable_ops
    from isthmus.core.opinfo import op_table
    onnx_out = set(exportable_ops())
    lines = ["# Op coverage", "",
             "Generated from the registry by `python docs/gen_ops.py`; do not edit by hand.", "",
             "| op | inputs | gradient | ONNX export | edge kernel | what it does |",
             "|---|---|---|---|---|---|"]
    rows = op_table()
    for r in rows:
        doc = (r["doc"] or "").replace("|", "/").splitlines()[0] if r["doc"] else ""
        lines.append(f"| `{r['op']}` | {', '.join(r['inputs'])} | {'yes' if r['gradient'] else ''} | "
                     f"{'yes' if r['op'] in onnx_out else ''} | {'yes' if r['op'] in EDGE_OPS else ''} | {doc} |")
    lines += ["", f"{len(rows)} ops; {sum(r['gradient'] for r in rows)} with gradients, "
              f"{len(onnx_out & {r['op'] for r in rows})} exportable to ONNX, "
              f"{len(set(EDGE_OPS) & {r['op'] for r in rows})} with edge kernels.", ""]
    return "\n".join(lines)


def main() -> int:
    with open(os.path.join(HERE, "ops.md"), "w", encoding="utf-8") as f:
        f.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
