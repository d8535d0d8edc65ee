"""`isthmus split MODEL -o DIR`: plan a split for a link and write the edge file, the cloud file,
the plan (JSON + SVG) and a report, through apps.deploy.deploy_split."""
from __future__ import annotations

import argparse
import sys

from .deploy import SHIPPED_PROFILES, deploy_split
from .edge_formats_cli import write_phone_parts
from .errors import positive_int
from .model_source import parse_input_shapes

EXAMPLES = """examples:
  isthmus split cnn.onnx --bandwidth 5mbps --rtt 40ms -o deploy/
  isthmus split cnn.onnx --edge-profile phone --int8 --calibration-data calib.npz -o deploy/
  isthmus split cnn.onnx --edge-format tflite -o deploy/     # also deploy/tflite/cutN.tflite, priced for LiteRT
  isthmus split cnn.onnx --edge-format onnx -o deploy/       # deploy/onnx/cutN.onnx, priced for onnxruntime
  isthmus profile --device my-phone --runtime litert --slowdown 1 --out my-phone.json        # on the device
  isthmus split cnn.onnx --edge-format tflite --edge-profile my-phone.json -o deploy/
  isthmus serve deploy/model.cloud --port 7070 &
  isthmus edge-run deploy/model.isth --cloud 127.0.0.1:7070 --input image=x.npy"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog, p.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument("model", help="an .onnx, .tflite or .graph file, or file.py:function")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder for the files (created)")
    p.add_argument("--bandwidth", default="5mbps", help="uplink, e.g. 5mbps (default %(default)s)")
    p.add_argument("--downlink", default=None, help="downlink (default: the uplink)")
    p.add_argument("--rtt", default="40ms", help="round-trip time, e.g. 40ms (default %(default)s)")
    p.add_argument("--edge-profile", default=None,
                   help="device profile JSON of the edge (isthmus profile writes one, --runtime litert for an edge "
                        "part run by LiteRT); 'phone' / 'phone-litert' / 'phone-ort' for the ones that ship with "
                        "isthmus (the isthmus interpreter / LiteRT / onnxruntime on a phone); default: phone-litert "
                        "with --edge-format tflite, phone-ort with onnx, else this machine 8x slower")
    p.add_argument("--cloud-profile", default=None, help="device profile JSON of the cloud")
    p.add_argument("--int8", action="store_true",
                   help="quantize the edge parts to int8 (needs --calibration-data unless the model is in QDQ form)")
    p.add_argument("--calibration-data", default=None, metavar="NPZ",
                   help="sample inputs, by input name, samples along axis 0")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,..",
                   help="shape of an input whose dims the model leaves unknown (repeatable)")
    p.add_argument("--batch", type=positive_int, default=1, help="batch size for unknown leading dims")
    p.add_argument("--force", action="store_true", help="overwrite the files in DIR")
    p.add_argument("--edge-format", choices=["isth", "tflite", "onnx"], default="isth",
                   help="also write the edge parts for LiteRT (.tflite) or ONNX Runtime Mobile (.onnx) into DIR/FORMAT/")


DEFAULT_EDGE_PROFILE = {"tflite": "phone-litert", "onnx": "phone-ort"}   # the runtime that runs the edge part prices it
PHONE_HINT = ("isthmus split: note: --edge-profile phone prices isthmus's edge interpreter; the .tflite parts run "
              "in LiteRT, which --edge-profile phone-litert (or a profile from isthmus profile --runtime litert) prices")


def edge_profile_for(args) -> tuple:
    """(the --edge-profile to plan with, the line saying which profile priced the edge and why)."""
    fmt = getattr(args, "edge_format", "isth")
    if args.edge_profile:
        return args.edge_profile, ""
    default = DEFAULT_EDGE_PROFILE.get(fmt)
    if default is None:
        return None, ""
    return default, (f"isthmus split: the edge is priced by the {default} profile ({SHIPPED_PROFILES[default]}), "
                     f"the default for --edge-format {fmt}; --edge-profile FILE overrides it")


def run(args) -> int:
    edge_profile, priced_by = edge_profile_for(args)
    if getattr(args, "edge_format", "isth") == "tflite" and args.edge_profile == "phone":
        print(PHONE_HINT, file=sys.stderr)
    dep = deploy_split(args.model, args.output, args.bandwidth, args.rtt, edge_profile, args.cloud_profile,
                       int8=args.int8, calibration=args.calibration_data, downlink=args.downlink,
                       input_shapes=parse_input_shapes(args.input_shape), batch=args.batch, force=args.force)
    if priced_by:
        print(priced_by)
    print(dep.report)
    if getattr(args, "edge_format", "isth") != "isth":
        print(write_phone_parts(dep.edge_file, args.output, args.edge_format, force=args.force))
    return 0
