"""The `isthmus partition` command: place a model between the edge and the cloud and explain it.

    isthmus partition MODEL --bandwidth 5mbps --rtt 40ms [--svg g.svg] [--latency-plot l.svg]

MODEL is an ONNX or TFLite file (imported by isthmus.converters) or a Python function building
the graph, as `path/to/file.py:build` or `package.module:build`; the
function returns a Graph, or (Graph, outputs).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import List, Optional, Tuple

import numpy as np

from isthmus.converters.onnx_import import from_onnx
from isthmus.converters.tflite_import import from_tflite
from isthmus.core.graph import Graph
from isthmus.partitioner.client_cost import DEFAULT_EDGE_SLOWDOWN, HERE
from isthmus.partitioner.costmodel import CostModel
from isthmus.partitioner.devices import CLOUD, EDGE, DeviceProfile
from isthmus.partitioner.plan import ALGORITHMS, AdaptivePlanner, plan_split
from isthmus.partitioner.plots import graph_svg, latency_svg
from isthmus.partitioner.problem import Constraints
from isthmus.wire.link import LinkModel, parse_duration


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an .onnx file, or file.py:function / module:function returning a Graph")
    p.add_argument("--bandwidth", default="20mbps", help="uplink, e.g. 5mbps (default 20mbps)")
    p.add_argument("--downlink", default=None, help="downlink (default: the uplink)")
    p.add_argument("--rtt", default="40ms", help="round-trip time, e.g. 40ms")
    p.add_argument("--call-cost", default="0ms",
                   help="fixed cost of one call to the offload service beyond the RTT (RPC, queue), e.g. 1ms")
    p.add_argument("--batch", type=int, default=1, help="batch size for unknown dimensions")
    p.add_argument("--algorithm", default="mincut", choices=sorted(ALGORITHMS))
    p.add_argument("--edge-profile", default=None, help="device profile JSON (isthmus calibrate)")
    p.add_argument("--cloud-profile", default=None, help="device profile JSON (isthmus calibrate)")
    p.add_argument("--edge-slowdown", type=float, default=None,
                   help="emulate the edge as the cloud profile this many times slower")
    p.add_argument("--memory-budget", type=float, default=None, help="edge memory budget in bytes")
    p.add_argument("--svg", default=None, help="write the graph coloured by device (SVG)")
    p.add_argument("--latency-plot", default=None, help="write predicted latency vs bandwidth (SVG)")


def load_model(spec: str) -> Tuple[Graph, Optional[list]]:
    """(graph, outputs or None) from an .onnx or .tflite file, file.py:function or module:function."""
    if spec.endswith(".onnx"):
        graph, _, outputs = from_onnx(spec)
        return graph, list(outputs)
    if spec.endswith(".tflite"):
        graph, _, outputs = from_tflite(spec)
        return graph, list(outputs)
    where, sep, fn = spec.rpartition(":")
    if not sep or not fn:
        raise SystemExit(f"model {spec!r}: expected an .onnx or .tflite file, file.py:function or module:function")
    if where.endswith(".py"):
        if not os.path.exists(where):
            raise SystemExit(f"model {spec!r}: no file {where}")
        s = importlib.util.spec_from_file_location("_isthmus_model", where)
        mod = importlib.util.module_from_spec(s)
        s.loader.exec_module(mod)  # the user's own model script, run as `python file.py` would
    else:
        mod = importlib.import_module(where)  # the user's module, named on the command line
    return _as_graph(getattr(mod, fn)())


def _as_graph(result) -> Tuple[Graph, Optional[list]]:
    if isinstance(result, Graph):
        return result, None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Graph):
        return result[0], list(result[1])
    raise SystemExit(f"the model function returned {type(result).__name__}; expected a Graph or (Graph, outputs)")


def cost_model(args) -> CostModel:
    cloud = DeviceProfile.load(args.cloud_profile) if args.cloud_profile else CLOUD
    if args.edge_profile:
        edge = DeviceProfile.load(args.edge_profile)
    elif args.edge_slowdown:
        edge = cloud.scaled(args.edge_slowdown, name="edge")
    else:
        edge = EDGE
    link = LinkModel.parse(args.bandwidth, args.rtt, args.downlink).with_call_cost(parse_duration(args.call_cost))
    return CostModel.edge_cloud(link, edge, cloud, batch_size=args.batch, client=_client(args, edge))


def _client(args, edge):
    """The edge client's own cost (issue 27): the profile's client section, else this machine's
    measured client (client_cost.HERE) slowed as the edge is (--edge-slowdown, else the built-in 8x)."""
    if edge.client is not None:
        return edge.client
    return HERE.scaled(args.edge_slowdown if args.edge_slowdown and not args.edge_profile else DEFAULT_EDGE_SLOWDOWN)


def run(args) -> int:
    graph, outputs = load_model(args.model)
    return explain(graph, outputs, args)


def explain(graph: Graph, outputs: Optional[list], args) -> int:
    """Plan `graph` for the flags in `args`, print the explanation, write the plots asked for."""
    cm = cost_model(args)
    c = Constraints(edge_memory_budget=args.memory_budget if args.memory_budget is not None else "profile")
    plan = plan_split(graph, cm, outputs, c, args.algorithm)
    print(plan.explain())
    if args.svg or args.latency_plot:
        if args.svg:
            graph_svg(plan, args.svg)
            print(f"wrote {args.svg}")
        if args.latency_plot:
            planner = AdaptivePlanner(graph, cm, outputs, c, args.algorithm, bandwidths=np.logspace(5, 9, 41))
            latency_svg(planner, args.latency_plot, title=f"predicted latency, rtt {cm.link.rtt_s * 1e3:g} ms")
            print(f"wrote {args.latency_plot}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="isthmus partition", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(sys.argv[1:] if argv is None else argv))
