"""fp32 kernels of the edge interpreter. Each op has a `prepare(attrs, in_shapes, consts)` that
works out output shapes and allocates scratch once, and returns run(ins, outs) that writes its
results into the arena views `outs` (out= everywhere), allocating nothing per call."""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .format import EdgeModelError

Prepared = Tuple[List[Tuple[int, ...]], Callable[[list, list], None]]
KERNELS: Dict[str, Callable[..., Prepared]] = {}


def kernel(*names):
    def deco(f):
        for n in names:
            KERNELS[n] = f
        return f
    return deco


def _act(name: str):
    if name in ("none", "", None):
        return None
    if name == "relu":
        return lambda y: np.maximum(y, 0, out=y)
    if name == "relu6":
        return lambda y: np.clip(y, 0, 6, out=y)
    if name == "tanh":
        return lambda y: np.tanh(y, out=y)
    if name == "sigmoid":
        def sig(y):
            y *= 0.5
            np.tanh(y, out=y)
            y += 1
            y *= 0.5
            return y
        return sig
    raise EdgeModelError(f"unknown activation {name!r}")


def _pads(attrs) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    p = attrs.get("pads", (0, 0, 0, 0))
    if len(p) != 4:
        raise EdgeModelError(f"pads must hold 4 ints (top, bottom, left, right), got {p}")
    return (int(p[0]), int(p[1])), (int(p[2]), int(p[3]))


def _windows(xp, kh, kw, oh, ow, sh, sw, dh, dw):
    n, c = xp.shape[:2]
    s0, s1, s2, s3 = xp.strides
    return as_strided(xp, (n, c, kh, kw, oh, ow), (s0, s1, dh * s2, dw * s3, sh * s2, sw * s3), writeable=False)


@kernel("Conv2D", "FusedConv2D")
def conv(attrs, shapes, consts) -> Prepared:
    (n, c, h, w), wshape = shapes[0], shapes[1]
    o, cg, kh, kw = wshape
    sh, sw = attrs.get("strides", (1, 1))
    dh, dw = attrs.get("dilations", (1, 1))
    (t, b), (l, r) = _pads(attrs)
    groups = int(attrs.get("groups", 1))
    if c % groups or cg != c // groups or o % groups:
        raise EdgeModelError(f"conv: input channels {c} and weights {wshape} do not fit groups={groups}")
    oh = (h + t + b - (kh - 1) * dh - 1) // sh + 1
    ow = (w + l + r - (kw - 1) * dw - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise EdgeModelError(f"conv: kernel {kh}x{kw} does not fit input {h}x{w}")
    act = _act(attrs.get("activation", "none"))
    has_bias = len(shapes) > 2
    padded = np.zeros((n, c, h + t + b, w + l + r), np.float32)  # scratch; borders stay zero
    depthwise = groups == c and cg == 1 and o == c
    og = o // groups
    # depthwise: per-channel columns [C, kh*kw, OH*OW] contracted with einsum (a single-threaded C
    # loop: twice as fast as a multiply-add per tap, and unlike BLAS on thousands of 1 x 9
    # products it does not stall when another process holds the cores)
    cols = np.empty((c, kh * kw, oh * ow) if depthwise else (cg * kh * kw, oh * ow), np.float32)

    pointwise = kh == kw == 1 and (sh, sw) == (1, 1) and (t, b, l, r) == (0, 0, 0, 0) and groups == 1

    def run(ins, outs):
        x, wt = ins[0], ins[1]
        y = outs[0]
        if pointwise:  # a 1x1 convolution is a product over channels: no padding, no columns
            np.matmul(wt.reshape(o, c), x.reshape(n, c, h * w), out=y.reshape(n, o, oh * ow))
            if has_bias:
                y += ins[2].reshape(1, o, 1, 1)
            if act:
                act(y)
            return
        padded[:, :, t:t + h, l:l + w] = x
        win = _windows(padded, kh, kw, oh, ow, sh, sw, dh, dw)
        if depthwise:
            wc = wt.reshape(c, kh * kw)
            for i in range(n):
                np.copyto(cols.reshape(c, kh, kw, oh, ow), win[i])
                np.einsum("ck,ckp->cp", wc, cols, out=y[i].reshape(c, oh * ow))
        else:
            for i in range(n):
                for g in range(groups):
                    np.copyto(cols.reshape(cg, kh, kw, oh, ow), win[i, g * cg:(g + 1) * cg])
                    np.matmul(wt[g * og:(g + 1) * og].reshape(og, -1), cols,
                              out=y[i, g * og:(g + 1) * og].reshape(og, oh * ow))
        if has_bias:
            y += ins[2].reshape(1, o, 1, 1)
        if act:
            act(y)
    return [(n, o, oh, ow)], run


@kernel("MatMul", "FusedMatMul")
def matmul(attrs, shapes, consts) -> Prepared:
    ta, tb = bool(attrs.get("transpose_a", 0)), bool(attrs.get("transpose_b", 0))
    a, b = shapes[0], shapes[1]
    m, k = (a[-1], a[-2]) if ta else (a[-2], a[-1])
    k2, nn = (b[-1], b[-2]) if tb else (b[-2], b[-1])
    if k != k2:
        raise EdgeModelError(f"matmul: inner dims differ: {a} x {b}")
    batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    act = _act(attrs.get("activation", "none"))
    has_bias = len(shapes) > 2

    def run(ins, outs):
        x, y = ins[0], ins[1]
        if ta:
            x = x.swapaxes(-1, -2)
        if tb:
            y = y.swapaxes(-1, -2)
        np.matmul(x, y, out=outs[0])
        if has_bias:
            outs[0] += ins[2]
        if act:
            act(outs[0])
    return [tuple(batch) + (m, nn)], run


@kernel("BiasAdd")
def bias_add(attrs, shapes, consts) -> Prepared:
    rank = len(shapes[0])
    axis = int(attrs.get("axis", -1)) % rank
    view = (-1,) + (1,) * (rank - axis - 1)
    return [tuple(shapes[0])], lambda ins, outs: np.add(ins[0], ins[1].reshape(view), out=outs[0])


def _binary(f):
    def prepare(attrs, shapes, consts):
        return [tuple(np.broadcast_shapes(tuple(shapes[0]), tuple(shapes[1])))], \
            lambda ins, outs: f(ins[0], ins[1], out=outs[0])
    return prepare


for _name, _f in (("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply), ("Div", np.divide),
                  ("Maximum", np.maximum), ("Minimum", np.minimum)):
    KERNELS[_name] = _binary(_f)


def _unary(f):
    def prepare(attrs, shapes, consts):
        return [tuple(shapes[0])], lambda ins, outs: f(ins[0], outs[0])
    return prepare


KERNELS["Relu"] = _unary(lambda x, y: np.maximum(x, 0, out=y))
KERNELS["Relu6"] = _unary(lambda x, y: np.clip(x, 0, 6, out=y))
KERNELS["Tanh"] = _unary(lambda x, y: np.tanh(x, out=y))
KERNELS["Identity"] = _unary(lambda x, y: np.copyto(y, x))


@kernel("Sigmoid")
def sigmoid(attrs, shapes, consts):
    s = _act("sigmoid")
    return [tuple(shapes[0])], lambda ins, outs: s(np.copyto(outs[0], ins[0]) or outs[0])


def _pool(kind):
    def prepare(attrs, shapes, consts):
        n, c, h, w = shapes[0]
        kh, kw = attrs["ksize"]
        sh, sw = attrs.get("strides", (kh, kw))
        (t, b), (l, r) = _pads(attrs)
        oh = (h + t + b - kh) // sh + 1
        ow = (w + l + r - kw) // sw + 1
        fill = -np.inf if kind == "max" else 0.0
        padded = np.full((n, c, h + t + b, w + l + r), fill, np.float32)
        taps = [(slice(None), slice(None), slice(i, i + sh * (oh - 1) + 1, sh), slice(j, j + sw * (ow - 1) + 1, sw))
                for i in range(kh) for j in range(kw)]
        inv_count = None
        if kind == "avg":
            ones = np.zeros((1, 1, h + t + b, w + l + r), np.float32)
            ones[:, :, t:t + h, l:l + w] = 1
            count = sum(ones[tap] for tap in taps)
            inv_count = (1.0 / count).astype(np.float32)

        def run(ins, outs):
            y = outs[0]
            padded[:, :, t:t + h, l:l + w] = ins[0]
            np.copyto(y, padded[taps[0]])
            for tap in taps[1:]:
                if kind == "max":
                    np.maximum(y, padded[tap], out=y)
                else:
                    y += padded[tap]
            if inv_count is not None:
                y *= inv_count
        return [(n, c, oh, ow)], run
    return prepare


KERNELS["MaxPool"] = _pool("max")
KERNELS["AvgPool"] = _pool("avg")


@kernel("GlobalAvgPool")
def gap(attrs, shapes, consts):
    n, c = shapes[0][:2]
    keep = bool(attrs.get("keepdims", 0))

    def run(ins, outs):
        np.mean(ins[0], axis=(2, 3), out=outs[0].reshape(n, c))
    return [(n, c, 1, 1) if keep else (n, c)], run


@kernel("Reshape", "Flatten")
def reshape(attrs, shapes, consts):
    total = int(np.prod(shapes[0]))
    if "shape" in attrs:
        target = list(attrs["shape"])
        if -1 in target:
            known = int(np.prod([d for d in target if d != -1])) or 1
            target[target.index(-1)] = total // known
    else:
        a = int(attrs.get("axis", 1))
        target = [int(np.prod(shapes[0][:a])), int(np.prod(shapes[0][a:]))]
    if int(np.prod(target)) != total:
        raise EdgeModelError(f"reshape of {shapes[0]} to {target}")
    return [tuple(target)], lambda ins, outs: np.copyto(outs[0], ins[0].reshape(outs[0].shape))


@kernel("Concat")
def concat(attrs, shapes, consts):
    axis = int(attrs.get("axis", 0)) % len(shapes[0])
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return [tuple(out)], lambda ins, outs: np.concatenate(ins, axis=axis, out=outs[0])


@kernel("Softmax")
def softmax(attrs, shapes, consts):
    axis = int(attrs.get("axis", -1))

    def run(ins, outs):
        y = outs[0]
        np.subtract(ins[0], ins[0].max(axis=axis, keepdims=True), out=y)
        np.exp(y, out=y)
        y /= y.sum(axis=axis, keepdims=True)
    return [tuple(shapes[0])], run


@kernel("Pad")
def pad(attrs, shapes, consts):
    p = attrs["paddings"]  # flat (before0, after0, before1, after1, ...)
    pairs = [(int(p[2 * i]), int(p[2 * i + 1])) for i in range(len(shapes[0]))]
    value = float(attrs.get("constant_value", 0.0))
    out = tuple(d + a + b for d, (a, b) in zip(shapes[0], pairs))
    inner = tuple(slice(a, a + d) for d, (a, _) in zip(shapes[0], pairs))

    def run(ins, outs):
        outs[0].fill(value)
        outs[0][inner] = ins[0]
    return [out], run


@kernel("BatchNorm")
def batch_norm(attrs, shapes, consts):
    """Inference batch norm (the passes fold most of them into the previous conv)."""
    rank = len(shapes[0])
    axis = int(attrs.get("axis", 1)) % rank
    view = (-1,) + (1,) * (rank - axis - 1)
    eps = float(attrs.get("epsilon", 1e-3))
    c = shapes[0][axis]
    inv = np.empty(c, np.float32)
    shift = np.empty(c, np.float32)

    def run(ins, outs):
        x, scale, offset, mean, var = ins
        np.add(var, eps, out=inv)
        np.sqrt(inv, out=inv)
        np.divide(scale, inv, out=inv)
        np.multiply(mean, inv, out=shift)
        np.subtract(offset, shift, out=shift)
        np.multiply(x, inv.reshape(view), out=outs[0])
        outs[0] += shift.reshape(view)
    return [tuple(shapes[0])], run
