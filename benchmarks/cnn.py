"""CNN training step: input 1x28x28, conv5x5x32 SAME-relu-maxpool2-conv5x5x64 SAME-relu-maxpool2-
dense1024-relu-dense10, batch 64, SGD. isthmus vs PyTorch CPU in the same process, plus the
isthmus profile by op type. Target: <= 1.5x PyTorch.
"""
from __future__ import annotations

import numpy as np

import isthmus as ism
from isthmus.core.profile import by_op_type, time_nodes
from timing import emit, measure_with_torch, torch_or_none, torch_train_step

BATCH = 64
LR = 0.01


def init(seed=0):
    rng = np.random.default_rng(seed)

    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return {
        "c1w": he((32, 1, 5, 5), 25), "c1b": np.zeros(32, np.float32),
        "c2w": he((64, 32, 5, 5), 800), "c2b": np.zeros(64, np.float32),
        "d1w": he((7 * 7 * 64, 1024), 3136), "d1b": np.zeros(1024, np.float32),
        "d2w": he((1024, 10), 1024), "d2b": np.zeros(10, np.float32),
    }


def build_isthmus(p, batch=BATCH):
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (batch, 1, 28, 28), name="x")
        y = ism.placeholder("int32", (batch,), name="y")
        v = {k: ism.Variable(a, name=k) for k, a in p.items()}
        h = ism.relu(ism.bias_add(ism.conv2d(x, v["c1w"], padding="SAME"), v["c1b"], axis=1))
        h = ism.max_pool(h, 2, 2, "VALID")
        h = ism.relu(ism.bias_add(ism.conv2d(h, v["c2w"], padding="SAME"), v["c2b"], axis=1))
        h = ism.max_pool(h, 2, 2, "VALID")
        h = ism.reshape(h, (-1, 7 * 7 * 64))
        h = ism.relu(ism.bias_add(h @ v["d1w"], v["d1b"]))
        logits = ism.bias_add(h @ v["d2w"], v["d2b"])
        loss = ism.reduce_mean(ism.sparse_softmax_cross_entropy(y, logits))
        train = ism.optimizers.SGD(LR).minimize(loss)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return sess, x, y, loss, train


def torch_cnn(torch, p):
    nn = torch.nn
    m = nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(3136, 1024), nn.ReLU(), nn.Linear(1024, 10))
    with torch.no_grad():
        m[0].weight.copy_(torch.from_numpy(p["c1w"])); m[0].bias.copy_(torch.from_numpy(p["c1b"]))
        m[3].weight.copy_(torch.from_numpy(p["c2w"])); m[3].bias.copy_(torch.from_numpy(p["c2b"]))
        m[7].weight.copy_(torch.from_numpy(p["d1w"].T.copy())); m[7].bias.copy_(torch.from_numpy(p["d1b"]))
        m[9].weight.copy_(torch.from_numpy(p["d2w"].T.copy())); m[9].bias.copy_(torch.from_numpy(p["d2b"]))
    return m


def main():
    p = init()
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((BATCH, 1, 28, 28)).astype(np.float32)
    ys = rng.integers(0, 10, BATCH).astype(np.int32)
    sess, x, y, loss, train = build_isthmus(p)
    feed = {x: xs, y: ys}
    contenders = {"isthmus": lambda: sess.run([loss, train], feed)}
    profile = by_op_type(time_nodes(sess, [loss, train], feed, repeats=5))
    torch = torch_or_none()
    if torch is not None:
        m = torch_cnn(torch, init())
        opt = torch.optim.SGD(m.parameters(), lr=LR)
        lossf = torch.nn.CrossEntropyLoss()
        tx, ty = torch.from_numpy(xs), torch.from_numpy(ys.astype(np.int64))
        # same starting loss: the two models are the same model
        with torch.no_grad():
            l_t = float(lossf(m(tx), ty))
        sess2, x2, y2, loss2, _ = build_isthmus(init())
        l_i = float(sess2.run(loss2, {x2: xs, y2: ys}))
        assert abs(l_t - l_i) < 1e-3 * max(1.0, abs(l_t)), (l_t, l_i)

        tstep = torch_train_step(opt, lambda: lossf(m(tx), ty))
    res = measure_with_torch(contenders, tstep if torch is not None else None, repeats=11)
    total = sum(s for _, s, _ in profile)
    out = {"ms": {k: round(v * 1e3, 2) for k, v in res.items()},
           "profile_by_op_type_ms": [{"op": op, "ms": round(s * 1e3, 3), "nodes": n,
                                      "share": round(s / total, 3)} for op, s, n in profile]}
    if "torch" in res:
        out["ratio_vs_torch"] = round(res["isthmus"] / res["torch"], 3)
        out["target_vs_torch"] = 1.5
        out["pass"] = out["ratio_vs_torch"] <= 1.5
    emit("cnn_train_step", out)


if __name__ == "__main__":
    main()
