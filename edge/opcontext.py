"""What a kernel's prepare sees: its tensors (resolved shapes, dtypes, quantization, constant data),
its attributes with checked accessors, and a way to ask the arena for scratch memory.

Every accessor validates what it returns (kind, length, range), so a hostile attribute becomes an
EdgeModelError naming it, and no geometry a kernel derives can ask for unbounded memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .format import EdgeModelError

MAX_DIM = 1 << 31

# np.clip's Python wrappers cost about 2 us a call on top of the clip ufunc they end in (numpy 2.x);
# hot paths call the ufunc itself
try:
    from numpy._core.umath import clip as clip_ufunc
except ImportError:  # another numpy layout: the wrapper does the same work
    clip_ufunc = np.clip


@dataclass
class TensorSpec:
    name: str
    dtype: np.dtype
    shape: Tuple[int, ...]
    scale: np.ndarray  # float32, empty when not quantized
    zero_point: np.ndarray  # int64
    axis: int  # -1: per tensor
    data: Optional[np.ndarray] = None  # constants only (a read-only view of the file)


class OpContext:
    def __init__(self, op: str, attrs: Dict[str, object], inputs: List[Optional[TensorSpec]],
                 outputs: List[TensorSpec]):
        self.op, self.attrs, self.inputs, self.outputs = op, attrs, inputs, outputs
        self.scratch_specs: List[Tuple[Tuple[int, ...], np.dtype]] = []

    # ---- scratch -------------------------------------------------------------------------------
    def scratch(self, shape: Sequence[int], dtype) -> int:
        """Ask for a scratch array alive during this op only; bind() receives it at this index."""
        self.scratch_specs.append((tuple(int(d) for d in shape), np.dtype(dtype)))
        return len(self.scratch_specs) - 1

    def shared_scratch(self, *specs: Tuple[Sequence[int], object]) -> int:
        """One scratch region for arrays that are never alive together within the op (say, the
        im2col columns, dead after the GEMM, and the requantization's int64 temporary); bind()
        receives raw bytes and cuts each array out of them with `overlay`."""
        nbytes = max(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in specs)
        return self.scratch((nbytes,), np.uint8)

    # ---- checked attributes ----------------------------------------------------------------------
    def ints(self, name: str, n: int, default: Optional[Sequence[int]] = None, lo: int = 0,
             hi: int = MAX_DIM) -> Tuple[int, ...]:
        v = self.attrs.get(name, default)
        if v is None:
            raise EdgeModelError(f"{self.op}: attribute '{name}' is required")
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            v = (int(v),) * n
        if not isinstance(v, (tuple, list)) or len(v) != n or not all(isinstance(a, (int, np.integer)) for a in v):
            raise EdgeModelError(f"{self.op}: attribute '{name}' must be {n} ints, got {v!r}")
        if not all(lo <= a <= hi for a in v):
            raise EdgeModelError(f"{self.op}: attribute '{name}' = {tuple(v)} outside [{lo}, {hi}]")
        return tuple(int(a) for a in v)

    def one_int(self, name: str, default: Optional[int] = None, lo: int = -MAX_DIM, hi: int = MAX_DIM) -> int:
        return self.ints(name, 1, None if default is None else (default,), lo, hi)[0]

    def choice(self, name: str, default: str, choices: Sequence[str]) -> str:
        v = self.attrs.get(name, default)
        if v not in choices:
            raise EdgeModelError(f"{self.op}: attribute '{name}' = {v!r}; expected one of {', '.join(choices)}")
        return v

    def number(self, name: str, default: float) -> float:
        v = self.attrs.get(name, default)
        if not isinstance(v, (int, float)) or not np.isfinite(v):
            raise EdgeModelError(f"{self.op}: attribute '{name}' must be a finite number, got {v!r}")
        return float(v)

    def axis(self, name: str, rank: int, default: int) -> int:
        return self.one_int(name, default, -rank, rank - 1) % rank

    # ---- checked tensors -----------------------------------------------------------------------
    def arity(self, lo: int, hi: int) -> None:
        n = len(self.inputs)
        if not lo <= n <= hi or any(t is None for t in self.inputs):
            raise EdgeModelError(f"{self.op}: takes {lo}..{hi} inputs, got {n}")
        if len(self.outputs) != 1:
            raise EdgeModelError(f"{self.op}: makes one output, the file lists {len(self.outputs)}")

    def rank(self, t: TensorSpec, r: int) -> None:
        if len(t.shape) != r:
            raise EdgeModelError(f"{self.op}: '{t.name}' must have rank {r}, got shape {t.shape}")

    def dtype(self, t: TensorSpec, *names: str) -> None:
        if t.dtype.name not in names:
            raise EdgeModelError(f"{self.op}: '{t.name}' is {t.dtype.name}, expected {' or '.join(names)}")

    def per_tensor(self, t: TensorSpec) -> Tuple[float, int]:
        """(scale, zero_point) of a per-tensor quantized int8 tensor."""
        if len(t.scale) != 1 or t.axis != -1:
            raise EdgeModelError(f"{self.op}: '{t.name}' needs one scale (per-tensor quantization), "
                                 f"has {len(t.scale)} (axis {t.axis})")
        scale, zp = float(t.scale[0]), int(t.zero_point[0]) if len(t.zero_point) else 0
        _check_qparams(self.op, t.name, scale, zp)
        return scale, zp

    def per_channel(self, t: TensorSpec, axis: int) -> Tuple[np.ndarray, np.ndarray]:
        """Scales and zero points (float64, int64) per index along `axis` (a per-tensor pair broadcast)."""
        n = t.shape[axis]
        if len(t.scale) == 1 and t.axis == -1:
            s, z = self.per_tensor(t)
            return np.full(n, s), np.full(n, z, np.int64)
        if t.axis != axis or len(t.scale) != n:
            raise EdgeModelError(f"{self.op}: '{t.name}' needs per-tensor or per-axis {axis} quantization "
                                 f"({n} scales), has {len(t.scale)} scales on axis {t.axis}")
        zp = t.zero_point if len(t.zero_point) else np.zeros(n, np.int64)
        for s, z in zip(t.scale, zp):
            _check_qparams(self.op, t.name, float(s), int(z))
        return t.scale.astype(np.float64), zp.astype(np.int64)

    def constant(self, t: TensorSpec) -> np.ndarray:
        if t.data is None:
            raise EdgeModelError(f"{self.op}: '{t.name}' must be a constant in the file")
        return t.data


def overlay(raw: np.ndarray, shape: Sequence[int], dtype) -> np.ndarray:
    """An array of `shape` and `dtype` over the start of a raw scratch region."""
    return np.ndarray(tuple(shape), dtype=dtype, buffer=raw)


def _check_qparams(op: str, name: str, scale: float, zp: int) -> None:
    if not (np.isfinite(scale) and scale > 0):
        raise EdgeModelError(f"{op}: '{name}' has scale {scale}; it must be positive and finite")
    if not -128 <= zp <= 127:
        raise EdgeModelError(f"{op}: '{name}' has zero point {zp} outside int8")


def conv_out(op: str, size: int, k: int, stride: int, dilation: int, pad0: int, pad1: int) -> int:
    """Output length of a window sweep; pads beyond the window's reach are refused (they would only
    add all-padding windows, and they bound the padded scratch by the input's size)."""
    eff = (k - 1) * dilation + 1
    if max(pad0, pad1) > eff - 1 and max(pad0, pad1) > 0:
        raise EdgeModelError(f"{op}: padding {pad0},{pad1} exceeds the window's reach {eff - 1}")
    o = (size + pad0 + pad1 - eff) // stride + 1
    if o <= 0:
        raise EdgeModelError(f"{op}: window {k} (dilation {dilation}) does not fit input {size} "
                             f"with padding {pad0},{pad1}")
    return o



@dataclass
class Window:
    """The geometry of a convolution or pooling window sweep over an NCHW input."""
    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    t: int
    b: int
    l: int
    r: int
    oh: int
    ow: int
    o: int = 0
    cg: int = 0
    groups: int = 1

    @property
    def padded(self) -> bool:
        return bool(self.t or self.b or self.l or self.r)


def conv_geometry(ctx: OpContext, x: TensorSpec, w: TensorSpec) -> Window:
    """Checked geometry of Conv2D (NCHW input, OIHW weights; pads are (top, bottom, left, right))."""
    ctx.rank(x, 4), ctx.rank(w, 4)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    sh, sw = ctx.ints("strides", 2, (1, 1), lo=1)
    dh, dw = ctx.ints("dilations", 2, (1, 1), lo=1)
    t, b, l, r = ctx.ints("pads", 4, (0, 0, 0, 0))
    groups = ctx.one_int("groups", 1, lo=1)
    if c % groups or o % groups or cg != c // groups or min(o, cg, kh, kw) < 1:
        raise EdgeModelError(f"{ctx.op}: input channels {c} and weights {w.shape} do not fit groups={groups}")
    oh, ow = conv_out(ctx.op, h, kh, sh, dh, t, b), conv_out(ctx.op, wd, kw, sw, dw, l, r)
    return Window(n, c, h, wd, kh, kw, sh, sw, dh, dw, t, b, l, r, oh, ow, o, cg, groups)


def pool_geometry(ctx: OpContext, x: TensorSpec) -> Window:
    ctx.rank(x, 4)
    n, c, h, w = x.shape
    kh, kw = ctx.ints("ksize", 2, lo=1)
    sh, sw = ctx.ints("strides", 2, (kh, kw), lo=1)
    t, b, l, r = ctx.ints("pads", 4, (0, 0, 0, 0))
    oh, ow = conv_out(ctx.op, h, kh, sh, 1, t, b), conv_out(ctx.op, w, kw, sw, 1, l, r)
    return Window(n, c, h, w, kh, kw, sh, sw, 1, 1, t, b, l, r, oh, ow)


class WideIm2col:
    """im2col whose rows are contiguous runs: each tap of a window sweep is one flat slice.

    A stride-1 window's tap (i, j) over a padded image of width Wp reads, for the output row y,
    the run image[y + i, j : j + OW]; computing every output on a grid OH x Wp instead (the
    last Wp - OW columns of each row are junk, computed and dropped), the whole tap is the
    single contiguous slice flat[i * Wp + j : i * Wp + j + OH * Wp]. Copying such slices runs
    at memcpy speed, where a 5-d strided window copy pays numpy's per-row overhead for rows a
    few elements long. A stride s splits the padded image into s_h x s_w phases
    (rows a * s_h + p_i, columns b * s_w + p_j), in which every tap is again a stride-1 slice.

    Layout: phases [S, C, N, (Hs + 1) * Ws] (one spare row per phase: the junk columns of the
    last taps read past the image), columns [C, K, N, OH * Ws] with the taps in `order`
    (grouped by phase; column k holds the kernel's tap order[k] = i * kw + j), and the result of
    the contraction [., N, OH, Ws] of which [..., :OW] is the output.
    """

    def __init__(self, g: Window, compact: bool = False):
        """compact: the classic layout instead, columns [C, K, N, OH * OW] copied out of a 6-d window
        view of one padded image: no junk columns, but rows only OW long (for GEMM convolutions,
        where junk columns cost GEMM work: measured slower wide on the stem and the core CNN)."""
        # more stride phases than taps (a stride beyond the window): the phase layout would loop over and
        # allocate for phases no tap reads; a hostile stride of 2^30 made that a hang. Classic layout then.
        compact = compact or g.sh * g.sw > g.kh * g.kw
        self.g, self.compact = g, compact
        sh, sw = (1, 1) if compact else (g.sh, g.sw)
        self.psh, self.psw = sh, sw
        hp, wp = g.h + g.t + g.b, g.w + g.l + g.r
        self.hs, self.ws = -(-hp // sh), -(-wp // sw)
        self.rows = self.hs + 1
        self.L = g.oh * (g.ow if compact else self.ws)
        self.kk = g.kh * g.kw
        self.phase_shape = (sh * sw, g.c, g.n, self.rows * self.ws)
        self.cols_shape = (g.c, self.kk, g.n, self.L)
        order, blocks = [], []
        if compact:
            order, blocks = list(range(self.kk)), [(0, 0, g.kh, g.kw, 0, 0, 0)]
        for pi in range(sh if not compact else 0):
            for pj in range(sw):
                rows_i = [i for i in range(g.kh) if (i * g.dh) % sh == pi]
                cols_j = [j for j in range(g.kw) if (j * g.dw) % sw == pj]
                if not rows_i or not cols_j:
                    continue
                r0, c0 = (rows_i[0] * g.dh) // sh, (cols_j[0] * g.dw) // sw
                rstep = (rows_i[1] * g.dh) // sh - r0 if len(rows_i) > 1 else 0
                cstep = (cols_j[1] * g.dw) // sw - c0 if len(cols_j) > 1 else 0
                blocks.append((pi * sw + pj, len(order), len(rows_i), len(cols_j), r0 * self.ws + c0,
                               rstep * self.ws, cstep))
                order += [i * g.kw + j for i in rows_i for j in cols_j]
        self.order = order
        self.blocks = blocks

    def out_view(self, acc: np.ndarray) -> np.ndarray:
        """[M, N * OH * Ws] (the contraction's result) -> the [M, N, OH, OW] view of real outputs."""
        if self.compact:
            return acc.reshape(acc.shape[0], self.g.n, self.g.oh, self.g.ow)
        return acc.reshape(acc.shape[0], self.g.n, self.g.oh, self.ws)[..., :self.g.ow]

    def bind(self, x: np.ndarray, phases: np.ndarray, cols: np.ndarray, fill):
        """A step filling the phases from x ([N, C, H, W]) with `fill` around it, then the columns."""
        g, ws, rows = self.g, self.ws, self.rows
        xt = x.transpose(1, 0, 2, 3)
        fills, copies = [], []
        used = {b[0] for b in self.blocks}  # a stride beyond the window leaves phases no tap reads
        sh, sw = self.psh, self.psw
        for pi in range(sh):
            for pj in range(sw):
                if pi * sw + pj not in used:
                    continue
                img = phases[pi * sw + pj].reshape(g.c, g.n, rows, ws)
                a0 = max(0, -(-(g.t - pi) // sh))
                a1 = min(self.hs, max(a0, -(-(g.t + g.h - pi) // sh)))
                b0 = max(0, -(-(g.l - pj) // sw))
                b1 = min(ws, max(b0, -(-(g.l + g.w - pj) // sw)))
                if a1 == a0 or b1 == b0:
                    fills.append(img)
                    continue
                fills += [v for v in (img[:, :, :a0], img[:, :, a1:], img[:, :, a0:a1, :b0], img[:, :, a0:a1, b1:])
                          if v.size]
                r, c = a0 * sh + pi - g.t, b0 * sw + pj - g.l
                copies.append((img[:, :, a0:a1, b0:b1],
                               xt[:, :, r:r + sh * (a1 - a0 - 1) + 1:sh, c:c + sw * (b1 - b0 - 1) + 1:sw]))
        e = phases.itemsize
        s_c, s_n = phases.strides[1], phases.strides[2]
        gathers = []
        if self.compact:  # one copy out of the 6-d window view [C, kh, kw, N, OH, OW]
            src = np.lib.stride_tricks.as_strided(
                phases[0], (g.c, g.kh, g.kw, g.n, g.oh, g.ow),
                (s_c, g.dh * ws * e, g.dw * e, s_n, g.sh * ws * e, g.sw * e), writeable=False)
            dst = cols.reshape(g.c, g.kh, g.kw, g.n, g.oh, g.ow)
            if not np.shares_memory(dst, cols):
                raise EdgeModelError("im2col columns must be a view that splits into taps without a copy")
            gathers.append((dst, src))
        for s, k0, ni, nj, off, rstep, cstep in ([] if self.compact else self.blocks):
            src = np.lib.stride_tricks.as_strided(
                phases[s, :, :, off:], (g.c, ni, nj, g.n, self.L), (s_c, rstep * e, cstep * e, s_n, e), writeable=False)
            dst = cols[:, k0:k0 + ni * nj].reshape(g.c, ni, nj, g.n, self.L)
            if not np.shares_memory(dst, cols):
                raise EdgeModelError("im2col columns must be a view that splits into taps without a copy")
            gathers.append((dst, src))
        copyto = np.copyto

        def run():
            for v in fills:
                v.fill(fill)
            for dst, src in copies:
                copyto(dst, src)
            for dst, src in gathers:
                copyto(dst, src)
        return run
