"""`isthmus partition MODEL`: apps/partition.py's plan explanation, for every model format isthmus
reads (graph files included) and with its errors reported like a tool's."""
from __future__ import annotations

from .deploy import PHONE_PROFILE, load_profile, parse_link
from .model_source import load_model, parse_input_shapes
from .partition import add_arguments as _partition_arguments
from .partition import explain


def add_arguments(p) -> None:
    _partition_arguments(p)
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,..",
                   help="ONNX: shape of an input the file leaves unknown (repeatable)")


def run(args) -> int:
    parse_link(args.bandwidth, args.rtt, args.downlink)
    load_profile(args.edge_profile)
    if args.edge_profile == "phone":
        args.edge_profile = PHONE_PROFILE
    load_profile(args.cloud_profile, "--cloud-profile")
    m = load_model(args.model, parse_input_shapes(args.input_shape))
    return explain(m.graph, list(m.outputs.values()), args)
