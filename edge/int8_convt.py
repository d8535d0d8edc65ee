"""int8 ConvTranspose2D (LiteRT's int8 TRANSPOSE_CONV): constant int8 weights (per tensor, or per
channel along axis 1, the output channels), int8 activations per tensor.

The fp32 kernel (kernels_convt.py) runs on the exact integers x - zx and w - zw held as float32, so
its GEMMs and tap sums are integer accumulations (exact while they stay below 2^24); the result is
requantized once: y = clamp(rint(acc * sx sw[c] / sy) + zy).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .format import EdgeModelError
from .kernel_tables import int8_kernel
from .kernels_convt import conv_transpose
from .opcontext import OpContext, clip_ufunc


@int8_kernel("ConvTranspose2D")
def conv_transpose_int8(ctx: OpContext):
    if len(ctx.inputs) != 2 or any(t is None for t in ctx.inputs) or len(ctx.outputs) != 1:
        raise EdgeModelError("ConvTranspose2D: takes x and w and makes one output")
    x, w, y = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    for t in (x, w, y):
        ctx.dtype(t, "int8")
    (sx, zx), (sy, zy) = ctx.per_tensor(x), ctx.per_tensor(y)
    data = ctx.constant(w)
    if len(w.shape) != 4:
        raise EdgeModelError(f"ConvTranspose2D: weights '{w.name}' must have rank 4, got {w.shape}")
    groups = ctx.one_int("groups", 1, lo=1, hi=max(w.shape[0], 1))
    if len(w.scale) == 1 and w.axis == -1:
        sw, zw = ctx.per_tensor(w)
        scales, wz = np.full(w.shape[1] * groups, sw), (data.astype(np.float32) - np.float32(zw))
    else:  # per output channel: axis 1 of [C, O/groups, kh, kw], the same scales in every group
        s, z = ctx.per_channel(w, 1)
        if np.any(z):
            raise EdgeModelError(f"ConvTranspose2D: per-channel weights '{w.name}' need zero points 0")
        scales, wz = np.tile(s, groups), data.astype(np.float32)
    # the float kernel's view: float32 tensors, the weights as their exact integers
    float_ctx = OpContext(ctx.op, ctx.attrs, [replace(x, dtype=np.dtype(np.float32), data=None),
                                              replace(w, dtype=np.dtype(np.float32), data=wz)],
                          [replace(y, dtype=np.dtype(np.float32))])
    float_ctx.scratch_specs = ctx.scratch_specs  # one list: the float kernel's scratch is this op's
    out_shapes, bind_float = conv_transpose(float_ctx)
    i_x, i_acc = ctx.scratch(x.shape, np.float32), ctx.scratch(out_shapes[0], np.float32)
    mult = (scales * (sx / sy)).astype(np.float32).reshape(-1, 1, 1)
    zx32, zy32, lo, hi = np.float32(zx), np.float32(zy), np.float32(-128 - zy), np.float32(127 - zy)

    def bind(ins, outs, sc):
        xf, acc = sc[i_x], sc[i_acc]
        conv = bind_float([xf, wz], [acc], sc)
        copyto, subtract, multiply, rint, add = np.copyto, np.subtract, np.multiply, np.rint, np.add
        xi, yo = ins[0], outs[0]

        def run():
            copyto(xf, xi)
            subtract(xf, zx32, out=xf)
            conv()
            multiply(acc, mult, out=acc)
            clip_ufunc(acc, lo, hi, out=acc)
            rint(acc, out=acc)
            add(acc, zy32, out=yo, casting="unsafe")
        return run
    return out_shapes, bind
