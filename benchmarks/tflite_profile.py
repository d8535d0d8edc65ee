"""Regenerate apps/profiles/phone-litert.json: LiteRT's kernels timed here, scaled to a phone.

    python benchmarks/tflite_profile.py [--slowdown 4] [--out apps/profiles/phone-litert.json]

`isthmus split --edge-format tflite` plans with this profile when no --edge-profile is given (the edge
part runs in LiteRT, so its cut is priced by LiteRT's speed). It is `isthmus profile --runtime litert`'s
measurement (converters/litert_profile.calibrate_litert: the partitioner's calibration cases as .tflite
files, one LiteRT thread, full level) on one core of this machine kind, times --slowdown (4: a
Cortex-A76-class big core against a server core with XNNPACK on both, the factor phone.json's client
section uses), with phone.json's memory budget and client section (the same phone, the same client
estimate). The profile's name says where it came from; the plan's report prints it.
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
    p.add_argument("--slowdown", type=float, default=4.0)
    p.add_argument("--out", default=os.path.join(PROFILES, "phone-litert.json"))
    args = p.parse_args(argv)
    from isthmus.converters.litert_profile import calibrate_litert
    from isthmus.partitioner.devices import DeviceProfile
    phone = DeviceProfile.load(os.path.join(PROFILES, "phone.json"))
    import ai_edge_litert
    day = datetime.date.today().isoformat()
    name = (f"phone-litert (LiteRT {ai_edge_litert.__version__} kernels timed on one core of an {cpu_name()} "
            f"on {day}, x {args.slowdown:g} for a Cortex-A76-class core; benchmarks/tflite_profile.py)")
    profile = calibrate_litert(name, level="full", slowdown=args.slowdown, threads=1)
    profile = replace(profile, name=name, memory_budget=phone.memory_budget, client=phone.client)
    profile.save(args.out)
    print(f"wrote {args.out}: {name}; {len(profile.op_coeffs)} op types")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
