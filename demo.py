"""`isthmus demo`: the main demo. Today it trains on real data, checkpoints, restores in a fresh
process and evaluates (examples/train_digits.py); the split edge/cloud demo replaces it when
the offload service lands."""
from __future__ import annotations

import os
import runpy
import sys


def add_arguments(parser) -> None:
    parser.add_argument("--model", choices=["mlp", "cnn", "both"], default="both")
    parser.add_argument("--epochs", type=int, default=0)
    parser.add_argument("--ckpt-dir", default=os.path.join("runs", "digits"))


def run(args) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "examples", "train_digits.py")
    if not os.path.exists(script):
        print("the demo needs the repository checkout (pip install -e .): examples/train_digits.py not found",
              file=sys.stderr)
        return 2
    mod = runpy.run_path(script, run_name="isthmus_demo")
    return mod["main"](["--model", args.model, "--epochs", str(args.epochs), "--ckpt-dir", args.ckpt_dir])
