"""`isthmus edge-run MODEL.tflite --runtime litert`: run a .tflite written by isthmus in LiteRT, alone or,
with --cloud, as the edge part of a split through the LiteRT offload client (edge/litert_client.py).
Inputs and outputs are in the graph's layout (NCHW), as with the isthmus runtime."""
from __future__ import annotations

import os
import time

from .cli_phone import PhoneRun, client_security, refuse_emulated_link, run_phone
from .format import EdgeModelError
from .litert_client import LiteRTOffloadClient, _run, tflite_metadata
from .phone_offload import read_bytes


def run_litert(args) -> int:
    refuse_emulated_link(args, "LiteRT")
    if not os.path.isfile(args.model):
        raise SystemExit(f"MODEL {args.model}: no such file")
    try:
        from ai_edge_litert.interpreter import Interpreter  # deferred: LiteRT is optional; checked here
    except ImportError:
        raise SystemExit("--runtime litert needs LiteRT: pip install 'isthmus[litert]' (ai-edge-litert)") from None
    data = read_bytes(args.model)
    if data[4:8] != b"TFL3":
        raise SystemExit(f"MODEL {args.model}: not a .tflite file (file identifier {data[4:8]!r}, expected b'TFL3'); "
                         "--runtime litert runs the .tflite files isthmus writes")
    try:
        meta = tflite_metadata(data)
    except EdgeModelError as e:
        raise SystemExit(f"MODEL {args.model}: {e}") from None
    specs = meta["inputs"]
    t0 = time.perf_counter()
    out_names = [s.get("edge_name") or s["name"] for s in meta["outputs"]]
    if args.cloud:
        post = os.path.splitext(args.model)[0] + ".post.tflite"   # what `split --edge-format tflite` writes
        has_post = os.path.isfile(post)
        client = LiteRTOffloadClient(data, args.cloud, security=client_security(args), deadline_ms=args.deadline_ms,
                                     post=post if has_post else None)
        call, close = client.invoke, client.close
        out_names = ([s.get("edge_name") or s["name"] for s in client.post_meta["outputs"]] if has_post
                     else list(meta.get("split", {}).get("wire_outputs", [])))
    else:
        it = Interpreter(model_content=data, num_threads=1)
        it.allocate_tensors()
        call, close = (lambda *xs: _run(it, meta, xs)), (lambda: None)
    return run_phone(args, PhoneRun("LiteRT", [s["edge_name"] or s["name"] for s in specs],
                                    [_graph_shape(s) for s in specs], call, close, out_names,
                                    time.perf_counter() - t0))


def _graph_shape(spec: dict) -> tuple:
    """The input's shape in the graph's layout (the .tflite holds 4-D image tensors NHWC)."""
    shape = [max(int(d), 1) for d in spec["shape"]]
    if spec.get("layout") == "NHWC":
        shape = [shape[0], shape[3], shape[1], shape[2]]
    return tuple(shape)
