"""fp32 edge kernel of ConvTranspose2D (NCHW input, [C, O/groups, kh, kw] weights, as ONNX and
core): one GEMM per group makes every tap's contribution, then each tap is added into a strided
view of the full (unpadded) output, which is cropped by the pads. Same contract as kernels.py."""
from __future__ import annotations

import numpy as np

from .format import EdgeModelError
from .kernel_tables import kernel
from .opcontext import OpContext


def _geometry(ctx: OpContext):
    x, w = ctx.inputs
    ctx.rank(x, 4), ctx.rank(w, 4)
    n, c, h, wd = x.shape
    cw, og, kh, kw = w.shape
    groups = ctx.one_int("groups", 1, lo=1, hi=max(c, 1))
    if c != cw or c % groups or min(og, kh, kw) < 1:
        raise EdgeModelError(f"ConvTranspose2D: input channels {c} and weights {w.shape} do not fit groups={groups}")
    sh, sw = ctx.ints("strides", 2, (1, 1), lo=1, hi=1 << 16)
    dh, dw = ctx.ints("dilations", 2, (1, 1), lo=1, hi=1 << 16)
    t, b, l, r = ctx.ints("pads", 4, (0, 0, 0, 0), hi=1 << 16)
    eh, ew = ctx.ints("output_padding", 2, (0, 0), hi=1 << 16)
    if eh >= sh or ew >= sw:
        raise EdgeModelError(f"ConvTranspose2D: output_padding {(eh, ew)} must be below strides {(sh, sw)}")
    fh, fw = sh * (h - 1) + (kh - 1) * dh + 1, sw * (wd - 1) + (kw - 1) * dw + 1  # the full output
    oh, ow = fh + eh - t - b, fw + ew - l - r
    if oh <= 0 or ow <= 0:
        raise EdgeModelError(f"ConvTranspose2D: pads {(t, b, l, r)} leave no output of {x.shape}")
    return n, c, h, wd, og, kh, kw, groups, sh, sw, dh, dw, t, l, oh, ow, max(fh, t + oh), max(fw, l + ow)


@kernel("ConvTranspose2D")
def conv_transpose(ctx: OpContext):
    if len(ctx.inputs) != 2 or any(t is None for t in ctx.inputs) or len(ctx.outputs) != 1:
        raise EdgeModelError("ConvTranspose2D: takes x and w and makes one output")
    for t in ctx.inputs + ctx.outputs:
        ctx.dtype(t, "float32")
    n, c, h, wd, og, kh, kw, groups, sh, sw, dh, dw, t, l, oh, ow, fh, fw = _geometry(ctx)
    cg, o, kk, p = c // groups, og * groups, kh * kw, n * h * wd
    wdata = ctx.inputs[1].data
    # weights as [groups, Og kh kw, Cg]: rearranged once when constant, per call into scratch otherwise
    fixed = None if wdata is None else np.ascontiguousarray(
        np.asarray(wdata, np.float32).reshape(groups, cg, og * kk).transpose(0, 2, 1))
    i_w = ctx.scratch((groups, og * kk, cg), np.float32) if fixed is None else None
    i_x = ctx.scratch((c, p), np.float32) if n > 1 else None
    i_cols, i_full = ctx.scratch((groups, og * kk, p), np.float32), ctx.scratch((n, o, fh, fw), np.float32)

    def bind(ins, outs, sc):
        x, wt, y = ins[0], ins[1], outs[0]
        wm = fixed if fixed is not None else sc[i_w]
        xs = x.reshape(c, p) if n == 1 else sc[i_x]
        xsrc = None if n == 1 else x.transpose(1, 0, 2, 3)
        cols, full = sc[i_cols], sc[i_full]
        gemms = [(wm[g], xs[g * cg:(g + 1) * cg], cols[g]) for g in range(groups)]
        # tap (i, j) of every group, [N, groups, Og, H, W] (views: no copy), added into the full output's strided view
        tap = cols.reshape(groups, og, kh, kw, n, h, wd).transpose(2, 3, 4, 0, 1, 5, 6)
        full5 = full.reshape(n, groups, og, fh, fw)
        adds = [(full5[..., i * dh:i * dh + sh * (h - 1) + 1:sh, j * dw:j * dw + sw * (wd - 1) + 1:sw], tap[i, j])
                for i in range(kh) for j in range(kw)]
        crop = full[:, :, t:t + oh, l:l + ow]
        matmul, add, copyto = np.matmul, np.add, np.copyto

        def run():
            if fixed is None:
                copyto(wm, wt.reshape(groups, cg, og * kk).transpose(0, 2, 1))
            if xsrc is not None:
                copyto(xs.reshape(c, n, h, wd), xsrc)
            for a, b, out in gemms:
                matmul(a, b, out=out)
            full.fill(0)
            for dst, src in adds:
                add(dst, src, out=dst)
            copyto(y, crop)
        return run
    return [(n, o, oh, ow)], bind
