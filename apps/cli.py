"""The `isthmus` command (`python -m isthmus`, the console script). Each subcommand lives in the module
that owns the feature and is imported only when invoked, so `isthmus --help` stays fast: this is the
top layer (apps/), which may import every package."""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from isthmus import __version__
from isthmus.apps.errors import check_common, run_command, strip_debug

# name -> (module, one-line help); the module defines add_arguments(parser) and run(args) -> int
COMMANDS = {
    "demo": ("isthmus.apps.demo", "the main demo: train on a local cluster, split, quantize, offload over an emulated link"),
    "ops": ("isthmus.core.opinfo", "list the registered ops (optionally as JSON)"),
    "partition": ("isthmus.apps.cmd_partition", "place a model between edge and cloud for a link, and explain it"),
    "profile": ("isthmus.apps.cmd_profile", "time the real kernels (isthmus's or LiteRT's; with --client the edge client too) and write a device profile"),
    "quantize": ("isthmus.apps.cmd_quantize", "quantize a model to an int8 edge file on calibration data, with a report"),
    "split": ("isthmus.apps.cmd_split", "plan a split for a link and write the edge file, cloud file, plan and report"),
    "info": ("isthmus.apps.cmd_info", "inputs, outputs, op counts, sizes and producer of any model file"),
    "health": ("isthmus.apps.cmd_health", "the gRPC health check of a server or offload service (a readiness probe)"),
    "bench": ("isthmus.apps.cmd_bench", "time a model: warm-up, median, p90/p99, per-op table, peak memory"),
    "convert": ("isthmus.apps.cmd_convert", "any model isthmus reads (ONNX, TFLite, graph file, file.py:fn) to the edge format or ONNX"),
    "import": ("isthmus.apps.graph_io", "import an ONNX or TFLite model into an isthmus graph file (-o model.graph)"),
    "export": ("isthmus.apps.graph_io", "export a graph file to ONNX or the edge format (--to onnx|edge)"),
    "edge-run": ("isthmus.edge.cli", "run an edge model file and print outputs, timings and the arena size"),
    "server": ("isthmus.cloud.server", "start one task of a cloud cluster (worker, ps) from a cluster spec or $TF_CONFIG"),
    "serve": ("isthmus.cloud.offload", "serve the cloud parts of a split model to edge clients (batched offload service)"),
}
OVERWRITING = ("import", "export", "edge-run", "profile", "partition")  # commands whose output flag gains --force here
ALIASES = {"calibrate": "profile"}  # the old name of `profile` (calibration now means quantization's)


def main(argv: Optional[List[str]] = None) -> int:
    argv, debug = strip_debug(sys.argv[1:] if argv is None else argv)
    argv = [ALIASES.get(a, a) if i == _command_index(argv) else a for i, a in enumerate(argv)]
    return run_command("isthmus " + (next((a for a in argv if not a.startswith("-")), "")).strip(),
                       lambda: _main(argv), debug)


def _command_index(argv: List[str]) -> int:
    return next((i for i, a in enumerate(argv) if not a.startswith("-")), -1)


def _main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="isthmus", description="isthmus: train one dataflow graph in the cloud, split it between edge and cloud.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--debug", action="store_true", help="on an error, show the traceback (any position)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    mod = None
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        if name == chosen:  # import only the module of the command being run
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            if name in OVERWRITING:
                p.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    if getattr(mod, "PASSTHROUGH", False):  # the command hands its other options to a script of its own
        args, rest = parser.parse_known_args(argv)
        args.args = rest
    else:
        args = parser.parse_args(argv)
    if args.version:
        print(__version__)
        return 0
    if not args.command:
        parser.print_help()
        return 2
    check_common(args)
    return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
