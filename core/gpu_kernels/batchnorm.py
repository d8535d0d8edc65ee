"""Batch norm on a CUDA GPU (float32): per-channel statistics as partial sums by channel and image
group (float64 accumulation, as the CPU's compiled kernels) and one small launch that combines
them, then one elementwise launch; the gradient likewise (partial sums of dy and dy * (x - mean),
one combining launch that also gives 1/sqrt(var + eps), one elementwise launch for dx). The generic
array-module kernels take a dozen or more launches per layer. Other dtypes and the CI stand-in
keep the generic kernels."""
from __future__ import annotations

import numpy as np

from . import generic_factory

_SRC = r"""
#ifdef NARROW_INDEX
typedef int idx_t;
#else
typedef long long idx_t;
#endif
// x (and dy) viewed as [A, C, B]. Blocks (C, S): block (c, s) sums channel c over the images
// a = s, s + S, ... in double; part[(c * S + s) * 2 + 0/1]. One block per channel, as before,
// left most of the H100 idle on the few-channel layers of a small batch.
#define BN_PARTIAL(ACCUMULATE)                                                    \
  __shared__ double r1[256], r2[256];                                             \
  const int c = blockIdx.x, s = blockIdx.y;                                      \
  const int per = (A - s + S - 1) / S;                                           \
  const idx_t items = (idx_t)per * B;                                            \
  double a1 = 0.0, a2 = 0.0;                                                     \
  for (idx_t k = threadIdx.x; k < items; k += blockDim.x) {                      \
    const idx_t m = k / B;                                                       \
    const idx_t at = (((idx_t)s + m * S) * C + c) * B + (k - m * B);             \
    ACCUMULATE                                                                   \
  }                                                                              \
  r1[threadIdx.x] = a1; r2[threadIdx.x] = a2;                                     \
  __syncthreads();                                                               \
  for (int st = blockDim.x / 2; st > 0; st >>= 1) {                              \
    if (threadIdx.x < st) { r1[threadIdx.x] += r1[threadIdx.x + st]; r2[threadIdx.x] += r2[threadIdx.x + st]; } \
    __syncthreads();                                                             \
  }                                                                              \
  if (threadIdx.x == 0) { part[(c * S + s) * 2] = r1[0]; part[(c * S + s) * 2 + 1] = r2[0]; }

extern "C" {
// sums of x and x^2
__global__ void isthmus_bn_stats(const float* __restrict__ x, double* __restrict__ part, int A, int C, idx_t B, int S) {
  BN_PARTIAL(const double v = x[at]; a1 += v; a2 += v * v;)
}

// sums of dy and dy * (x - mean)
__global__ void isthmus_bn_grad_sums(const float* __restrict__ dy, const float* __restrict__ x,
                                     const float* __restrict__ mean, double* __restrict__ part,
                                     int A, int C, idx_t B, int S) {
  const double mc = mean[blockIdx.x];
  BN_PARTIAL(const double g = dy[at]; a1 += g; a2 += g * (x[at] - mc);)
}

// one thread per channel: the S partial sums to mean and population variance (stats), or to
// dbeta, dgamma and inv = 1 / sqrt(var + eps) (gradient)
__global__ void isthmus_bn_finish(const double* __restrict__ part, const float* __restrict__ var,
                                  float* __restrict__ o1, float* __restrict__ o2, float* __restrict__ inv,
                                  int C, int S, double count, float eps, int stats) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double s1 = 0.0, s2 = 0.0;
  for (int s = 0; s < S; ++s) { s1 += part[(c * S + s) * 2]; s2 += part[(c * S + s) * 2 + 1]; }
  if (stats) {
    const double m = s1 / count, v = s2 / count - m * m;
    o1[c] = (float)m; o2[c] = (float)(v > 0.0 ? v : 0.0);
  } else {
    const float iv = 1.0f / sqrtf(var[c] + eps);
    inv[c] = iv; o1[c] = (float)s1; o2[c] = (float)(s2 * iv);
  }
}
}
"""
_MOD: dict = {}
_NARROW = 1 << 30  # elements: below it the flat indices are 32-bit (as gpu_kernels/raw.py)


def _fn(cp, name, narrow=True):
    fn = _MOD.get((narrow, name))
    if fn is None:
        mod = _MOD.get(narrow)
        if mod is None:
            mod = _MOD[narrow] = cp.RawModule(code=_SRC, options=("-DNARROW_INDEX",) if narrow else ())
        fn = _MOD[(narrow, name)] = mod.get_function(name)
    return fn


def _preload(cp):
    for narrow in (True, False):
        for name in ("isthmus_bn_stats", "isthmus_bn_grad_sums", "isthmus_bn_finish"):
            _fn(cp, name, narrow)


def _sums(cp, name, arrays, a, c, b):
    """Launch a partial-sums kernel over [A, C, B] arrays: about 512 blocks; returns (part, S)."""
    splits = max(1, min(a, -(-512 // c)))
    part = cp.empty((c, splits, 2), dtype=cp.float64)
    narrow = all(x.size < _NARROW for x in arrays if hasattr(x, "size"))
    _fn(cp, name, narrow)((c, splits), (256,), tuple(arrays) + (part, np.int32(a), np.int32(c),
                                                               (np.int32 if narrow else np.int64)(b), np.int32(splits)))
    return part, splits


def _finish(cp, part, splits, c, count, var=None, eps=0.0):
    o1, o2 = cp.empty(c, cp.float32), cp.empty(c, cp.float32)
    inv = cp.empty(c, cp.float32) if var is not None else o1
    _fn(cp, "isthmus_bn_finish")(((c + 127) // 128,), (128,), (
        part, var if var is not None else o1, o1, o2, inv, np.int32(c), np.int32(splits), np.float64(count),
        np.float32(eps), np.int32(var is None)))
    return o1, o2, inv


def _nb(narrow: bool) -> str:
    return "int32 nB" if narrow else "int64 nB"


def _channel(narrow: bool) -> str:
    """The channel of flat item i of an [A, C, B] array, in ElementwiseKernel code."""
    return "const int c = (int)(((int)i / nB) % nC); " if narrow else "const int c = (int)((i / nB) % nC); "


def _ew(cp, name, params, outs, body):
    k = _MOD.get(name)
    if k is None:
        k = _MOD[name] = cp.ElementwiseKernel(params, outs, body, name)
    return k


def _acb(x, axis):
    a = 1
    for d in x.shape[:axis]:
        a *= d
    c = x.shape[axis]
    return a, c, x.size // max(a * c, 1)


def _usable(xp, *arrays) -> bool:
    return hasattr(xp, "RawModule") and all(a.dtype == np.float32 for a in arrays)


def _axis(node):
    rank = len(node.inputs[0].shape)
    a = node.attrs["axis"]
    return a + rank if a < 0 else a


def _batch_norm(node, ctx):
    generic = generic_factory("BatchNorm")(node, ctx)
    xp = ctx.xp
    if not hasattr(xp, "RawModule"):
        return generic
    axis, eps, training = _axis(node), float(node.attrs["epsilon"]), node.attrs["training"]
    _preload(xp)  # compiled now, not inside a captured step

    def run(x, scale, offset, mean, var):
        if not _usable(xp, x, scale, offset, mean, var) or x.ndim < 2:
            return generic(x, scale, offset, mean, var)
        x = xp.ascontiguousarray(x)
        a, c, b = _acb(x, axis)
        if training:
            part, splits = _sums(xp, "isthmus_bn_stats", (x,), a, c, b)
            mean, var, _ = _finish(xp, part, splits, c, a * b)
        narrow = x.size < _NARROW
        k = _ew(xp, f"isthmus_bn_apply{'32' if narrow else ''}",
                "T x, raw T mean, raw T var, raw T scale, raw T offset, float32 eps, " + _nb(narrow) + ", int32 nC", "T y",
                _channel(narrow) + "const T s = scale[c] * rsqrtf(var[c] + eps); y = (x - mean[c]) * s + offset[c];")
        y = k(x, mean, var, scale, offset, np.float32(eps), (np.int32 if narrow else np.int64)(b), np.int32(c))
        return y, mean, var
    return run


def _batch_norm_grad(node, ctx):
    generic = generic_factory("BatchNormGrad")(node, ctx)
    xp = ctx.xp
    if not hasattr(xp, "RawModule"):
        return generic
    axis, eps, training = _axis(node), float(node.attrs["epsilon"]), node.attrs["training"]
    _preload(xp)

    def run(dy, x, scale, mean, var):
        if not _usable(xp, dy, x, scale, mean, var) or x.ndim < 2:
            return generic(dy, x, scale, mean, var)
        x, dy = xp.ascontiguousarray(x), xp.ascontiguousarray(dy)
        a, c, b = _acb(x, axis)
        part, splits = _sums(xp, "isthmus_bn_grad_sums", (dy, x, mean), a, c, b)
        dbeta, dgamma, inv = _finish(xp, part, splits, c, a * b, var, eps)
        narrow = x.size < _NARROW
        nb = (np.int32 if narrow else np.int64)(b)
        tag = "32" if narrow else ""
        if training:
            k = _ew(xp, "isthmus_bn_dx_train" + tag, "T dy, T x, raw T mean, raw T inv, raw T scale, raw T dgamma, "
                    "raw T dbeta, float32 cnt, " + _nb(narrow) + ", int32 nC", "T dx",
                    _channel(narrow) + "const T xhat = (x - mean[c]) * inv[c]; "
                    "dx = (dy - dbeta[c] / cnt - xhat * dgamma[c] / cnt) * scale[c] * inv[c];")
            dx = k(dy, x, mean, inv, scale, dgamma, dbeta, np.float32(a * b), nb, np.int32(c))
            return dx, dgamma, dbeta, xp.zeros_like(mean), xp.zeros_like(var)
        k = _ew(xp, "isthmus_bn_dx_infer" + tag, "T dy, raw T inv, raw T scale, " + _nb(narrow) + ", int32 nC", "T dx",
                _channel(narrow) + "dx = dy * scale[c] * inv[c];")
        dx = k(dy, inv, scale, nb, np.int32(c))
        dmean = -(dbeta * scale * inv)
        dvar = -0.5 * dgamma * scale * inv * inv
        return dx, dgamma, dbeta, dmean.astype(xp.float32), dvar.astype(xp.float32)
    return run


KERNELS = {"BatchNorm": _batch_norm, "BatchNormGrad": _batch_norm_grad}
