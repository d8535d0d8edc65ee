"""GPU benchmark: training steps on the GPU, isthmus vs PyTorch (and a hand-written cupy MLP)
in one run. Prints JSON. Workloads and targets (issue #19): MLP 784-512-512-10 SGD b128 and
b4096 (<= 1.2x torch eager; with step capture <= 2x torch's CUDA-graph replay), the CNN
(conv5x5 32, pool, conv5x5 64, pool, 1024, 10) b64 and b512 (<= 1.5x), MobileNetV2 96x96 b32
(<= 1.5x): the default Session (capture="auto") and capture=False. Each isthmus result is first
checked against the CPU path (first-step loss).
Without a GPU it prints a skip record."""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import isthmus as ism
from gpu_timing import emit, per_call_ms, ratio, skipped, torch_cuda

LR = 0.01


# ---- MLP -------------------------------------------------------------------------------------------
def _mlp_weights(seed=0):
    rng = np.random.default_rng(seed)
    sizes = (784, 512, 512, 10)
    ws = [rng.uniform(-np.sqrt(6 / (a + b)), np.sqrt(6 / (a + b)), (a, b)).astype(np.float32)
          for a, b in zip(sizes[:-1], sizes[1:])]
    return ws, [np.zeros(w.shape[1], np.float32) for w in ws]


def _mlp_graph(ws, bs, batch):
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (batch, 784), name="x")
        y = ism.placeholder("int32", (batch,), name="y")
        h = x
        for i, (w, b) in enumerate(zip(ws, bs)):
            h = ism.bias_add(h @ ism.Variable(w, name=f"W{i}"), ism.Variable(b, name=f"b{i}"))
            if i < 2:
                h = ism.relu(h)
        loss = ism.reduce_mean(ism.sparse_softmax_cross_entropy(y, h))
        train = ism.optimizers.SGD(LR).minimize(loss)
        init = ism.global_variables_initializer()
    return g, x, y, loss, train, init


def _cupy_mlp(cp, ws, bs):
    """The same step by hand in cupy (NOTES.md: 0.48 / 0.77 ms on the H100)."""
    W = [cp.asarray(w) for w in ws]
    B = [cp.asarray(b) for b in bs]

    def step(x, y):
        acts, h = [x], x
        for i in range(3):
            h = h @ W[i] + B[i]
            if i < 2:
                h = cp.maximum(h, 0)
            acts.append(h)
        m = h.max(axis=1, keepdims=True)
        e = cp.exp(h - m)
        p = e / e.sum(axis=1, keepdims=True)
        n = x.shape[0]
        p[cp.arange(n), y] -= 1
        d = p / n
        for i in (2, 1, 0):
            dw, db = acts[i].T @ d, d.sum(axis=0)
            if i > 0:
                d = (d @ W[i].T) * (acts[i] > 0)
            W[i] -= LR * dw
            B[i] -= LR * db
    return step


def _torch_mlp(torch, ws, bs):
    layers = []
    for i, (w, b) in enumerate(zip(ws, bs)):
        lin = torch.nn.Linear(*w.shape)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w.T.copy()))
            lin.bias.copy_(torch.from_numpy(b))
        layers += [lin] + ([torch.nn.ReLU()] if i < 2 else [])
    return torch.nn.Sequential(*layers).cuda()


def _profile(sess, fetches, feed, top: int = 8):
    """One traced step (each GPU node synchronised): the slowest op types, in us."""
    md = ism.RunMetadata()
    sess.run(fetches, feed, options=ism.RunOptions(trace=True), run_metadata=md)
    ops = md.by_op()
    return {"total_us": round(sum(ops.values()), 1), "nodes": len(md.events),
            "top_ops_us": {k: round(v, 1) for k, v in list(ops.items())[:top]}}


def _torch_step(torch, model, lossf, tx, ty):
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(tx), ty)
        loss.backward()
        opt.step()
        return loss
    return step, opt


def _torch_graph_step(torch, model, lossf, tx, ty):
    """PyTorch's whole-step CUDA graph (the recipe of torch.cuda.graphs' documentation)."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            lossf(model(tx), ty).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = lossf(model(tx), ty)
        loss.backward()
        opt.step()
    return graph.replay


def bench_mlp(batch, torch, out):
    from isthmus.core import gpu
    cp = gpu.array_module("GPU")
    ws, bs = _mlp_weights()
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((batch, 784)).astype(np.float32)
    ys = rng.integers(0, 10, batch).astype(np.int32)
    res, first = {}, {}
    for dev in ("cpu", "gpu"):
        g, x, y, loss, train, init = _mlp_graph(ws, bs, batch)
        s = ism.Session(g, device=dev)
        s.run(init)
        first[dev] = float(s.run(loss, {x: xs, y: ys}))
    ok = abs(first["gpu"] - first["cpu"]) <= 1e-4 * max(1.0, abs(first["cpu"]))
    xs_pinned = gpu.pinned_empty(xs.shape, xs.dtype)
    xs_pinned[...] = xs
    for mode in ("eager", "capture"):
        try:
            g, x, y, loss, train, init = _mlp_graph(ws, bs, batch)
            s = ism.Session(g, device="gpu", capture=(mode == "capture"))
            s.run(init)
            step = train  # the update op: nothing comes back to the host, as in the torch loop
            res[f"isthmus_{mode}"] = per_call_ms(lambda: s.run(step, {x: xs_pinned, y: ys}), iters=50)
            if mode == "capture":
                plan = s.plan_for(step, {x: xs_pinned, y: ys})
                out[f"mlp_b{batch}_capture_report"] = plan.report() if hasattr(plan, "report") else "not captured"
            if mode == "eager":
                res["isthmus_eager_with_loss_fetch"] = per_call_ms(lambda: s.run([loss, train], {x: xs, y: ys}),
                                                                   iters=50)
                out[f"mlp_b{batch}_peak_device_bytes"] = s.memory_stats()
                out[f"mlp_b{batch}_profile"] = _profile(s, step, {x: xs, y: ys})
        except Exception as e:
            out[f"mlp_b{batch}_{mode}_error"] = f"{type(e).__name__}: {e}"[:400]
    cstep = _cupy_mlp(cp, ws, bs)
    dx, dy = cp.asarray(xs), cp.asarray(ys)
    res["cupy_by_hand"] = per_call_ms(lambda: cstep(dx, dy), iters=50)
    if torch is not None:
        model = _torch_mlp(torch, ws, bs)
        lossf = torch.nn.CrossEntropyLoss()
        tx, ty = torch.from_numpy(xs).cuda(), torch.from_numpy(ys.astype(np.int64)).cuda()
        step, _ = _torch_step(torch, model, lossf, tx, ty)
        res["torch_eager"] = per_call_ms(step, iters=50, sync_fn=torch.cuda.synchronize)
        try:
            replay = _torch_graph_step(torch, _torch_mlp(torch, ws, bs), lossf, tx, ty)
            res["torch_cuda_graph"] = per_call_ms(replay, iters=50, sync_fn=torch.cuda.synchronize)
        except Exception as e:
            out[f"mlp_b{batch}_torch_graph_error"] = f"{type(e).__name__}: {e}"[:300]
    out[f"mlp_b{batch}"] = {"ms": {k: round(v, 3) for k, v in res.items()}, "first_loss": first,
                            "same_as_cpu": ok,
                            "ratio_eager_vs_torch_eager": ratio(res.get("isthmus_eager"), res.get("torch_eager")),
                            "ratio_capture_vs_torch_graph": ratio(res.get("isthmus_capture"),
                                                                  res.get("torch_cuda_graph"))}


# ---- CNN and MobileNetV2 ---------------------------------------------------------------------------
def _cnn_graph(p, batch):
    from models import cnn_train
    g, x, y, loss, train = cnn_train(p, batch, LR)
    with g.as_default():
        init = ism.global_variables_initializer()
    return g, (x, y), loss, train, init


def _vs_torch(name, build, feeds, torch_build, out, iters):
    """first-step loss on CPU and GPU, then isthmus GPU vs torch eager ms per step."""
    res, first = {}, {}
    try:
        for dev in ("cpu", "gpu"):
            g, phs, loss, train, init = build()
            s = ism.Session(g, device=dev)
            s.run(init)
            first[dev] = float(s.run(loss, dict(zip(phs, feeds))))
        g, phs, loss, train, init = build()
        s = ism.Session(g, device="gpu", capture=False)
        s.run(init)
        fd = dict(zip(phs, feeds))
        res["isthmus_eager"] = per_call_ms(lambda: s.run(train, fd), iters=iters, budget_s=30)
        out[f"{name}_peak_device_bytes"] = s.memory_stats()
        out[f"{name}_profile"] = _profile(s, train, fd)
        # the default Session (capture="auto": the step replays as CUDA graphs from its second run)
        g, phs, loss, train, init = build()
        s = ism.Session(g, device="gpu")
        s.run(init)
        fd = dict(zip(phs, feeds))
        res["isthmus_default"] = per_call_ms(lambda: s.run(train, fd), iters=iters, budget_s=30)
        plan = s.plan_for(train, fd)
        out[f"{name}_default_capture_report"] = plan.report() if hasattr(plan, "report") else "not captured"
    except Exception as e:
        out[f"{name}_error"] = f"{type(e).__name__}: {e}"[:400]
    if torch_build is not None:
        try:
            step = torch_build()
            res["torch_eager"] = per_call_ms(step, iters=iters, sync_fn=torch_build.sync, budget_s=30)
        except Exception as e:
            out[f"{name}_torch_error"] = f"{type(e).__name__}: {e}"[:300]
    ok = bool(first) and abs(first.get("gpu", 0) - first.get("cpu", 1)) <= 1e-3 * max(1.0, abs(first.get("cpu", 1)))
    out[name] = {"ms": {k: round(v, 3) for k, v in res.items()}, "first_loss": first, "same_as_cpu": ok,
                 "ratio_vs_torch_eager": ratio(res.get("isthmus_default"), res.get("torch_eager")),
                 "ratio_eager_vs_torch_eager": ratio(res.get("isthmus_eager"), res.get("torch_eager"))}


def bench_cnn(batch, torch, out):
    import cnn
    p = cnn.init()
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
    ys = rng.integers(0, 10, batch).astype(np.int32)
    tb = None
    if torch is not None:
        def tb():
            m = cnn.torch_cnn(torch, p).cuda()
            lossf = torch.nn.CrossEntropyLoss()
            return _torch_step(torch, m, lossf, torch.from_numpy(xs).cuda(),
                               torch.from_numpy(ys.astype(np.int64)).cuda())[0]
        tb.sync = torch.cuda.synchronize
    _vs_torch(f"cnn_b{batch}", lambda: _cnn_graph(p, batch), [xs, ys], tb, out, iters=20)


def mobilenet_graph(batch, res=96):
    """MobileNetV2's SGD training step: (graph, (images, labels), loss, train, init)."""
    from models import mobilenet_v2
    g, x, logits = mobilenet_v2(batch=batch, res=res, training=True)
    with g.as_default():
        y = ism.placeholder("int32", (batch,), name="labels")
        loss = ism.reduce_mean(ism.sparse_softmax_cross_entropy(y, logits))
        train = ism.optimizers.SGD(LR).minimize(loss)
        init = ism.global_variables_initializer()
    return g, (x, y), loss, train, init


def mobilenet_feeds(batch, res=96):
    rng = np.random.default_rng(1)
    return (rng.standard_normal((batch, 3, res, res)).astype(np.float32),
            rng.integers(0, 10, batch).astype(np.int32))


def bench_mobilenet(batch, torch, out, res=96):
    xs, ys = mobilenet_feeds(batch, res)
    tb = None
    if torch is not None:
        def tb():
            from mobilenet_train import torch_mobilenet
            m = torch_mobilenet(torch, res).cuda()
            m.train()
            lossf = torch.nn.CrossEntropyLoss()
            return _torch_step(torch, m, lossf, torch.from_numpy(xs).cuda(),
                               torch.from_numpy(ys.astype(np.int64)).cuda())[0]
        tb.sync = torch.cuda.synchronize
    _vs_torch(f"mobilenet_v2_{res}_b{batch}", lambda: mobilenet_graph(batch, res), [xs, ys], tb, out, iters=5)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["mlp", "cnn", "mobilenet"], action="append")
    args = p.parse_args(argv)
    if skipped("gpu_train"):
        return 0
    torch = torch_cuda()
    want = set(args.only or ["mlp", "cnn", "mobilenet"])
    out = {"targets": {"mlp_eager": "<= 1.2x torch eager", "mlp_capture": "<= 2x torch CUDA graph",
                       "cnn": "<= 1.5x torch eager", "mobilenet": "<= 1.5x torch eager"}}
    t0 = time.perf_counter()
    if "mlp" in want:
        for b in (128, 4096):
            bench_mlp(b, torch, out)
    if "cnn" in want:
        for b in (64, 512):
            bench_cnn(b, torch, out)
    if "mobilenet" in want:
        bench_mobilenet(32, torch, out)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    emit("gpu_train", out)
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
