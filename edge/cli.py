"""`isthmus edge-run MODEL.isth --input x.npy`: run an edge model, print outputs, timings and the
arena size. Inputs are `name=x.npy` (one per model input), .npy files in input order, or one .npz
(arrays by input name, or in order), loaded without pickle; without --input, --random-input or
--zeros the command stops and says so.

With `--cloud HOST:PORT` the model is a split model (converters/split_export.py) and runs through
the offload client: each cut's tensors go to the offload service, with local fallback, and the
client's stats are printed as JSON. `--emulate-link 5mbps --rtt 40ms` adds bytes / bandwidth + RTT
to every transfer (a demo of the adaptive cut on loopback). A cloud that cannot be reached or
refuses the client is reported on stderr (the model then runs locally); `--require-cloud` makes
that an error (exit 1)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from ..wire.security import ClientSecurity, SecurityError
from .format import EdgeModelError
from .interpreter import Interpreter
from .link_emulation import EmulatedLink
from .loader import load
from .offload_client import CloudError, OffloadClient
from .split_model import load_split


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an edge model file (.isth); a .tflite (--runtime litert) or .onnx "
                                 "(--runtime onnxruntime) written by isthmus")
    p.add_argument("--runtime", choices=["isthmus", "litert", "onnxruntime"], default="isthmus",
                   help="litert: run a .tflite in LiteRT (edge/cli_litert.py; needs the tflite and litert extras); "
                        "onnxruntime: run an .onnx in onnxruntime (edge/cli_onnxruntime.py)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=X.npy",
                   help="an input array (repeatable); or a .npy file per model input, in order; or one .npz")
    p.add_argument("--random-input", action="store_true", help="run on uniform random inputs (seed 0)")
    p.add_argument("--zeros", action="store_true", help="run on all-zero inputs")
    p.add_argument("--repeat", type=_count, default=20, help="timed runs (median reported; default %(default)s)")
    p.add_argument("--save", default=None, help="write the first output to this .npy file")
    p.add_argument("--cloud", default=None, metavar="HOST:PORT", help="offload service of a split model")
    p.add_argument("--require-cloud", action="store_true",
                   help="with --cloud: exit 1 when no request reached the cloud (unreachable, refused, deadline)")
    p.add_argument("--deadline-ms", type=float, default=1000.0,
                   help="per-request deadline with --cloud (default %(default)s)")
    p.add_argument("--token-file", default=None,
                   help="bearer token for the offload service (default: $ISTHMUS_TOKEN_FILE)")
    p.add_argument("--tls-ca", default=None,
                   help="CA to check the service's certificate: use TLS (default: $ISTHMUS_TLS_CA)")
    p.add_argument("--tls-cert", default=None, help="this client's certificate (mutual TLS)")
    p.add_argument("--tls-key", default=None, help="the key of --tls-cert")
    p.add_argument("--emulate-link", default=None, metavar="BANDWIDTH",
                   help="emulate an uplink, e.g. 5mbps (with --cloud)")
    p.add_argument("--rtt", default="40ms", help="round trip of the emulated link (default %(default)s)")
    p.add_argument("--cut", default="auto", metavar="NAME",
                   help="with --cloud: run every request on this cut of the split (its name in `isthmus info`) "
                        "instead of following the measured link (default %(default)s)")


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def _load(path: str, flag: str = "--input"):
    if not os.path.isfile(path):
        raise SystemExit(f"{flag} {path}: no such file")
    try:
        return np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001  (empty, truncated or not an array file)
        raise SystemExit(f"{flag} {path}: not a .npy/.npz array file ({type(e).__name__}: {e})") from None


def _inputs(paths, names, shapes, how: str = ""):
    if not paths:
        if how == "random":
            rng = np.random.default_rng(0)
            return [rng.random(s).astype(np.float32) for s in shapes]
        if how != "zeros":
            raise SystemExit("no input given: pass --input NAME=X.npy (one per input: " + ", ".join(names)
                             + "), --random-input or --zeros")
        return [np.zeros(s, np.float32) for s in shapes]
    named = {}
    for item in paths:
        name, sep, path = item.partition("=")
        if sep and name in names:
            named[name] = _load(path, f"--input {name}=")
        elif sep and not os.path.exists(item):
            raise SystemExit(f"--input {item}: the model has no input '{name}' (its inputs: {', '.join(names)})")
    if named:
        if len(named) != len(paths) or set(named) != set(names):
            raise SystemExit(f"--input: give NAME=X.npy for every input ({', '.join(names)}), not a mix")
        return [named[n] for n in names]
    if len(paths) == 1 and paths[0].endswith(".npz"):
        with _load(paths[0]) as z:
            keys = list(z.keys())
            if all(n in z for n in names):
                return [z[n] for n in names]
            if len(keys) == len(names):
                return [z[k] for k in keys]
            raise SystemExit(f"{paths[0]} holds {keys}; the model takes {', '.join(names)}")
    if len(paths) != len(names):
        raise SystemExit(f"the model takes {len(names)} inputs ({', '.join(names)}); got {len(paths)} --input files")
    return [_load(p) for p in paths]


def _parse_rate(text: str, units, what: str) -> float:
    t = text.strip().lower()
    for u, k in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if t.endswith(u):
            try:
                return float(t[: -len(u)]) * k
            except ValueError:
                break
    raise SystemExit(f"cannot read {what} {text!r}; e.g. " + ", ".join(f"5{u}" for u in units))


def _how(args) -> str:
    if args.input and (args.random_input or args.zeros):
        raise SystemExit("--input excludes --random-input and --zeros")
    return "random" if args.random_input else "zeros" if args.zeros else ""


def run(args) -> int:
    _how(args)
    if not args.cloud:  # flags that only mean something with a cloud are refused, not ignored
        given = [f for f, v in (("--require-cloud", args.require_cloud), ("--cut", args.cut != "auto"),
                                ("--token-file", args.token_file), ("--tls-ca", args.tls_ca),
                                ("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)) if v]
        if given:
            raise SystemExit(f"{given[0]} needs --cloud HOST:PORT")
    if getattr(args, "runtime", "isthmus") == "litert":
        from .cli_litert import run_litert  # cycle: edge.cli <-> edge.cli_litert (via edge.cli_phone)
        return run_litert(args)
    if getattr(args, "runtime", "isthmus") == "onnxruntime":
        from .cli_onnxruntime import run_onnxruntime  # cycle: edge.cli <-> edge.cli_onnxruntime (via edge.cli_phone)
        return run_onnxruntime(args)
    if args.cloud:
        return _run_split(args)
    t0 = time.perf_counter()
    try:
        interp = Interpreter(args.model)
    except EdgeModelError as e:
        if "subgraph" not in str(e):
            raise
        split = load_split(args.model)  # a split model without --cloud: its full model, locally
        if split.full is None:
            raise SystemExit(f"{args.model} is a split model without a full copy: run it with --cloud HOST:PORT")
        print(f"{args.model}: a split model; running its full model locally (--cloud HOST:PORT offloads)")
        interp = Interpreter(split.full)
    t_load = time.perf_counter() - t0
    names = list(interp.input_shapes)
    inputs = _inputs(args.input, names, list(interp.input_shapes.values()), _how(args))
    given = {n: tuple(np.shape(a)) for n, a in zip(names, inputs)}
    if any(given[n] != tuple(s) for n, s in interp.input_shapes.items()):  # a dynamic batch: prepare for it
        interp = Interpreter(interp.model, input_shapes=given)
    outs = interp.invoke(*inputs)
    times = []
    for _ in range(max(args.repeat, 1)):
        s = time.perf_counter()
        interp.invoke(*inputs)
        times.append(time.perf_counter() - s)
    _print_outputs(interp.output_shapes, outs)
    print(f"load+prepare {t_load * 1e3:.2f} ms; invoke median {statistics.median(times) * 1e3:.3f} ms over {len(times)} runs")
    print(f"arena {interp.arena_bytes:,} bytes (lower bound {interp.arena_lower_bound:,}; "
          f"all tensors {interp.tensor_bytes:,})")
    if args.save:
        np.save(args.save, outs[0], allow_pickle=False)
    return 0


def _print_outputs(names, outs) -> None:
    for name, o in zip(names, outs):
        flat = np.asarray(o).reshape(-1)
        print(f"output {name}: {o.dtype}{list(o.shape)} first values {np.array2string(flat[:8], precision=4)}")


def _run_split(args) -> int:
    try:
        if args.tls_ca or args.tls_cert or args.token_file:
            security = ClientSecurity.from_files(args.tls_ca, args.tls_cert, args.tls_key, token_file=args.token_file)
        else:
            security = ClientSecurity.from_env()
    except SecurityError as e:
        raise SystemExit(f"isthmus edge-run: {e}") from None
    link = None
    if args.emulate_link:
        bw = _parse_rate(args.emulate_link, {"bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9}, "bandwidth")
        link = EmulatedLink(bw, _parse_rate(args.rtt, {"s": 1.0, "ms": 1e-3, "us": 1e-6}, "rtt"))
    _check_split(args.model)
    try:
        client = OffloadClient(args.model, args.cloud, security=security, deadline_ms=args.deadline_ms, link=link,
                               initial_bandwidth_bps=link.bandwidth_bps if link else None, adapt=args.cut == "auto")
    except EdgeModelError as e:
        raise SystemExit(f"isthmus edge-run: {e}") from None
    with client:
        if args.cut != "auto":
            _pin_cut(client, args.cut, args.model)
        model = client.split.full or client.split.cuts[0].model
        names = [model.tensors[i].name for i in model.inputs]
        shapes = [tuple(1 if d == -1 else d for d in model.tensors[i].shape) for i in model.inputs]
        inputs = _inputs(args.input, names, shapes, _how(args))
        times = []
        try:
            outs = client.invoke(*inputs)
            for _ in range(max(args.repeat, 1)):
                s = time.perf_counter()
                client.invoke(*inputs)
                times.append(time.perf_counter() - s)
        except CloudError as e:
            raise SystemExit(f"isthmus edge-run: {e}") from None
        _print_outputs([model.tensors[i].name for i in model.outputs], outs)
        print(f"request median {statistics.median(times) * 1e3:.3f} ms over {len(times)} runs "
              f"(deadline {args.deadline_ms:g} ms{'; ' + repr(link) if link else ''})")
        stats = client.stats()
        print("stats " + json.dumps(stats, sort_keys=True, default=str))
    if args.save:
        np.save(args.save, outs[0], allow_pickle=False)
    return _report_cloud(args, stats, client.split)


def _pin_cut(client: OffloadClient, name: str, path: str) -> None:
    """--cut NAME: every request runs that cut (the selector does not adapt: adapt=False)."""
    names = [c.name for c in client.split.cuts]
    if name not in names:
        client.close()
        raise SystemExit(f"--cut {name}: {path} has no such cut; its cuts are {', '.join(names)}")
    client.selector.cut = names.index(name)


def _check_split(path: str) -> None:
    """--cloud needs a split model (isthmus split): say so for a plain one, before any client is made."""
    if not os.path.isfile(path):
        raise SystemExit(f"MODEL {path}: no such file")
    try:
        load(path)
    except EdgeModelError as e:
        if "subgraph" in str(e):
            return  # several subgraphs: a split model
        raise SystemExit(f"MODEL {path}: not a valid edge model: {e}") from None
    raise SystemExit(f"MODEL {path}: not a split model (one subgraph, no cuts): --cloud needs the edge file that "
                     "`isthmus split` writes; run this one without --cloud")


def _report_cloud(args, stats, split) -> int:
    """A cloud that took none of the requests is news: stderr, and an error with --require-cloud."""
    if not any(c.cloud_part for c in split.cuts):
        print(f"isthmus edge-run: {args.model} keeps everything on the edge at every bandwidth: nothing was offloaded",
              file=sys.stderr)
        return 1 if args.require_cloud else 0
    if stats.get("cloud", 0) > 0:
        if stats.get("fallback", 0):
            print(f"isthmus edge-run: {stats['fallback']} request(s) fell back to local: {stats.get('last_error')}",
                  file=sys.stderr)
        return 0
    print(f"isthmus edge-run: the cloud at {args.cloud} took no request ({stats.get('last_error') or 'no answer'}); "
          f"ran locally", file=sys.stderr)
    return 1 if args.require_cloud else 0
