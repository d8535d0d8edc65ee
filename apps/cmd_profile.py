"""`isthmus profile`: partitioner/calibrate.py's command (time the kernels, write a device profile),
plus `--client`: measure the offload client's own cost here (apps/client_measure.py) and write it,
scaled by --slowdown, as the profile's `client` section, which `isthmus split` prices."""
from __future__ import annotations

import argparse
from dataclasses import replace

from isthmus.partitioner import calibrate

from .errors import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    calibrate.add_arguments(p)
    p.add_argument("--client", action="store_true",
                   help="also measure the edge offload client's own cost per request here (against an in-process "
                        "service on 127.0.0.1, a few seconds) and write it, x --slowdown, as the profile's client "
                        "section; without it `isthmus split` assumes a documented default")
    p.add_argument("--client-requests", type=positive_int, default=10,
                   help="with --client: requests timed per cut (edge-only, split, cloud-only; default %(default)s)")


def run(args) -> int:
    rc = calibrate.run(args)
    if rc or not getattr(args, "client", False):
        return rc
    from isthmus.partitioner.devices import DeviceProfile
    from .client_measure import measure_client_cost
    out = args.out or f"{args.device}.json"
    client = measure_client_cost(args.client_requests, slowdown=args.slowdown)
    replace(DeviceProfile.load(out), client=client).save(out)
    print(f"wrote the client section of {out}: {client.describe()}"
          + (f" (measured here x {args.slowdown:g})" if args.slowdown != 1.0 else " (measured here)"))
    return 0
