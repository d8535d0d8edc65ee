"""A float32 GEMM of isthmus's own as a cupy RawKernel, for captured steps.

CuPy 14 refuses every cuBLAS call during CUDA-graph stream capture, so a step whose products go
through cuBLAS can only be captured between them. This tiled kernel (shared-memory tiles, a 4x4
or 2x2 block of outputs per thread, any strides, bias and activation in the epilogue) is what a
captured step's 2-D float32 products use instead; eager steps keep cuBLAS (xp.matmul), which is
faster on large shapes. On the CI stand-in GPU the same factory falls back to xp.matmul."""
from __future__ import annotations

import numpy as np

from ..ops.fused import _kernel_fused_matmul

from ..ops.linalg import _kernel_matmul

_SRC = r"""
#define KT 16
extern "C" __global__ void NAME(const float* __restrict__ A, const float* __restrict__ B,
                                float* __restrict__ C, const float* __restrict__ bias,
                                int M, int N, int K, long long sam, long long sak,
                                long long sbk, long long sbn, int act, int has_bias) {
  __shared__ float As[KT][TILE + 1];
  __shared__ float Bs[KT][TILE + 1];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
  const int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
  float acc[R][R];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < R; ++j) acc[i][j] = 0.f;
  for (int k0 = 0; k0 < K; k0 += KT) {
#pragma unroll
    for (int l = 0; l < R; ++l) {
      const int idx = tid + l * 256;
      const int r = idx / KT, ka = idx % KT;
      const int gr = row0 + r, gka = k0 + ka;
      As[ka][r] = (gr < M && gka < K) ? A[(long long)gr * sam + (long long)gka * sak] : 0.f;
      const int kb = idx / TILE, c = idx % TILE;
      const int gkb = k0 + kb, gc = col0 + c;
      Bs[kb][c] = (gkb < K && gc < N) ? B[(long long)gkb * sbk + (long long)gc * sbn] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      float a[R], b[R];
#pragma unroll
      for (int i = 0; i < R; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < R; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < R; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int r = row0 + ty + 16 * i, c = col0 + tx + 16 * j;
      if (r < M && c < N) {
        float v = acc[i][j] + (has_bias ? bias[c] : 0.f);
        if (act == 1) v = fmaxf(v, 0.f);
        else if (act == 2) v = fminf(fmaxf(v, 0.f), 6.f);
        else if (act == 3) v = tanhf(v);
        else if (act == 4) v = 1.f / (1.f + expf(-v));
        C[(long long)r * N + c] = v;
      }
    }
  }
}
"""
_ACT = {"none": 0, "relu": 1, "relu6": 2, "tanh": 3, "sigmoid": 4}
_KERNELS: dict = {}


def _kernel(cp, tile: int):
    k = _KERNELS.get(tile)
    if k is None:
        src = f"#define TILE {tile}\n#define R {tile // 16}\n" + _SRC.replace("NAME", f"isthmus_sgemm{tile}")
        k = _KERNELS[tile] = cp.RawKernel(src, f"isthmus_sgemm{tile}")
        k.compile()  # now, not during a capture
    return k


def gemm(cp, a, b, bias=None, activation: str = "none", out=None):
    """activation(a @ b + bias) for 2-D float32 cupy arrays of any strides."""
    m, k = a.shape
    n = b.shape[1]
    if out is None:
        out = cp.empty((m, n), cp.float32)
    has_bias = bias is not None
    if bias is None:
        bias = out  # never read (has_bias = 0): no zeros array made, perhaps inside a capture
    tile = 64 if ((m + 63) // 64) * ((n + 63) // 64) >= 132 else 32
    isz = 4
    grid = ((n + tile - 1) // tile, (m + tile - 1) // tile)
    _kernel(cp, tile)(grid, (16, 16), (a, b, out, bias, np.int32(m), np.int32(n), np.int32(k),
                                       np.int64(a.strides[0] // isz), np.int64(a.strides[1] // isz),
                                       np.int64(b.strides[0] // isz), np.int64(b.strides[1] // isz),
                                       np.int32(_ACT[activation]), np.int32(1 if has_bias else 0)))
    return out


# products up to this many multiply-adds run in a captured step's graph (this kernel); larger ones
# run eagerly through cuBLAS between graphs (several times faster there than this kernel)
CAPTURE_MAX_MACS = 1 << 26


def _capturable_product(node, ctx) -> bool:
    a, b = node.inputs[0], node.inputs[1]
    if not (getattr(ctx, "capture", False) and hasattr(ctx.xp, "RawKernel") and len(a.shape) == 2
            and len(b.shape) == 2 and a.dtype == np.float32 and b.dtype == np.float32):
        return False
    m = a.shape[1] if node.attrs["transpose_a"] else a.shape[0]
    k = a.shape[0] if node.attrs["transpose_a"] else a.shape[1]
    n = b.shape[0] if node.attrs["transpose_b"] else b.shape[1]
    return None not in (m, k, n) and m * k * n <= CAPTURE_MAX_MACS


def eager_product(node, ctx):
    """A 2-D product through cupy.dot (cuBLAS, lighter to call than cupy.matmul; transposed
    operands are passed as views); anything else through the generic kernel."""
    a, b = node.inputs[0], node.inputs[1]
    if not (hasattr(ctx.xp, "RawKernel") and len(a.shape) == 2 and len(b.shape) == 2):
        return _kernel_matmul(node, ctx)
    dot, ta, tb = ctx.xp.dot, node.attrs["transpose_a"], node.attrs["transpose_b"]
    if ta and tb:
        return lambda a, b: dot(a.T, b.T)
    if ta:
        return lambda a, b: dot(a.T, b)
    if tb:
        return lambda a, b: dot(a, b.T)
    return dot


def _matmul(node, ctx):
    if not _capturable_product(node, ctx):
        return eager_product(node, ctx)
    cp, ta, tb = ctx.xp, node.attrs["transpose_a"], node.attrs["transpose_b"]
    _kernel(cp, 32), _kernel(cp, 64)
    return lambda a, b: gemm(cp, a.T if ta else a, b.T if tb else b)


def _fused_matmul(node, ctx):
    if not _capturable_product(node, ctx) or len(node.inputs[2].shape) != 1:
        return _kernel_fused_matmul(node, ctx)
    cp, ta, tb, act = ctx.xp, node.attrs["transpose_a"], node.attrs["transpose_b"], node.attrs["activation"]
    _kernel(cp, 32), _kernel(cp, 64)
    return lambda a, b, bias: gemm(cp, a.T if ta else a, b.T if tb else b, bias, act)


KERNELS = {"MatMul": _matmul}  # FusedMatMul: elementwise.py (eager) calls _fused_matmul when capturing
