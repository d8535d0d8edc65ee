"""`isthmus edge-run MODEL.onnx --runtime onnxruntime`: run an .onnx that isthmus wrote (split --edge-format
onnx, converters/onnx_edge.py) in onnxruntime, alone or, with --cloud, as the edge part of a split through
the onnxruntime offload client (edge/onnxruntime_client.py). Inputs and outputs are float32 in the graph's
layout (NCHW): the ONNX edge part keeps it, and an int8 part quantizes inside its QDQ graph."""
from __future__ import annotations

import os
import time

from .cli_phone import PhoneRun, client_security, refuse_emulated_link, run_phone
from .format import EdgeModelError
from .onnxruntime_client import OnnxRuntimeOffloadClient, onnx_metadata, ort_session, run_session
from .phone_offload import read_bytes


def run_onnxruntime(args) -> int:
    refuse_emulated_link(args, "onnxruntime")
    if not os.path.isfile(args.model):
        raise SystemExit(f"MODEL {args.model}: no such file")
    try:
        import onnxruntime  # noqa: F401  # deferred: onnxruntime is heavy and optional; checked before use
    except ImportError:
        raise SystemExit("--runtime onnxruntime needs onnxruntime: pip install onnxruntime") from None
    data = read_bytes(args.model)
    t0 = time.perf_counter()
    try:
        sess = ort_session(data)
        if args.cloud:
            meta = onnx_metadata(sess)
            post = os.path.splitext(args.model)[0] + ".post.onnx"   # what `split --edge-format onnx` writes
            client = OnnxRuntimeOffloadClient(data, args.cloud, security=client_security(args),
                                              deadline_ms=args.deadline_ms,
                                              post=post if os.path.isfile(post) else None)
    except EdgeModelError as e:
        raise SystemExit(f"MODEL {args.model}: {e} (--runtime onnxruntime runs the .onnx files isthmus writes)") from None
    if args.cloud:
        call, close = client.invoke, client.close
        out_names = ([o.name for o in client.post.get_outputs()] if client.has_post
                     else list(meta["split"]["wire_outputs"]))
    else:
        call, close = (lambda *xs: run_session(sess, xs)), (lambda: None)
        out_names = [o.name for o in sess.get_outputs()]
    ins = sess.get_inputs()
    shapes = [tuple(d if isinstance(d, int) and d > 0 else 1 for d in i.shape) for i in ins]
    return run_phone(args, PhoneRun("onnxruntime", [i.name for i in ins], shapes, call, close, out_names,
                                    time.perf_counter() - t0))
