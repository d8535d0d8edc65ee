"""Regenerate apps/profiles/phone-litert.json (or phone-ort.json): a phone runtime's kernels timed here, scaled.

    python benchmarks/tflite_profile.py [--runtime litert|onnxruntime] [--slowdown 4] [--out FILE]

`isthmus split --edge-format tflite` plans with phone-litert.json when no --edge-profile is given (the
edge part runs in LiteRT, so its cut is priced by LiteRT's speed), `--edge-format onnx` with
phone-ort.json. Each is the calibration cases of the partitioner (full level, one thread) timed on one
core of this machine kind in that runtime (converters/litert_profile.calibrate_litert, the measurement
of `isthmus profile --runtime litert`; converters/ort_profile.calibrate_ort for onnxruntime), times
--slowdown (4: a Cortex-A76-class big core against a server core with tuned SIMD kernels on both, the
factor phone.json's client section uses), with phone.json's memory budget and client section (the same
phone, the same client estimate). The profile's name says where it came from; the plan's report prints it.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
PROFILES = os.path.join(HERE, "..", "apps", "profiles")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.machine())
    except OSError:
        return platform.machine()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime", choices=["litert", "onnxruntime"], default="litert")
    p.add_argument("--slowdown", type=float, default=4.0)
    p.add_argument("--out", default=None, help="default apps/profiles/phone-litert.json or phone-ort.json")
    args = p.parse_args(argv)
    from isthmus.partitioner.devices import DeviceProfile
    phone = DeviceProfile.load(os.path.join(PROFILES, "phone.json"))
    if args.runtime == "litert":
        import ai_edge_litert as lib
        from isthmus.converters.litert_profile import calibrate_litert as calibrate
        short, label = "phone-litert", f"LiteRT {lib.__version__}"
    else:
        import onnxruntime as lib
        from isthmus.converters.ort_profile import calibrate_ort as calibrate
        short, label = "phone-ort", f"onnxruntime {lib.__version__}"
    args.out = args.out or os.path.join(PROFILES, short + ".json")
    day = datetime.date.today().isoformat()
    name = (f"{short} ({label} kernels timed on one core of an {cpu_name()} on {day}, x {args.slowdown:g} for "
            "a Cortex-A76-class core; benchmarks/tflite_profile.py)")
    profile = calibrate(name, level="full", slowdown=args.slowdown, threads=1)
    profile = replace(profile, name=name, memory_budget=phone.memory_budget, client=phone.client)
    profile.save(args.out)
    print(f"wrote {args.out}: {name}; {len(profile.op_coeffs)} op types")
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    raise SystemExit(main())
