"""CUDA source of the convolution-family RawKernels (float32): im2col and col2im, depthwise
forward and both gradients, max pooling and its gradient. One launch each where the array-module
versions take one launch per kernel tap. Used only when the array module is cupy; the generic
versions (conv.py, the core pool kernels) serve the CI stand-in and are the tests' reference.

Geometry arguments, everywhere: n c h w (input), oh ow (output), kh kw sh sw dh dw (window),
pt pl (top and left padding).
"""
from __future__ import annotations

import numpy as np

_GEOM = "int n, int c, int h, int w, int oh, int ow, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl"

SOURCE = r"""
#define GEOM """ + _GEOM + r"""
// The taps (i, j) of a kh x kw window whose output (y, x) reads input pixel (iy, ix): the one
// inversion of the strided, dilated, padded window that col2im and the depthwise input gradient share.
#define FOR_OUTPUT_TAPS(BODY)                                              \
  for (int i = 0; i < kh; ++i) {                                           \
    const int ty = iy + pt - i * dh;                                       \
    if (ty < 0 || ty % sh) continue;                                       \
    const int y = ty / sh;                                                 \
    if (y >= oh) continue;                                                 \
    for (int j = 0; j < kw; ++j) {                                         \
      const int tx = ix + pl - j * dw;                                     \
      if (tx < 0 || tx % sw) continue;                                     \
      const int x = tx / sw;                                               \
      if (x >= ow) continue;                                               \
      BODY                                                                 \
    }                                                                      \
  }
extern "C" {

// cols[(ci*kh + i)*kw + j][(ni*oh + y)*ow + x] = x_in[ni][ci][y*sh - pt + i*dh][x*sw - pl + j*dw] (0 outside)
__global__ void isthmus_im2col(const float* __restrict__ src, float* __restrict__ cols, GEOM) {
  const long long cols_w = (long long)n * oh * ow;
  const long long total = (long long)c * kh * kw * cols_w;
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total;
       k += (long long)gridDim.x * blockDim.x) {
    const long long col = k % cols_w, row = k / cols_w;
    const int x = col % ow, y = (col / ow) % oh, ni = col / ((long long)ow * oh);
    const int j = row % kw, i = (row / kw) % kh, ci = row / ((long long)kw * kh);
    const int iy = y * sh - pt + i * dh, ix = x * sw - pl + j * dw;
    cols[k] = (iy >= 0 && iy < h && ix >= 0 && ix < w)
        ? src[(((long long)ni * c + ci) * h + iy) * w + ix] : 0.f;
  }
}

// dx[ni][ci][iy][ix] = sum over taps reaching it of dcols (the layout im2col writes)
__global__ void isthmus_col2im(const float* __restrict__ dcols, float* __restrict__ dx, GEOM) {
  const long long total = (long long)n * c * h * w;
  const long long cols_w = (long long)n * oh * ow;
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total;
       k += (long long)gridDim.x * blockDim.x) {
    const int ix = k % w, iy = (k / w) % h, ci = (k / ((long long)w * h)) % c, ni = k / ((long long)w * h * c);
    float acc = 0.f;
    FOR_OUTPUT_TAPS(acc += dcols[((long long)(ci * kh + i) * kw + j) * cols_w + ((long long)ni * oh + y) * ow + x];)
    dx[k] = acc;
  }
}

// depthwise: out[ni][ci][y][x] = sum_ij in[ni][ci][..][..] * wt[ci][i][j]
__global__ void isthmus_dw_forward(const float* __restrict__ src, const float* __restrict__ wt,
                                   float* __restrict__ out, GEOM) {
  const long long total = (long long)n * c * oh * ow;
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total;
       k += (long long)gridDim.x * blockDim.x) {
    const int x = k % ow, y = (k / ow) % oh;
    const long long plane = k / ((long long)ow * oh);  // ni * c + ci
    const int ci = plane % c;
    const float* s = src + plane * h * w;
    const float* f = wt + (long long)ci * kh * kw;
    float acc = 0.f;
    for (int i = 0; i < kh; ++i) {
      const int iy = y * sh - pt + i * dh;
      if (iy < 0 || iy >= h) continue;
      for (int j = 0; j < kw; ++j) {
        const int ix = x * sw - pl + j * dw;
        if (ix < 0 || ix >= w) continue;
        acc += s[(long long)iy * w + ix] * f[i * kw + j];
      }
    }
    out[k] = acc;
  }
}

// depthwise input gradient: dx[ni][ci][iy][ix] = sum over taps of dy * wt
__global__ void isthmus_dw_input_grad(const float* __restrict__ dy, const float* __restrict__ wt,
                                      float* __restrict__ dx, GEOM) {
  const long long total = (long long)n * c * h * w;
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total;
       k += (long long)gridDim.x * blockDim.x) {
    const int ix = k % w, iy = (k / w) % h;
    const long long plane = k / ((long long)w * h);
    const int ci = plane % c;
    const float* g = dy + plane * oh * ow;
    const float* f = wt + (long long)ci * kh * kw;
    float acc = 0.f;
    FOR_OUTPUT_TAPS(acc += g[(long long)y * ow + x] * f[i * kw + j];)
    dx[k] = acc;
  }
}

// depthwise filter gradient: one block of 256 threads per (ci, i, j), reducing over n, oh, ow
__global__ void isthmus_dw_filter_grad(const float* __restrict__ src, const float* __restrict__ dy,
                                       float* __restrict__ dwt, GEOM) {
  __shared__ float part[256];
  const int tap = blockIdx.x;  // (ci * kh + i) * kw + j
  const int j = tap % kw, i = (tap / kw) % kh, ci = tap / (kw * kh);
  const long long per = (long long)n * oh * ow;
  float acc = 0.f;
  for (long long k = threadIdx.x; k < per; k += blockDim.x) {
    const int x = k % ow, y = (k / ow) % oh, ni = k / ((long long)ow * oh);
    const int iy = y * sh - pt + i * dh, ix = x * sw - pl + j * dw;
    if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
    const long long plane = (long long)ni * c + ci;
    acc += dy[(plane * oh + y) * ow + x] * src[(plane * h + iy) * w + ix];
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) dwt[tap] = part[0];
}

// max pooling: the maximum over the window's taps inside the input (padding never wins)
__global__ void isthmus_max_pool(const float* __restrict__ src, float* __restrict__ out, GEOM) {
  const long long total = (long long)n * c * oh * ow;
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total;
       k += (long long)gridDim.x * blockDim.x) {
    const int x = k % ow, y = (k / ow) % oh;
    const float* s = src + (k / ((long long)ow * oh)) * h * w;
    float m = __int_as_float(0xff800000);  // -inf
    for (int i = 0; i < kh; ++i) {
      const int iy = y * sh - pt + i * dh;
      if (iy < 0 || iy >= h) continue;
      for (int j = 0; j < kw; ++j) {
        const int ix = x * sw - pl + j * dw;
        if (ix < 0 || ix >= w) continue;
        m = fmaxf(m, s[(long long)iy * w + ix]);
      }
    }
    out[k] = m;
  }
}

// max pooling gradient: each window sends dy (times y > 0 after a relu, when asked) to the first
// tap in row-major order that holds its maximum, as the CPU kernel does; dx starts at zero
__global__ void isthmus_max_pool_grad(const float* __restrict__ src, const float* __restrict__ yv,
                                      const float* __restrict__ dy, float* __restrict__ dx,
                                      int through_relu, GEOM) {
  const long long total = (long long)n * c * oh * ow;
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total;
       k += (long long)gridDim.x * blockDim.x) {
    const int x = k % ow, y = (k / ow) % oh;
    const long long base = (k / ((long long)ow * oh)) * h * w;
    const float m = yv[k];
    float g = dy[k];
    if (through_relu && !(m > 0.f)) g = 0.f;
    if (g == 0.f) continue;
    long long at = -1;
    for (int i = 0; i < kh && at < 0; ++i) {
      const int iy = y * sh - pt + i * dh;
      if (iy < 0 || iy >= h) continue;
      for (int j = 0; j < kw; ++j) {
        const int ix = x * sw - pl + j * dw;
        if (ix < 0 || ix >= w) continue;
        if (src[base + (long long)iy * w + ix] == m) { at = base + (long long)iy * w + ix; break; }
      }
    }
    if (at >= 0) atomicAdd(dx + at, g);
  }
}

}  // extern "C"
"""

_MODULE: dict = {}
NAMES = ("isthmus_im2col", "isthmus_col2im", "isthmus_dw_forward", "isthmus_dw_input_grad",
         "isthmus_dw_filter_grad", "isthmus_max_pool", "isthmus_max_pool_grad")


def kernel(cp, name: str):
    """The compiled kernel `name` (the module is compiled once per process)."""
    mod = _MODULE.get("m")
    if mod is None:
        mod = _MODULE["m"] = cp.RawModule(code=SOURCE, name_expressions=None)
    return mod.get_function(name)


def geom_args(n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl):
    return tuple(np.int32(v) for v in (n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl))


def launch(cp, name: str, total: int, args) -> None:
    """A grid-stride launch over `total` items."""
    threads = 256
    blocks = max(1, min((total + threads - 1) // threads, 65535 * 4))
    kernel(cp, name)((blocks,), (threads,), args)


def usable(xp, *arrays) -> bool:
    """cupy float32 arrays: the RawKernels apply."""
    return hasattr(xp, "RawModule") and all(a.dtype == np.float32 for a in arrays)
