"""Batch norm on a CUDA GPU (float32): per-channel statistics by one block per channel (float64
accumulation, as the CPU's compiled kernels), then one elementwise launch; the gradient likewise
(one reduction launch for dscale and doffset, one elementwise launch for dx). The generic
array-module kernels take a dozen or more launches per layer. Other dtypes and the CI stand-in
keep the generic kernels."""
from __future__ import annotations

import numpy as np

from . import generic_factory

_SRC = r"""
extern "C" {
// x viewed as [A, C, B]; one block of 256 threads per channel: mean and population variance
__global__ void isthmus_bn_stats(const float* __restrict__ x, float* __restrict__ mean, float* __restrict__ var,
                                 long long A, int C, long long B) {
  __shared__ double s1[256], s2[256];
  const int c = blockIdx.x;
  const long long n = A * B;
  double a1 = 0.0, a2 = 0.0;
  for (long long k = threadIdx.x; k < n; k += blockDim.x) {
    const long long a = k / B, b = k - a * B;
    const double v = x[(a * C + c) * B + b];
    a1 += v; a2 += v * v;
  }
  s1[threadIdx.x] = a1; s2[threadIdx.x] = a2;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) { s1[threadIdx.x] += s1[threadIdx.x + s]; s2[threadIdx.x] += s2[threadIdx.x + s]; }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double m = s1[0] / n;
    double v = s2[0] / n - m * m;
    mean[c] = (float)m; var[c] = (float)(v > 0.0 ? v : 0.0);
  }
}

// per channel: dbeta = sum dy, dgamma = sum dy * (x - mean) * inv
__global__ void isthmus_bn_grad_sums(const float* __restrict__ dy, const float* __restrict__ x,
                                     const float* __restrict__ mean, const float* __restrict__ inv,
                                     float* __restrict__ dgamma, float* __restrict__ dbeta,
                                     long long A, int C, long long B) {
  __shared__ double s1[256], s2[256];
  const int c = blockIdx.x;
  const long long n = A * B;
  const double m = mean[c], iv = inv[c];
  double a1 = 0.0, a2 = 0.0;
  for (long long k = threadIdx.x; k < n; k += blockDim.x) {
    const long long a = k / B, b = k - a * B;
    const long long at = (a * C + c) * B + b;
    const double g = dy[at];
    a1 += g; a2 += g * (x[at] - m) * iv;
  }
  s1[threadIdx.x] = a1; s2[threadIdx.x] = a2;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) { s1[threadIdx.x] += s1[threadIdx.x + s]; s2[threadIdx.x] += s2[threadIdx.x + s]; }
    __syncthreads();
  }
  if (threadIdx.x == 0) { dbeta[c] = (float)s1[0]; dgamma[c] = (float)s2[0]; }
}
}
"""
_MOD: dict = {}


def _fn(cp, name):
    mod = _MOD.get("m")
    if mod is None:
        mod = _MOD["m"] = cp.RawModule(code=_SRC)
    return mod.get_function(name)


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
    _fn(xp, "isthmus_bn_stats")  # compiled now, not inside a captured step

    def run(x, scale, offset, mean, var):
        if not _usable(xp, x, scale, offset, mean, var) or x.ndim < 2:
            return generic(x, scale, offset, mean, var)
        x = xp.ascontiguousarray(x)
        a, c, b = _acb(x, axis)
        if training:
            mean, var = xp.empty(c, xp.float32), xp.empty(c, xp.float32)
            _fn(xp, "isthmus_bn_stats")((c,), (256,), (x, mean, var, np.int64(a), np.int32(c), np.int64(b)))
        k = _ew(xp, "isthmus_bn_apply", "T x, raw T mean, raw T var, raw T scale, raw T offset, float32 eps, "
                "int64 nB, int32 nC", "T y",
                "const int c = (int)((i / nB) % nC); "
                "const T s = scale[c] * rsqrtf(var[c] + eps); y = (x - mean[c]) * s + offset[c];")
        y = k(x, mean, var, scale, offset, np.float32(eps), np.int64(b), np.int32(c))
        return y, mean, var
    return run


def _batch_norm_grad(node, ctx):
    generic = generic_factory("BatchNormGrad")(node, ctx)
    xp = ctx.xp
    if not hasattr(xp, "RawModule"):
        return generic
    axis, eps, training = _axis(node), float(node.attrs["epsilon"]), node.attrs["training"]

    def run(dy, x, scale, mean, var):
        if not _usable(xp, dy, x, scale, mean, var) or x.ndim < 2:
            return generic(dy, x, scale, mean, var)
        x, dy = xp.ascontiguousarray(x), xp.ascontiguousarray(dy)
        a, c, b = _acb(x, axis)
        inv = 1.0 / xp.sqrt(var + xp.float32(eps))
        dgamma, dbeta = xp.empty(c, xp.float32), xp.empty(c, xp.float32)
        _fn(xp, "isthmus_bn_grad_sums")((c,), (256,), (dy, x, mean, inv, dgamma, dbeta,
                                                       np.int64(a), np.int32(c), np.int64(b)))
        if training:
            k = _ew(xp, "isthmus_bn_dx_train", "T dy, T x, raw T mean, raw T inv, raw T scale, raw T dgamma, "
                    "raw T dbeta, float32 cnt, int64 nB, int32 nC", "T dx",
                    "const int c = (int)((i / nB) % nC); const T xhat = (x - mean[c]) * inv[c]; "
                    "dx = (dy - dbeta[c] / cnt - xhat * dgamma[c] / cnt) * scale[c] * inv[c];")
            dx = k(dy, x, mean, inv, scale, dgamma, dbeta, np.float32(a * b), np.int64(b), np.int32(c))
            return dx, dgamma, dbeta, xp.zeros_like(mean), xp.zeros_like(var)
        k = _ew(xp, "isthmus_bn_dx_infer", "T dy, raw T inv, raw T scale, int64 nB, int32 nC", "T dx",
                "const int c = (int)((i / nB) % nC); dx = dy * scale[c] * inv[c];")
        dx = k(dy, inv, scale, np.int64(b), np.int32(c))
        dmean = -(dbeta * scale * inv)
        dvar = -0.5 * dgamma * scale * inv * inv
        return dx, dgamma, dbeta, dmean.astype(xp.float32), dvar.astype(xp.float32)
    return run


KERNELS = {"BatchNorm": _batch_norm, "BatchNormGrad": _batch_norm_grad}
