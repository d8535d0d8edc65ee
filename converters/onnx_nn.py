"""ONNX import handlers: MatMul, Gemm, Conv, pooling, BatchNormalization, LayerNormalization."""
from __future__ import annotations

import numpy as np

import isthmus.core as ism
from isthmus.core.ops.arange import arange

from .onnx_import import ImportError_, _attrs, _s, handler, refuse_unless


@handler("MatMul", attrs=())
def _matmul(c, node, ins):
    """numpy matmul semantics: a 1-D operand gains a dim for the product and loses it after."""
    a, b = ins
    if len(a.shape) == 1 and len(b.shape) == 1:
        return [ism.reduce_sum(ism.mul(a, b))]
    if len(b.shape) == 1:
        y = _matmul(c, node, [a, ism.expand_dims(b, 1)])[0]
        return [ism.squeeze(y, (len(y.shape) - 1,))]
    if len(a.shape) == 1:
        y = _matmul(c, node, [ism.expand_dims(a, 0), b])[0]
        return [ism.squeeze(y, (len(y.shape) - 2,))]
    if len(a.shape) >= 3 and len(b.shape) == 2 and a.shape[-1] is not None and b.shape[1] is not None:
        # [..., K] x [K, N] as one 2-D GEMM: numpy runs a stacked product as many small ones
        y = ism.matmul(ism.reshape(a, (-1, a.shape[-1])), b)
        lead = tuple(a.shape[:-1])
        if all(d is not None for d in lead):
            return [ism.reshape(y, lead + (b.shape[1],))]
        return [ism.reshape_to(y, ism.concat([ism.shape(a, "int64")[:-1],
                                              ism.constant(np.array([b.shape[1]], np.int64))], 0))]
    return [ism.matmul(a, b)]


@handler("Gemm", attrs=("alpha", "beta", "transA", "transB"))
def _gemm(c, node, ins):
    at = _attrs(node)
    y = ism.matmul(ins[0], ins[1], transpose_a=bool(at.get("transA", 0)), transpose_b=bool(at.get("transB", 0)))
    if at.get("alpha", 1.0) != 1.0:
        y = y * float(at["alpha"])
    if len(ins) > 2 and ins[2] is not None:
        bias = ins[2] if at.get("beta", 1.0) == 1.0 else ins[2] * float(at["beta"])
        y = ism.bias_add(y, bias) if len(bias.shape) == 1 and bias.shape[0] == y.shape[-1] else y + bias
    return [y]


def _conv_pads(at, spatial_in, kernel, strides, dilations):
    auto = _s(at.get("auto_pad", "NOTSET"))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for n, k, s, d in zip(spatial_in, kernel, strides, dilations):
            refuse_unless(n is not None, f"auto_pad {auto} needs known spatial dims")
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return tuple(out)
    n = len(kernel)
    if auto == "VALID":
        return ((0, 0),) * n
    refuse_unless(auto == "NOTSET", f"auto_pad '{auto}' is not an ONNX auto_pad value")
    p = list(at.get("pads", [0] * 2 * n))
    refuse_unless(len(p) == 2 * n, f"pads {p} do not fit a {n}-D window")
    return tuple((p[i], p[i + n]) for i in range(n))


def _spatial_2d(x, what):
    refuse_unless(len(x.shape) == 4, f"only 2-D {what} (NCHW input) is supported, the input has rank {len(x.shape)}")


@handler("Conv", attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
def _conv(c, node, ins):
    at = _attrs(node)
    x, w = ins[0], ins[1]
    _spatial_2d(x, "convolution")
    strides = tuple(at.get("strides", [1, 1]))
    dil = tuple(at.get("dilations", [1, 1]))
    if "kernel_shape" in at and w.shape[2:] != tuple(at["kernel_shape"]):
        raise ImportError_(f"kernel_shape {at['kernel_shape']} disagrees with the weights' {list(w.shape[2:])}")
    pads = _conv_pads(at, x.shape[2:], w.shape[2:], strides, dil)
    y = ism.conv2d(x, w, strides=strides, padding=pads, dilations=dil, groups=int(at.get("group", 1)))
    if len(ins) > 2 and ins[2] is not None:
        y = ism.bias_add(y, ins[2], axis=1)
    return [y]


def _pool(kind):
    """2-D pooling on the core op; 3-D as two separable 2-D passes (H and W, then D): a box maximum is
    the maximum of maxima, and a box average over the real elements the average of averages, since
    the real elements of a window form a box too (onnx_ops_conv puts 1-D handling in front of this)."""
    def h(c, node, ins):
        at = _attrs(node)
        x = ins[0]
        refuse_unless(len(x.shape) in (4, 5), f"only 1-D, 2-D and 3-D {node.op_type} is supported, "
                                              f"the input has rank {len(x.shape)}")
        want_indices = len(node.output) > 1 and bool(node.output[1])
        refuse_unless(not want_indices or len(x.shape) == 4,
                      "the Indices output (argmax positions) is supported for 2-D MaxPool only")
        k = tuple(at["kernel_shape"])
        refuse_unless(len(k) == len(x.shape) - 2, f"kernel_shape {list(k)} does not fit rank {len(x.shape)}")
        s = tuple(at.get("strides", [1] * len(k)))
        d = tuple(at.get("dilations", [1] * len(k)))
        pads = given = _conv_pads(at, x.shape[2:], k, s, d)
        if at.get("ceil_mode", 0):  # extend the bottom/right padding so the last partial window counts
            grown = []
            for n_, kk, ss, dd, (a, b) in zip(x.shape[2:], k, s, d, pads):
                refuse_unless(n_ is not None, "ceil_mode needs known spatial dims")
                eff = (kk - 1) * dd + 1
                out = -(-(n_ + a + b - eff) // ss) + 1
                if (out - 1) * ss >= n_ + a:
                    out -= 1
                grown.append((a, max(b, (out - 1) * ss + eff - n_ - a)))
            pads = tuple(grown)
        if kind == "avg" and at.get("count_include_pad", 0) and any(p != (0, 0) for p in given):
            # the given pads count as zeros; what ceil_mode adds past them does not
            x = ism.pad(x, ((0, 0), (0, 0)) + given)
            pads = tuple((0, b - gb) for (_, b), (_, gb) in zip(pads, given))
        f = ism.max_pool if kind == "max" else ism.avg_pool
        if len(k) == 2:
            y = f(x, k, s, pads, dilations=d)
            return [y, _argmax_indices(x, k, s, pads, d, int(at.get("storage_order", 0)))] if want_indices else [y]
        return [_pool_3d(f, x, k, s, pads, d)]
    return h


def _argmax_indices(x, k, s, pads, d, storage_order: int):
    """MaxPool's Indices: per window, where its first maximum lies in the whole input, flattened
    (n, c, h, w) row-major (storage_order 0) or with h and w swapped (1). The windows' taps are a
    table fixed at import (known channel and spatial dims), gathered from the -inf padded input."""
    ch, hh, ww = x.shape[1:]
    refuse_unless(None not in (ch, hh, ww), "the Indices output needs known channel and spatial dims")
    (pt, pb), (pl, pr) = pads
    hp, wp = hh + pt + pb, ww + pl + pr
    oh = (hp - ((k[0] - 1) * d[0] + 1)) // s[0] + 1
    ow = (wp - ((k[1] - 1) * d[1] + 1)) // s[1] + 1
    i = (np.arange(oh)[:, None, None, None] * s[0] + np.arange(k[0])[None, None, :, None] * d[0])  # padded row
    j = (np.arange(ow)[None, :, None, None] * s[1] + np.arange(k[1])[None, None, None, :] * d[1])  # padded col
    i, j = np.broadcast_arrays(i, j)  # (oh, ow, kh, kw)
    taps = (i * wp + j).reshape(-1)
    orig_h, orig_w = i - pt, j - pl
    orig = (orig_h * ww + orig_w if storage_order == 0 else orig_h + orig_w * hh).reshape(oh * ow, -1)
    low = np.finfo(x.dtype).min if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = ism.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_value=low) if any(pads[0] + pads[1]) else x
    win = ism.reshape(ism.gather(ism.reshape(xp, (-1, ch, hp * wp)), ism.constant(taps.astype(np.int64)), 2),
                      (-1, ch, oh * ow, k[0] * k[1]))
    tap = ism.argmax(win, -1)  # (N, C, oh*ow): the first maximum's tap
    pos = ism.add(tap, ism.constant((np.arange(oh * ow) * k[0] * k[1]).astype(np.int64)))
    within = ism.gather(ism.constant(orig.reshape(-1).astype(np.int64)), pos, 0)
    n = ism.reshape(ism.shape(x, "int64")[0:1], ())
    image = ism.reshape(arange(ism.constant(np.array(0, np.int64)), ism.mul(n, ism.constant(np.array(ch, np.int64)))),
                        (-1, ch, 1))
    flat = ism.add(within, ism.mul(image, ism.constant(np.array(hh * ww, np.int64))))
    return ism.reshape(flat, (-1, ch, oh, ow))


def _pool_3d(f, x, k, s, pads, d):
    """NCDHW pooling as a 2-D pass over (H, W) with C*D as channels, then one over (D, H'*W'). Dims
    unknown at import (a Reshape to a shape computed at run time, as torch's opset-9 LRN makes) are
    read at run time, so the reshapes between the passes become run-time reshapes."""
    ch, dd, hh, ww = x.shape[1:]
    if all(v is not None for v in (ch, dd, hh, ww)):
        y = f(ism.reshape(x, (-1, ch * dd, hh, ww)), k[1:], s[1:], pads[1:], dilations=d[1:])
        h2, w2 = y.shape[2], y.shape[3]
        y = f(ism.reshape(y, (-1, ch, dd, h2 * w2)), (k[0], 1), (s[0], 1), (pads[0], (0, 0)), dilations=(d[0], 1))
        return ism.reshape(y, (-1, ch, y.shape[2], h2, w2))
    ch, dd, hh, ww = (_dim(x, i) for i in range(1, 5))
    y = f(_reshape_dims(x, [ch * dd, hh, ww]), k[1:], s[1:], pads[1:], dilations=d[1:])
    h2, w2 = _dim(y, 2), _dim(y, 3)
    y = f(_reshape_dims(y, [ch, dd, h2 * w2]), (k[0], 1), (s[0], 1), (pads[0], (0, 0)), dilations=(d[0], 1))
    return _reshape_dims(y, [ch, _dim(y, 2), h2, w2])


def _dim(x, i: int):
    """Dim i of x as a 1-element int64 tensor: a constant when known at import, else read at run time."""
    if x.shape[i] is not None:
        return ism.constant(np.array([x.shape[i]], np.int64))
    return ism.shape(x, "int64")[i:i + 1]


def _reshape_dims(x, dims):
    """x reshaped to (-1, *dims), dims being 1-element int64 tensors."""
    return ism.reshape_to(x, ism.concat([ism.constant(np.array([-1], np.int64))] + list(dims), 0))


handler("MaxPool", attrs=("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order",
                          "strides"))(_pool("max"))
handler("AveragePool", attrs=("auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads",
                              "strides"))(_pool("avg"))


@handler("GlobalAveragePool", attrs=())
def _gap(c, node, ins):
    _spatial_2d(ins[0], "GlobalAveragePool")
    return [ism.global_avg_pool(ins[0], keepdims=True)]


@handler("BatchNormalization", 7, attrs=("epsilon", "momentum", "spatial", "training_mode", "is_test"))
def _bn(c, node, ins):
    """Inference with the given statistics; opset 14+'s training_mode normalises with the batch's
    own and returns the updated running mean and variance."""
    at = _attrs(node)
    refuse_unless(at.get("spatial", 1) == 1, "spatial=0 (per-activation statistics) is not supported")
    eps = float(at.get("epsilon", 1e-5))
    x = ins[0]
    extra = [o for o in node.output[1:] if o]
    if at.get("training_mode", 0) or extra:
        refuse_unless(c.opset >= 14, "the training-mode outputs of opsets before 14 (saved mean/variance) "
                                     "are not supported")
        return _bn_training(x, ins[1:5], eps, float(at.get("momentum", 0.9)), len(node.output))
    return [ism.batch_norm(x, *ins[1:5], epsilon=eps, training=False, axis=1)]


def _bn_training(x, params, eps, momentum, n_out):
    scale, bias, mean_in, var_in = params
    axes = (0,) + tuple(range(2, len(x.shape)))
    shape = (1, -1) + (1,) * (len(x.shape) - 2)
    mean = ism.reduce_mean(x, axes)
    centred = ism.sub(x, ism.reshape(mean, shape))
    var = ism.reduce_mean(ism.square(centred), axes)
    y = ism.mul(centred, ism.reshape(ism.mul(ism.rsqrt(ism.add(var, np.array(eps, x.dtype))), scale), shape))
    y = ism.add(y, ism.reshape(bias, shape))
    m = np.array(momentum, x.dtype)
    run_mean = ism.add(ism.mul(mean_in, m), ism.mul(mean, np.array(1 - momentum, x.dtype)))
    run_var = ism.add(ism.mul(var_in, m), ism.mul(var, np.array(1 - momentum, x.dtype)))
    return [y, run_mean, run_var][:n_out]


@handler("LayerNormalization", 17, attrs=("axis", "epsilon", "stash_type"))
def _ln(c, node, ins):
    at = _attrs(node)
    x = ins[0]
    rank = len(x.shape)
    axis = int(at.get("axis", -1)) % rank
    eps = float(at.get("epsilon", 1e-5))
    refuse_unless(at.get("stash_type", 1) == 1, "stash_type other than 1 (float32 statistics) is not supported")
    beta = ins[2] if len(ins) > 2 and ins[2] is not None else ism.zeros_like(ins[1])
    norm_shape = x.shape[axis:]
    wants_stats = any(o for o in node.output[1:])
    if not wants_stats and tuple(ins[1].shape) == tuple(norm_shape) and tuple(beta.shape) == tuple(norm_shape):
        return [ism.layer_norm(x, ins[1], beta, axis=axis, epsilon=eps)]
    axes = tuple(range(axis, rank))
    xf = x if x.dtype == np.float32 else ism.cast(x, np.float32)
    mean = ism.reduce_mean(xf, axes, keepdims=True)
    centred = ism.sub(xf, mean)
    inv = ism.rsqrt(ism.add(ism.reduce_mean(ism.square(centred), axes, keepdims=True), np.float32(eps)))
    y = ism.mul(centred, inv)
    if y.dtype != x.dtype:
        y = ism.cast(y, x.dtype)
    y = ism.add(ism.mul(y, ins[1]), beta)
    return [y, mean, inv]
