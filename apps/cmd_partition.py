"""`isthmus partition MODEL`: apps/partition.py's plan explanation, for every model format isthmus
reads (graph files included) and with its errors reported like a tool's."""
from __future__ import annotations

from isthmus.wire.link import parse_duration

from .deploy import PHONE_PROFILE, load_profile, parse_link
from .errors import UsageError
from .model_source import load_model, parse_input_shapes
from .partition import add_arguments as _partition_arguments
from .partition import explain


def add_arguments(p) -> None:
    _partition_arguments(p)
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,..",
                   help="ONNX: shape of an input the file leaves unknown (repeatable)")


def run(args) -> int:
    parse_link(args.bandwidth, args.rtt, args.downlink)
    _check_call_cost(args.call_cost)
    load_profile(args.edge_profile)
    if args.edge_profile == "phone":
        args.edge_profile = PHONE_PROFILE
    load_profile(args.cloud_profile, "--cloud-profile")
    m = load_model(args.model, parse_input_shapes(args.input_shape))
    return explain(m.graph, list(m.outputs.values()), args)


def _check_call_cost(text: str) -> None:
    """--call-cost is a duration of 0 or more, named in the error."""
    try:
        v = parse_duration(text)
    except ValueError as e:
        raise UsageError(f"--call-cost {text}: {e}") from None
    if not v >= 0:
        raise UsageError(f"--call-cost {text}: must be 0 or more")
