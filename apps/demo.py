"""`isthmus demo`: the main demo (examples/edge_cloud_demo.py): train a CNN on a local cloud cluster,
split it for an emulated link, quantize the edge part, start the offload service and run the edge
client against it over loopback. Arguments after `demo` go to the script (`isthmus demo --help-demo`
lists them)."""
from __future__ import annotations

import os
import runpy
import sys


PASSTHROUGH = True  # cli.py hands every other option to the demo script


def add_arguments(parser) -> None:
    parser.add_argument("--help-demo", action="store_true",
                        help="list the demo's own options (e.g. --epochs 4 --bandwidth 5mbps --rtt 40ms)")


def run(args) -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root (the package)
    script = os.path.join(root, "examples", "edge_cloud_demo.py")
    if not os.path.exists(script):
        print("the demo needs the repository checkout (pip install -e .): examples/edge_cloud_demo.py not found",
              file=sys.stderr)
        return 2
    mod = runpy.run_path(script, run_name="isthmus_demo")
    return mod["main"](["--help"] if args.help_demo else list(args.args))
