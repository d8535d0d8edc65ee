"""MLP 784-512-512-10: a training step (batch 128, SGD) and inference latency (batch 1).

Training: isthmus vs a hand-written numpy forward/backward/update of the same model and vs
PyTorch CPU, same process, same weights. Targets: <= 1.10x numpy, <= 1.5x PyTorch.
Inference: isthmus vs onnxruntime on the same weights. Target: <= 2.5x onnxruntime.
"""
from __future__ import annotations

import numpy as np

import isthmus as ism
from timing import emit, interleaved_medians, measure_with_torch, torch_or_none, torch_train_step

SIZES = (784, 512, 512, 10)
BATCH = 128
LR = 0.01


def init_weights(seed=0):
    rng = np.random.default_rng(seed)
    ws, bs = [], []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        lim = np.sqrt(6.0 / (fan_in + fan_out))
        ws.append(rng.uniform(-lim, lim, (fan_in, fan_out)).astype(np.float32))
        bs.append(np.zeros(fan_out, np.float32))
    return ws, bs


def build_isthmus(ws, bs, batch):
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (batch, SIZES[0]), name="x")
        y = ism.placeholder("int32", (batch,), name="y")
        h = x
        variables = []
        for i, (w, b) in enumerate(zip(ws, bs)):
            W = ism.Variable(w, name=f"W{i}")
            B = ism.Variable(b, name=f"b{i}")
            variables += [W, B]
            h = ism.bias_add(h @ W, B)
            if i < len(ws) - 1:
                h = ism.relu(h)
        logits = h
        loss = ism.reduce_mean(ism.sparse_softmax_cross_entropy(y, logits))
        train = ism.optimizers.SGD(LR).minimize(loss)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return sess, x, y, logits, loss, train, variables


class NumpyMLP:
    """The same model written out by hand: what isthmus should cost, at best."""

    def __init__(self, ws, bs):
        self.ws = [w.copy() for w in ws]
        self.bs = [b.copy() for b in bs]

    def step(self, x, y):
        ws, bs = self.ws, self.bs
        acts, zs = [x], []
        h = x
        for i in range(3):
            z = h @ ws[i] + bs[i]
            zs.append(z)
            h = np.maximum(z, 0) if i < 2 else z
            acts.append(h)
        logits = h
        m = logits.max(axis=1, keepdims=True)
        e = np.exp(logits - m)
        s = e.sum(axis=1, keepdims=True)
        n = x.shape[0]
        loss = np.mean(np.log(s[:, 0]) + m[:, 0] - logits[np.arange(n), y])
        d = e / s
        d[np.arange(n), y] -= 1
        d /= n
        for i in (2, 1, 0):
            dw = acts[i].T @ d
            db = d.sum(axis=0)
            if i > 0:
                d = (d @ ws[i].T) * (zs[i - 1] > 0)
            ws[i] -= LR * dw
            bs[i] -= LR * db
        return loss


def torch_model(torch, ws, bs):
    layers = []
    for i, (w, b) in enumerate(zip(ws, bs)):
        lin = torch.nn.Linear(w.shape[0], w.shape[1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w.T.copy()))
            lin.bias.copy_(torch.from_numpy(b))
        layers.append(lin)
        if i < len(ws) - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def onnx_mlp(ws, bs):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    nodes, inits, prev = [], [], "x"
    for i, (w, b) in enumerate(zip(ws, bs)):
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Gemm", [prev, f"W{i}", f"b{i}"], [f"z{i}"]))
        prev = f"z{i}"
        if i < len(ws) - 1:
            nodes.append(helper.make_node("Relu", [prev], [f"h{i}"]))
            prev = f"h{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SIZES[0]])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, SIZES[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]), prev


def train_step_benchmark():
    ws, bs = init_weights()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, 10, BATCH).astype(np.int32)
    sess, xp, yp, logits, loss, train, _ = build_isthmus(ws, bs, BATCH)
    ref = NumpyMLP(ws, bs)
    # same numbers first: one step each from the same weights gives the same loss
    l_ism = sess.run([loss, train], {xp: x, yp: y})[0]
    l_np = ref.step(x, y)
    assert abs(l_ism - l_np) < 1e-4 * max(1.0, abs(l_np)), (l_ism, l_np)
    feed = {xp: x, yp: y}
    fetches = [loss, train]
    contenders = {"isthmus": lambda: sess.run(fetches, feed), "numpy_by_hand": lambda: ref.step(x, y)}
    torch = torch_or_none()
    if torch is not None:
        model = torch_model(torch, ws, bs)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        lossf = torch.nn.CrossEntropyLoss()
        tx, ty = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))

        tstep = torch_train_step(opt, lambda: lossf(model(tx), ty))
    res = measure_with_torch(contenders, tstep if torch is not None else None, repeats=41, inner=3)
    out = {"ms": {k: round(v * 1e3, 3) for k, v in res.items()},
           "ratio_vs_numpy": round(res["isthmus"] / res["numpy_by_hand"], 3), "target_vs_numpy": 1.10}
    if "torch" in res:
        out["ratio_vs_torch"] = round(res["isthmus"] / res["torch"], 3)
        out["target_vs_torch"] = 1.5
    return out


def inference_benchmark():
    ws, bs = init_weights()
    sess, xp, yp, logits, loss, train, _ = build_isthmus(ws, bs, 1)
    ort_sess, out_name = onnx_mlp(ws, bs)
    x = np.random.default_rng(2).standard_normal((1, SIZES[0])).astype(np.float32)
    a = sess.run(logits, {xp: x})
    b = ort_sess.run([out_name], {"x": x})[0]
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    t = interleaved_medians({"isthmus": lambda: sess.run(logits, {xp: x}),
                             "ort": lambda: ort_sess.run([out_name], {"x": x})}, repeats=31, inner=200)
    t_ism, t_ort = t["isthmus"], t["ort"]
    return {"us": {"isthmus": round(t_ism * 1e6, 2), "onnxruntime": round(t_ort * 1e6, 2)},
            "ratio_vs_onnxruntime": round(t_ism / t_ort, 3), "target_vs_onnxruntime": 2.5}


def main():
    train = train_step_benchmark()
    infer = inference_benchmark()
    ok = train["ratio_vs_numpy"] <= 1.10 and train.get("ratio_vs_torch", 0) <= 1.5 \
        and infer["ratio_vs_onnxruntime"] <= 2.5
    emit("mlp", {"train_step_batch128": train, "inference_batch1": infer, "pass": ok})


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    main()
