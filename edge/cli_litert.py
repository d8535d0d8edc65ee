"""`isthmus edge-run MODEL.tflite --runtime litert`: run a .tflite written by isthmus in LiteRT, alone or,
with --cloud, as the edge part of a split through the LiteRT offload client (edge/litert_client.py).
Inputs and outputs are in the graph's layout (NCHW), as with the isthmus runtime."""
from __future__ import annotations

import os
import statistics
import time

import numpy as np

from .format import EdgeModelError


def run_litert(args) -> int:
    from . import cli
    from .litert_client import LiteRTOffloadClient, OffloadCallError, _read, _run, tflite_metadata
    if getattr(args, "emulate_link", None):
        raise SystemExit("--emulate-link needs --runtime isthmus (the LiteRT client sends at the real link's speed)")
    if not os.path.isfile(args.model):
        raise SystemExit(f"MODEL {args.model}: no such file")
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise SystemExit("--runtime litert needs LiteRT: pip install 'isthmus[litert]' (ai-edge-litert)") from None
    data = _read(args.model)
    if data[4:8] != b"TFL3":
        raise SystemExit(f"MODEL {args.model}: not a .tflite file (file identifier {data[4:8]!r}, expected b'TFL3'); "
                         "--runtime litert runs the .tflite files isthmus writes")
    try:
        meta = tflite_metadata(data)
    except EdgeModelError as e:
        raise SystemExit(f"MODEL {args.model}: {e}") from None
    specs = meta["inputs"]
    names = [s["edge_name"] or s["name"] for s in specs]
    shapes = [_graph_shape(s) for s in specs]
    inputs = cli._inputs(args.input, names, shapes, cli._how(args))
    t0 = time.perf_counter()
    out_names = [s.get("edge_name") or s["name"] for s in meta["outputs"]]
    if args.cloud:
        post = os.path.splitext(args.model)[0] + ".post.tflite"   # what `split --edge-format tflite` writes
        has_post = os.path.isfile(post)
        client = LiteRTOffloadClient(data, args.cloud, security=_security(args), deadline_ms=args.deadline_ms,
                                     post=post if has_post else None)
        call, close = client.invoke, client.close
        out_names = ([s.get("edge_name") or s["name"] for s in client.post_meta["outputs"]] if has_post
                     else list(meta.get("split", {}).get("wire_outputs", [])))
    else:
        it = Interpreter(model_content=data, num_threads=1)
        it.allocate_tensors()
        call, close = (lambda *xs: _run(it, meta, xs)), (lambda: None)
    t_load = time.perf_counter() - t0
    try:
        outs = call(*inputs)
        times = []
        for _ in range(max(args.repeat, 1)):
            s = time.perf_counter()
            call(*inputs)
            times.append(time.perf_counter() - s)
    except OffloadCallError as e:
        raise SystemExit(f"isthmus edge-run: {e}") from None
    finally:
        close()
    cli._print_outputs(out_names, outs)
    what = f"request via {args.cloud}" if args.cloud else "invoke"
    print(f"LiteRT: load+prepare {t_load * 1e3:.2f} ms; {what} median {statistics.median(times) * 1e3:.3f} ms "
          f"over {len(times)} runs")
    if args.save:
        np.save(args.save, outs[0], allow_pickle=False)
    return 0


def _graph_shape(spec: dict) -> tuple:
    """The input's shape in the graph's layout (the .tflite holds 4-D image tensors NHWC)."""
    shape = [max(int(d), 1) for d in spec["shape"]]
    if spec.get("layout") == "NHWC":
        shape = [shape[0], shape[3], shape[1], shape[2]]
    return tuple(shape)


def _security(args):
    from ..wire.security import ClientSecurity, SecurityError
    try:
        if args.tls_ca or args.tls_cert or args.token_file:
            return ClientSecurity.from_files(args.tls_ca, args.tls_cert, args.tls_key, token_file=args.token_file)
        return ClientSecurity.from_env()
    except SecurityError as e:
        raise SystemExit(f"isthmus edge-run: {e}") from None
