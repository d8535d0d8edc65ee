"""GPU diagnosis for issue #19's missed training rows (CNN b512, MobileNetV2 b32) and the pageable
upload: where a step's time goes on the device. Prints JSON, one section at a time (each in its own
try, so one failure leaves the others):
- per model: eager and captured ms per step, the capture report, the 25 slowest nodes of a traced
  step (each GPU node synchronised), the host-side profile of eager steps (cProfile, top by own
  time), and PyTorch eager with and without TF32 convolutions (its default allows them);
- the CNN b512's convolution pieces timed alone with CUDA events (im2col, the GEMMs, transposes,
  col2im, bias-gradient reductions);
- host-to-device copies of 256 MiB of pageable memory staged through pinned buffers by 1-8 threads.
Run on the GPU machine: python3 benchmarks/gpu_profile.py [--only cnn|mobilenet|pieces|upload]."""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
import traceback

import numpy as np

import isthmus as ism
from gpu_timing import emit, per_call_ms, skipped, torch_cuda

LR = 0.01


def _section(out, name, fn):
    t0 = time.perf_counter()
    try:
        out[name] = fn()
    except Exception:
        got = out.get(name) if isinstance(out.get(name), dict) else {}
        out[name] = {**got, "error": traceback.format_exc()[-1500:]}
    out.setdefault("section_s", {})[name] = round(time.perf_counter() - t0, 1)
    print(f"# {name} done in {out['section_s'][name]} s", file=sys.stderr, flush=True)


def _cnn(batch):
    import cnn
    from models import cnn_train
    p = cnn.init()
    g, x, y, loss, train = cnn_train(p, batch, LR)
    with g.as_default():
        init = ism.global_variables_initializer()
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
    ys = rng.integers(0, 10, batch).astype(np.int32)
    return (g, (x, y), loss, train, init), (xs, ys), p


def _mobilenet(batch, res=96):
    from gpu_train import mobilenet_feeds, mobilenet_graph
    return mobilenet_graph(batch, res), mobilenet_feeds(batch, res), None


def _traced_nodes(sess, train, fd, top=25):
    md = ism.RunMetadata()
    sess.run(train, fd, options=ism.RunOptions(trace=True), run_metadata=md)
    evs = sorted(md.events, key=lambda e: e.end_us - e.start_us, reverse=True)
    return {"total_us": round(sum(e.end_us - e.start_us for e in md.events), 1), "nodes": len(md.events),
            "by_op": {k: round(v, 1) for k, v in list(md.by_op().items())[:12]},
            "top": [[e.node, e.op, round(e.end_us - e.start_us, 1)] for e in evs[:top]]}


def _host_profile(fn, steps=5, top=30):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        fn()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()[-6000:]


def model_section(out, name, make, iters, torch_build=None):
    def run():
        res = out[name] = {}  # filled as it goes: a failure keeps what came before it
        (g, phs, loss, train, init), feeds, extra = make()
        fd = dict(zip(phs, feeds))
        s = ism.Session(g, device="gpu", capture=False)
        s.run(init)
        from isthmus.core import gpu
        pinned = []
        for f in feeds:
            p = gpu.pinned_empty(f.shape, f.dtype)
            p[...] = f
            pinned.append(p)
        fdp = dict(zip(phs, pinned))
        # pinned feeds, pageable feeds, pinned again: an order effect shows as the two pinned differing
        res["eager_pinned_feeds_ms"] = round(per_call_ms(lambda: s.run(train, fdp), iters=iters, budget_s=15), 3)
        res["eager_ms"] = round(per_call_ms(lambda: s.run(train, fd), iters=iters, budget_s=15), 3)
        res["eager_pinned_feeds_again_ms"] = round(per_call_ms(lambda: s.run(train, fdp), iters=iters, budget_s=15), 3)
        try:
            res["traced"] = _traced_nodes(s, train, fd)
            res["host_profile_5_steps"] = _host_profile(lambda: s.run(train, fd))
        except Exception:
            res["traced_error"] = traceback.format_exc()[-1200:]
        try:
            (g2, phs2, loss2, train2, init2), _, _ = make()
            s2 = ism.Session(g2, device="gpu", capture=True)
            s2.run(init2)
            fd2 = dict(zip(phs2, pinned))
            res["capture_ms"] = round(per_call_ms(lambda: s2.run(train2, fd2), iters=iters, budget_s=15), 3)
            plan = s2.plan_for(train2, fd2)
            rep = plan.report() if hasattr(plan, "report") else "not captured"
            if isinstance(rep, dict) and isinstance(rep.get("eager_gpu_nodes"), dict):
                e = rep["eager_gpu_nodes"]
                rep["eager_gpu_nodes"] = dict(list(e.items())[:15])
                rep["eager_gpu_node_count"] = len(e)
            res["capture_report"] = rep
        except Exception:
            res["capture_error"] = traceback.format_exc()[-1200:]
        torch = torch_cuda()
        if torch is not None and torch_build is not None:
            for tf32 in (True, False):
                torch.backends.cudnn.allow_tf32 = tf32
                step = torch_build(torch, feeds, extra)
                res[f"torch_eager_ms_cudnn_tf32_{tf32}"] = round(per_call_ms(
                    step, iters=iters, sync_fn=torch.cuda.synchronize, budget_s=15), 3)
            torch.backends.cudnn.allow_tf32 = True
        return res
    return run


def _torch_cnn(torch, feeds, p):
    import cnn
    from gpu_train import _torch_step
    xs, ys = feeds
    m = cnn.torch_cnn(torch, p).cuda()
    return _torch_step(torch, m, torch.nn.CrossEntropyLoss(), torch.from_numpy(xs).cuda(),
                       torch.from_numpy(ys.astype(np.int64)).cuda())[0]


def _torch_mnv2(torch, feeds, _):
    from gpu_train import _torch_step
    from mobilenet_train import torch_mobilenet
    xs, ys = feeds
    m = torch_mobilenet(torch, xs.shape[-1]).cuda()
    m.train()
    return _torch_step(torch, m, torch.nn.CrossEntropyLoss(), torch.from_numpy(xs).cuda(),
                       torch.from_numpy(ys.astype(np.int64)).cuda())[0]


def _event_us(cp, fn, reps=10):
    fn()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return round(cp.cuda.get_elapsed_time(a, b) * 1e3 / reps, 1)


def pieces():
    """The CNN b512's convolutions, piece by piece."""
    from isthmus.core import gpu
    from isthmus.core.gpu_kernels import conv, raw
    cp = gpu.array_module("GPU")
    out = {}
    rng = np.random.default_rng(0)

    class _N:
        def __init__(self, pads):
            self.attrs = {"strides": (1, 1), "dilations": (1, 1), "pads": pads, "groups": 1}
    for name, xs, ws in (("conv1", (512, 1, 28, 28), (32, 1, 5, 5)), ("conv2", (512, 32, 14, 14), (64, 32, 5, 5))):
        g = conv.Geometry(_N(((2, 2), (2, 2))), xs, ws)
        x = cp.asarray(rng.standard_normal(xs).astype(np.float32))
        w = cp.asarray(rng.standard_normal(ws).astype(np.float32))
        dy = cp.asarray(rng.standard_normal((xs[0], ws[0], g.oh, g.ow)).astype(np.float32))
        cols = conv._cols(cp, x, g)
        w2 = w.reshape(g.o, -1)
        dy2 = cp.ascontiguousarray(dy.transpose(1, 0, 2, 3)).reshape(g.o, -1)
        colsT = cp.ascontiguousarray(cols.T)
        y2 = w2 @ cols
        dcols = w2.T @ dy2
        r = {"cols_MB": round(cols.nbytes / 1e6, 1),
             "im2col": _event_us(cp, lambda: conv._cols(cp, x, g)),
             "fwd_gemm": _event_us(cp, lambda: cp.matmul(w2, cols)),
             "fwd_nchw_transpose": _event_us(cp, lambda: conv._nchw(cp, y2, g, g.o)),
             "conv_forward_total": _event_us(cp, lambda: conv.conv_forward(cp, x, w, g)),
             "dy_transpose": _event_us(cp, lambda: cp.ascontiguousarray(dy.transpose(1, 0, 2, 3))),
             "wgrad_gemm_dy2_colsT": _event_us(cp, lambda: cp.matmul(dy2, cols.T)),
             "wgrad_gemm_contig_colsT": _event_us(cp, lambda: cp.matmul(dy2, colsT)),
             "wgrad_total": _event_us(cp, lambda: conv.conv_filter_grad(cp, x, dy, g)),
             "dgrad_gemm": _event_us(cp, lambda: cp.matmul(w2.T, dy2)),
             "col2im": _event_us(cp, lambda: raw.col2im(cp, dcols, cp.empty_like(x), conv._raw_geom(g))),
             "dgrad_total": _event_us(cp, lambda: conv.conv_input_grad(cp, dy, w, g, x.dtype)),
             "biasgrad_sum_0_2_3": _event_us(cp, lambda: cp.sum(dy, axis=(0, 2, 3))),
             "biasgrad_two_stage": _event_us(cp, lambda: dy.reshape(dy.shape[0], dy.shape[1], -1).sum(axis=2).sum(axis=0)),
             "biasgrad_dy2_rows": _event_us(cp, lambda: dy2.sum(axis=1)),
             "biasgrad_raw_kernel": _event_us(cp, lambda: raw.bias_grad_nchw(cp, dy)),
             "fwd_fused_nchw_bias_relu": _event_us(cp, lambda: raw.nchw_bias_act(
                 cp, y2, cp.zeros(g.o, cp.float32), g.n, g.o, g.oh * g.ow, 1))}

        # split-K for the weight gradient: K chunks as a batched product, then a sum
        k = dy2.shape[1]
        for chunks in (8, 32):
            if k % chunks == 0:
                a3 = dy2.reshape(g.o, chunks, k // chunks).transpose(1, 0, 2)
                b3 = colsT.reshape(chunks, k // chunks, -1)
                r[f"wgrad_splitk{chunks}"] = _event_us(cp, lambda: cp.matmul(a3, b3).sum(axis=0))
        out[name] = r
    fc = cp.asarray(rng.standard_normal((512, 1024)).astype(np.float32))
    out["fc_biasgrad_sum0"] = _event_us(cp, lambda: fc.sum(axis=0))
    return out


def upload():
    """256 MiB of pageable float32 to the GPU: cupy's set, isthmus's feed, and staging by threads."""
    from concurrent.futures import ThreadPoolExecutor
    from isthmus.core import gpu
    cp = gpu.array_module("GPU")
    nbytes = 256 << 20
    src = np.arange(nbytes // 4, dtype=np.float32)
    dst = cp.empty(nbytes // 4, cp.float32)
    dev = gpu.CudaDevice(0) if hasattr(gpu, "CudaDevice") else None
    out = {}

    def gbs(ms):
        return round(nbytes / ms / 1e6, 2)
    out["cupy_set_pageable"] = gbs(per_call_ms(lambda: dst.set(src), iters=3))
    if dev is not None:
        out["isthmus_to_device"] = gbs(per_call_ms(lambda: dev.to_device(src), iters=3))
    pinned = gpu.pinned_empty((nbytes,), np.uint8)
    s8 = src.view(np.uint8)
    out["host_copy_1_thread"] = gbs(per_call_ms(lambda: np.copyto(pinned, s8), iters=3))
    for threads in (4, 8, 16):
        pool = ThreadPoolExecutor(threads)
        step = nbytes // threads

        def par():
            list(pool.map(lambda i: np.copyto(pinned[i * step:(i + 1) * step], s8[i * step:(i + 1) * step]),
                          range(threads)))
        out[f"host_copy_{threads}_threads"] = gbs(per_call_ms(par, iters=3))
        for chunk_mb in (2, 4):
            chunk = chunk_mb << 20
            nslots = 2 * threads
            bufs = [gpu.pinned_empty((chunk,), np.uint8) for _ in range(nslots)]
            events = [None] * nslots
            stream = cp.cuda.get_current_stream()

            def staged():
                offs = list(range(0, nbytes, chunk))
                for w0 in range(0, len(offs), threads):
                    wave = offs[w0:w0 + threads]
                    base = (w0 // threads) % 2 * threads
                    for j in range(len(wave)):
                        if events[base + j] is not None:
                            events[base + j].synchronize()

                    def cp_one(j):
                        o = wave[j]
                        m = min(chunk, nbytes - o)
                        np.copyto(bufs[base + j][:m], s8[o:o + m])
                    list(pool.map(cp_one, range(len(wave))))
                    for j, o in enumerate(wave):
                        m = min(chunk, nbytes - o)
                        cp.cuda.runtime.memcpyAsync(dst.data.ptr + o, bufs[base + j].ctypes.data, m, 1, stream.ptr)
                        events[base + j] = stream.record()
            out[f"staged_{threads}_threads_{chunk_mb}MiB"] = gbs(per_call_ms(staged, iters=3))
        pool.shutdown()
    assert np.array_equal(dst.get()[:1000], src[:1000])
    out["threads_available"] = len(__import__("os").sched_getaffinity(0))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=["cnn", "mobilenet", "pieces", "upload"])
    args = ap.parse_args(argv)
    if skipped("gpu_profile"):
        return 0
    want = set(args.only or ["cnn", "mobilenet", "pieces", "upload"])
    out = {}
    if "upload" in want:
        _section(out, "upload", upload)
    if "pieces" in want:
        _section(out, "pieces", pieces)
    if "cnn" in want:
        _section(out, "cnn_b512", model_section(out, "cnn_b512", lambda: _cnn(512), 20, _torch_cnn))
    if "mobilenet" in want:
        _section(out, "mobilenet_b32", model_section(out, "mobilenet_b32", lambda: _mobilenet(32), 5, _torch_mnv2))
    emit("gpu_profile", out)
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
