"""RNN training step built with while_loop: tanh RNN, input 64, hidden 128, 50 steps, batch 32,
loss = mean of the final state squared, SGD. isthmus vs a hand-written numpy BPTT and vs
PyTorch CPU in the same process. Targets: <= 1.2x numpy, faster than PyTorch.
"""
from __future__ import annotations

import numpy as np

import isthmus as ism
from timing import emit, measure_with_torch, torch_or_none, torch_train_step

T, B, I, H = 50, 32, 64, 128
LR = 0.01


def weights(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((I, H)).astype(np.float32) * 0.1,
            rng.standard_normal((H, H)).astype(np.float32) * 0.1,
            np.zeros(H, np.float32))


def build_isthmus(wx, wh, b):
    g = ism.Graph(seed=0)
    with g.as_default():
        xs = ism.placeholder("float32", (T, B, I), name="xs")
        Wx, Wh, Bv = ism.Variable(wx, name="Wx"), ism.Variable(wh, name="Wh"), ism.Variable(b, name="b")

        def body(t, h):
            return t + 1, ism.tanh(ism.bias_add(ism.gather(xs, t) @ Wx + h @ Wh, Bv))
        _, h = ism.while_loop(lambda t, h: t < T, body, [ism.constant(0), ism.constant(np.zeros((B, H), np.float32))])
        loss = ism.reduce_mean(h * h)
        train = ism.optimizers.SGD(LR).minimize(loss, var_list=[Wx, Wh, Bv])
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return sess, xs, loss, train


class NumpyRNN:
    def __init__(self, wx, wh, b):
        self.wx, self.wh, self.b = wx.copy(), wh.copy(), b.copy()

    def step(self, xs):
        hs = [np.zeros((B, H), np.float32)]
        for t in range(T):
            hs.append(np.tanh(xs[t] @ self.wx + hs[-1] @ self.wh + self.b))
        h = hs[-1]
        loss = np.mean(h * h)
        dh = (2.0 / h.size) * h
        dwx = np.zeros_like(self.wx)
        dwh = np.zeros_like(self.wh)
        db = np.zeros_like(self.b)
        for t in range(T - 1, -1, -1):
            dz = dh * (1 - hs[t + 1] * hs[t + 1])
            dwx += xs[t].T @ dz
            dwh += hs[t].T @ dz
            db += dz.sum(axis=0)
            dh = dz @ self.wh.T
        self.wx -= LR * dwx
        self.wh -= LR * dwh
        self.b -= LR * db
        return loss


def main():
    wx, wh, b = weights()
    xs = np.random.default_rng(1).standard_normal((T, B, I)).astype(np.float32)
    sess, xp, loss, train = build_isthmus(wx, wh, b)
    ref = NumpyRNN(wx, wh, b)
    l1 = sess.run([loss, train], {xp: xs})[0]
    l2 = ref.step(xs)
    assert abs(l1 - l2) < 1e-4 * max(1, abs(l2)), (l1, l2)
    l1 = sess.run([loss, train], {xp: xs})[0]  # second step: the updates agreed too
    l2 = ref.step(xs)
    assert abs(l1 - l2) < 1e-4 * max(1, abs(l2)), (l1, l2)
    contenders = {"isthmus": lambda: sess.run([loss, train], {xp: xs}), "numpy_bptt": lambda: ref.step(xs)}
    torch = torch_or_none()
    if torch is not None:
        Wx = torch.tensor(wx, requires_grad=True)
        Wh = torch.tensor(wh, requires_grad=True)
        Bt = torch.tensor(b, requires_grad=True)
        opt = torch.optim.SGD([Wx, Wh, Bt], lr=LR)
        txs = torch.from_numpy(xs)

        def tloss():
            h = torch.zeros(B, H)
            for t in range(T):
                h = torch.tanh(txs[t] @ Wx + h @ Wh + Bt)
            return (h * h).mean()
        tstep = torch_train_step(opt, tloss)
    res = measure_with_torch(contenders, tstep if torch is not None else None, repeats=31)
    out = {"ms": {k: round(v * 1e3, 3) for k, v in res.items()},
           "ratio_vs_numpy": round(res["isthmus"] / res["numpy_bptt"], 3), "target_vs_numpy": 1.2}
    if "torch" in res:
        out["ratio_vs_torch"] = round(res["isthmus"] / res["torch"], 3)
        out["target_vs_torch_below"] = 1.0
    out["pass"] = out["ratio_vs_numpy"] <= 1.2 and out.get("ratio_vs_torch", 0) < 1.0
    emit("rnn_while_loop", out)


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    main()
