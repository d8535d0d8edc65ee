"""`isthmus profile --runtime isthmus|litert|onnxruntime|edge-int8|edge-fp32`: a device profile timed in isthmus's
kernels (the partitioner's calibrate command), in LiteRT (converters/litert_profile), in onnxruntime
(converters/ort_profile) or in the edge interpreter, the JSON `split --edge-profile` reads;
with `--client`, also the offload client's own cost measured here (apps/client_measure.py), scaled by --slowdown,
as the profile's `client` section, and with `--parts int8|fp32` an edge part's cost beyond its kernels
(apps/part_measure.py) as its `part` section, both of which `isthmus split` prices."""
from __future__ import annotations

import argparse
from dataclasses import replace

from .client_measure import measure_client_cost
from .errors import UsageError, positive_int, refuse_overwrite
from .part_measure import measure_part_cost

EXAMPLES = """examples:
  isthmus profile --device cloud --out cloud.json
  isthmus profile --device phone-litert --runtime litert --slowdown 4 --out phone-litert.json
  isthmus profile --device phone-ort --runtime onnxruntime --slowdown 4 --out phone-ort.json
  isthmus split cnn.onnx --edge-format tflite --edge-profile phone-litert.json -o deploy/"""

RUNTIMES = ("isthmus", "litert", "onnxruntime", "edge-int8", "edge-fp32")
DEFAULT_DEVICE = {"isthmus": "cloud", "litert": "edge-litert", "onnxruntime": "edge-ort", "edge-int8": "edge-int8",
                  "edge-fp32": "edge-fp32"}
# the timed runtimes other than isthmus's own: (its name in messages, pip's hint, split's --edge-format)
PEERS = {"litert": ("LiteRT", "pip install 'isthmus[litert]'", "tflite"),
         "onnxruntime": ("onnxruntime", "pip install onnxruntime", "onnx")}
NOT_FOR_LITERT = (("from_trace", "--from-trace"), ("base", "--base"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    from isthmus.partitioner import calibrate  # deferred: partitioner.calibrate loads scipy
    calibrate.add_arguments(p)
    p.epilog, p.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.set_defaults(device=None)  # the default name depends on --runtime (DEFAULT_DEVICE)
    for action in p._actions:
        if action.dest == "device":
            action.help = ("name of the profile to write (default: cloud; edge-litert with --runtime litert, edge-ort "
                           "with --runtime onnxruntime)")
    p.add_argument("--runtime", choices=RUNTIMES, default="isthmus",
                   help="whose kernels to time: isthmus's core (default), its edge interpreter's (edge-int8, edge-fp32: "
                        "each case as an edge model; price an int8 edge part with edge-int8), or LiteRT's, running each calibration case as "
                        "a .tflite file (needs ai-edge-litert; --blas-threads then sets LiteRT's threads, default 1), or onnxruntime's, "
                        "running each case as isthmus's ONNX edge part (needs onnxruntime; --blas-threads: its "
                        "intra-op threads). Plan a split whose edge part runs in LiteRT (split --edge-format tflite) "
                        "with a litert profile, one that onnxruntime runs (--edge-format onnx) with an onnxruntime one")
    p.add_argument("--client", action="store_true",
                   help="also measure the edge offload client's own cost per request here (against an in-process "
                        "service on 127.0.0.1, a few seconds) and write it, x --slowdown, as the profile's client "
                        "section; without it `isthmus split` assumes a documented default")
    p.add_argument("--parts", choices=("int8", "fp32"), default=None,
                   help="also measure what an edge part costs beyond its kernels (the interpreter's call, quantizing "
                        "at the cut, the client's glue, and the caches it finds cold after an idle, as a curve of the "
                        "idle) on edge parts of several sizes in this format, run by the offload client against an "
                        "in-process service at 8x and 20x interleaved (about 60 s), and write it, x --slowdown, as the "
                        "profile's part section, which every plan prices")
    p.add_argument("--client-requests", type=positive_int, default=10,
                   help="with --client: requests timed per cut (edge-only, split, cloud-only; default %(default)s)")


def run(args) -> int:
    runtime = getattr(args, "runtime", "isthmus")
    if args.device is None:
        args.device = DEFAULT_DEVICE[runtime]
        if not args.from_trace:
            refuse_overwrite(args.out or f"{args.device}.json", args, "--out")
    if runtime == "isthmus":
        from isthmus.partitioner import calibrate  # deferred: partitioner.calibrate loads scipy
        rc = calibrate.run(args)
    elif runtime in PEERS:
        rc = _run_peer(args, runtime)
    else:
        rc = _run_edge(args, int8=runtime == "edge-int8")
    if not rc and getattr(args, "client", False):
        rc = _add_client(args)
    if not rc and getattr(args, "parts", None):
        rc = _add_parts(args)
    return rc


def _add_parts(args) -> int:
    """Measure an edge part's cost beyond its kernels here and write it, x --slowdown, into the profile."""
    from isthmus.partitioner.devices import DeviceProfile  # deferred: partitioner.devices loads scipy
    out = args.out or f"{args.device}.json"
    written = DeviceProfile.load(out)
    # the kernels as this profile prices them on this machine (1x, no part yet): kernel_scale is fitted against them
    here = replace(written.scaled(1.0 / args.slowdown) if args.slowdown != 1.0 else written, part=None, client=None)
    part = measure_part_cost(int8=args.parts == "int8", slowdown=args.slowdown, profile=here, quick=args.quick)
    replace(written, part=part).save(out)
    print(f"wrote the part section of {out} ({args.parts} edge parts): {part.describe()}"
          + (f" (measured here x {args.slowdown:g})" if args.slowdown != 1.0 else " (measured here)"))
    return 0


def _add_client(args) -> int:
    """Measure the offload client's own cost here and write it, x --slowdown, into the profile just written."""
    from isthmus.partitioner.devices import DeviceProfile  # deferred: partitioner.devices loads scipy
    out = args.out or f"{args.device}.json"
    client = measure_client_cost(args.client_requests, slowdown=args.slowdown)
    replace(DeviceProfile.load(out), client=client).save(out)
    print(f"wrote the client section of {out}: {client.describe()}"
          + (f" (measured here x {args.slowdown:g})" if args.slowdown != 1.0 else " (measured here)"))
    return 0


def _run_edge(args, int8: bool) -> int:
    """Time the calibration cases in the edge interpreter (int8 or fp32 models), fit, write the profile."""
    for attr, flag in NOT_FOR_LITERT:
        if getattr(args, attr, None):
            raise UsageError(f"{flag}: refits isthmus traces; not with --runtime {args.runtime}")
    # deferred: converters.edge_profile loads flatbuffers, scipy
    from isthmus.converters.edge_profile import OPS, calibrate_edge
    unknown = [op for op in args.ops or () if op not in OPS]
    if unknown:
        raise UsageError(f"--ops {' '.join(unknown)}: the edge interpreter is timed on {', '.join(OPS)} only")
    out = args.out or f"{args.device}.json"
    profile = calibrate_edge(args.device, args.ops, "quick" if args.quick else "full", int8=int8,
                             slowdown=args.slowdown, path=out)
    print(f"wrote {out}: edge interpreter profile '{profile.name}' ({'int8' if int8 else 'fp32'} kernels), "
          f"{len(profile.op_coeffs)} op types on one thread, {args.slowdown:g}x slower than measured here")
    return 0


def _run_peer(args, runtime: str) -> int:
    """Time the calibration cases in LiteRT or onnxruntime, fit, write the profile; one summary line."""
    label, hint, fmt = PEERS[runtime]
    for attr, flag in NOT_FOR_LITERT:
        if getattr(args, attr, None):
            raise UsageError(f"{flag}: refits isthmus traces; not with --runtime {runtime}")
    if args.clock != "wall":
        raise UsageError(f"--clock {args.clock}: --runtime {runtime} times wall clock only ({label}'s threads are "
                         "its own)")
    if args.device.lower() == "gpu":
        raise UsageError(f"--device gpu: --runtime {runtime} times {label} on this machine's CPU")
    try:  # optional dependencies: an ImportError becomes a usage error
        if runtime == "onnxruntime":
            import onnxruntime  # noqa: F401  # deferred: optional and heavy
        else:
            import ai_edge_litert.interpreter  # noqa: F401  # deferred: optional
    except ImportError:
        raise UsageError(f"--runtime {runtime} needs {label} ({hint})") from None
    # deferred: converters.litert_profile / ort_profile load flatbuffers, scipy (and onnx)
    from isthmus.converters.litert_profile import OPS, calibrate_litert
    calibrate = calibrate_litert
    if runtime == "onnxruntime":
        # deferred: converters.ort_profile loads onnx
        from isthmus.converters.ort_profile import calibrate_ort as calibrate
    unknown = [op for op in args.ops or () if op not in OPS]
    if unknown:
        raise UsageError(f"--ops {' '.join(unknown)}: {label} is timed on {', '.join(OPS)} only")
    threads = args.blas_threads or 1
    if threads < 1:
        raise UsageError(f"--blas-threads {threads}: must be at least 1")
    out = args.out or f"{args.device}.json"
    profile = calibrate(args.device, args.ops, "quick" if args.quick else "full", slowdown=args.slowdown,
                        threads=threads, path=out)
    print(f"wrote {out}: {label} profile '{profile.name}', {len(profile.op_coeffs)} op types on {threads} {label} "
          f"thread(s), {args.slowdown:g}x slower than measured here; plan with: isthmus split MODEL "
          f"--edge-format {fmt} --edge-profile {out} -o DIR")
    return 0
