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
// flat indices: 32-bit in the module for calls whose arrays all have under 2^30 elements (integer
// division, which every kernel does per item, costs several times more in 64 bits), else 64-bit
#ifdef NARROW_INDEX
typedef int idx_t;
#else
typedef long long idx_t;
#endif
// The taps (i, j) of a kh x kw window whose output (y, x) reads input pixel (iy, ix): the one
// inversion of the strided, dilated, padded window that col2im and the depthwise input gradient share.
#define FOR_OUTPUT_TAPS(BODY)                                              \
  for (int i = 0; i < kh; ++i) {                                           \
    const int ty = iy + pt - i * dh;                                       \
    if (ty < 0 || (sh > 1 && ty % sh)) continue;                           \
    const int y = ty / sh;                                                 \
    if (y >= oh) continue;                                                 \
    for (int j = 0; j < kw; ++j) {                                         \
      const int tx = ix + pl - j * dw;                                     \
      if (tx < 0 || (sw > 1 && tx % sw)) continue;                         \
      const int x = tx / sw;                                               \
      if (x >= ow) continue;                                               \
      BODY                                                                 \
    }                                                                      \
  }
extern "C" {

// cols[(ci*kh + i)*kw + j][(ni*oh + y)*ow + x] = x_in[ni][ci][y*sh - pt + i*dh][x*sw - pl + j*dw] (0 outside).
// Threads cover a 16x16 tile of output pixels (y, x); blocks walk the tiles (x), groups of images
// (y) and the rows (ci, i, j) (z): no integer division per item, which made the grid-stride form
// of this kernel run at a seventh (64-bit indices), then a quarter (32-bit) of memory speed on the H100.
__global__ void isthmus_im2col(const float* __restrict__ src, float* __restrict__ cols, GEOM) {
  const int tiles_x = (ow + 15) >> 4;
  const int y = (blockIdx.x / tiles_x) * 16 + threadIdx.y, x = (blockIdx.x % tiles_x) * 16 + threadIdx.x;
  if (y >= oh || x >= ow) return;
  const idx_t plane = (idx_t)oh * ow, cols_w = (idx_t)n * plane, image = (idx_t)c * h * w;
  const int rows = c * kh * kw;
  for (int row = blockIdx.z; row < rows; row += gridDim.z) {
    const int j = row % kw, i = (row / kw) % kh, ci = row / (kw * kh);
    const int iy = y * sh + i * dh - pt, ix = x * sw + j * dw - pl;
    float* out = cols + (idx_t)row * cols_w + (idx_t)y * ow + x;
    if (iy >= 0 && iy < h && ix >= 0 && ix < w) {
      const float* in = src + ((idx_t)ci * h + iy) * w + ix;
      for (idx_t ni = blockIdx.y; ni < n; ni += gridDim.y) out[ni * plane] = in[ni * image];
    } else {
      for (idx_t ni = blockIdx.y; ni < n; ni += gridDim.y) out[ni * plane] = 0.f;
    }
  }
}

// bias gradient of an NCHW tensor, first pass: part[ci][s] = the sum of dy[ni][ci][:, :] over the
// images ni = s, s + splits, ... (one block each; a second, small reduction sums the splits)
__global__ void isthmus_bias_grad_nchw(const float* __restrict__ dy, float* __restrict__ part,
                                       int n, int c, int hw, int splits) {
  __shared__ float red[256];
  const int ci = blockIdx.x, s = blockIdx.y;
  const int per = (n - s + splits - 1) / splits;  // this block's images
  const idx_t items = (idx_t)per * hw;
  float acc = 0.f;
  for (idx_t k = threadIdx.x; k < items; k += blockDim.x) {
    const idx_t m = k / hw;
    acc += dy[(((idx_t)s + m * splits) * c + ci) * hw + (k - m * hw)];
  }
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int st = blockDim.x / 2; st > 0; st >>= 1) {
    if (threadIdx.x < st) red[threadIdx.x] += red[threadIdx.x + st];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[ci * splits + s] = red[0];
}

// dx[ni][ci][iy][ix] = sum over taps reaching it of dcols (the layout im2col writes). A grid-stride
// loop: the 16x16-tile form of im2col was slower here (278 against 238 us for the CNN b512 conv2 on the H100)
__global__ void isthmus_col2im(const float* __restrict__ dcols, float* __restrict__ dx, GEOM) {
  const idx_t total = (idx_t)n * c * h * w;
  const idx_t cols_w = (idx_t)n * oh * ow;
  for (idx_t k = blockIdx.x * (idx_t)blockDim.x + threadIdx.x; k < total;
       k += (idx_t)gridDim.x * blockDim.x) {
    const int ix = k % w, iy = (k / w) % h, ci = (k / ((idx_t)w * h)) % c, ni = k / ((idx_t)w * h * c);
    float acc = 0.f;
    FOR_OUTPUT_TAPS(acc += dcols[((idx_t)(ci * kh + i) * kw + j) * cols_w + ((idx_t)ni * oh + y) * ow + x];)
    dx[k] = acc;
  }
}

// y[ni][oc][p] = act(y2[oc][ni * plane + p] + bias[oc]): the im2col product's [O, N*OH*OW] to
// NCHW with a fused convolution's bias and activation in the same pass (act: 0 none, 1 relu,
// 2 relu6, 3 tanh, 4 sigmoid, as gpu_kernels/elementwise.ACT_CODES). Blocks (x) over the plane,
// (y) over the (ni, oc) rows: no division per item.
__global__ void isthmus_nchw_bias_act(const float* __restrict__ y2, const float* __restrict__ bias,
                                      float* __restrict__ y, int n, int o, idx_t plane, int act) {
  for (idx_t row = blockIdx.y; row < (idx_t)n * o; row += gridDim.y) {
    const int oc = row % o;
    const idx_t ni = row / o;
    const float b = bias[oc];
    const float* src = y2 + (idx_t)oc * n * plane + ni * plane;
    float* dst = y + row * plane;
    for (idx_t p = blockIdx.x * (idx_t)blockDim.x + threadIdx.x; p < plane; p += (idx_t)gridDim.x * blockDim.x) {
      float v = src[p] + b;
      if (act == 1) v = fmaxf(v, 0.f);
      else if (act == 2) v = fminf(fmaxf(v, 0.f), 6.f);
      else if (act == 3) v = tanhf(v);
      else if (act == 4) v = 1.f / (1.f + expf(-v));
      dst[p] = v;
    }
  }
}

// depthwise: out[ni][ci][y][x] = sum_ij in[ni][ci][..][..] * wt[ci][i][j]
__global__ void isthmus_dw_forward(const float* __restrict__ src, const float* __restrict__ wt,
                                   float* __restrict__ out, GEOM) {
  const idx_t total = (idx_t)n * c * oh * ow;
  for (idx_t k = blockIdx.x * (idx_t)blockDim.x + threadIdx.x; k < total;
       k += (idx_t)gridDim.x * blockDim.x) {
    const int x = k % ow, y = (k / ow) % oh;
    const idx_t plane = k / ((idx_t)ow * oh);  // ni * c + ci
    const int ci = plane % c;
    const float* s = src + plane * h * w;
    const float* f = wt + (idx_t)ci * kh * kw;
    float acc = 0.f;
    for (int i = 0; i < kh; ++i) {
      const int iy = y * sh - pt + i * dh;
      if (iy < 0 || iy >= h) continue;
      for (int j = 0; j < kw; ++j) {
        const int ix = x * sw - pl + j * dw;
        if (ix < 0 || ix >= w) continue;
        acc += s[(idx_t)iy * w + ix] * f[i * kw + j];
      }
    }
    out[k] = acc;
  }
}

// depthwise input gradient: dx[ni][ci][iy][ix] = sum over taps of dy * wt
__global__ void isthmus_dw_input_grad(const float* __restrict__ dy, const float* __restrict__ wt,
                                      float* __restrict__ dx, GEOM) {
  const idx_t total = (idx_t)n * c * h * w;
  for (idx_t k = blockIdx.x * (idx_t)blockDim.x + threadIdx.x; k < total;
       k += (idx_t)gridDim.x * blockDim.x) {
    const int ix = k % w, iy = (k / w) % h;
    const idx_t plane = k / ((idx_t)w * h);
    const int ci = plane % c;
    const float* g = dy + plane * oh * ow;
    const float* f = wt + (idx_t)ci * kh * kw;
    float acc = 0.f;
    FOR_OUTPUT_TAPS(acc += g[(idx_t)y * ow + x] * f[i * kw + j];)
    dx[k] = acc;
  }
}

// depthwise filter gradient: one block of 256 threads per (ci, i, j), reducing over n, oh, ow
__global__ void isthmus_dw_filter_grad(const float* __restrict__ src, const float* __restrict__ dy,
                                       float* __restrict__ dwt, GEOM) {
  __shared__ float part[256];
  const int tap = blockIdx.x;  // (ci * kh + i) * kw + j
  const int j = tap % kw, i = (tap / kw) % kh, ci = tap / (kw * kh);
  const idx_t per = (idx_t)n * oh * ow;
  float acc = 0.f;
  for (idx_t k = threadIdx.x; k < per; k += blockDim.x) {
    const int x = k % ow, y = (k / ow) % oh, ni = k / ((idx_t)ow * oh);
    const int iy = y * sh - pt + i * dh, ix = x * sw - pl + j * dw;
    if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
    const idx_t plane = (idx_t)ni * c + ci;
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
  const idx_t total = (idx_t)n * c * oh * ow;
  for (idx_t k = blockIdx.x * (idx_t)blockDim.x + threadIdx.x; k < total;
       k += (idx_t)gridDim.x * blockDim.x) {
    const int x = k % ow, y = (k / ow) % oh;
    const float* s = src + (k / ((idx_t)ow * oh)) * h * w;
    float m = __int_as_float(0xff800000);  // -inf
    for (int i = 0; i < kh; ++i) {
      const int iy = y * sh - pt + i * dh;
      if (iy < 0 || iy >= h) continue;
      for (int j = 0; j < kw; ++j) {
        const int ix = x * sw - pl + j * dw;
        if (ix < 0 || ix >= w) continue;
        m = fmaxf(m, s[(idx_t)iy * w + ix]);
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
  const idx_t total = (idx_t)n * c * oh * ow;
  for (idx_t k = blockIdx.x * (idx_t)blockDim.x + threadIdx.x; k < total;
       k += (idx_t)gridDim.x * blockDim.x) {
    const int x = k % ow, y = (k / ow) % oh;
    const idx_t base = (k / ((idx_t)ow * oh)) * h * w;
    const float m = yv[k];
    float g = dy[k];
    if (through_relu && !(m > 0.f)) g = 0.f;
    if (g == 0.f) continue;
    idx_t at = -1;
    for (int i = 0; i < kh && at < 0; ++i) {
      const int iy = y * sh - pt + i * dh;
      if (iy < 0 || iy >= h) continue;
      for (int j = 0; j < kw; ++j) {
        const int ix = x * sw - pl + j * dw;
        if (ix < 0 || ix >= w) continue;
        if (src[base + (idx_t)iy * w + ix] == m) { at = base + (idx_t)iy * w + ix; break; }
      }
    }
    if (at >= 0) atomicAdd(dx + at, g);
  }
}

}  // extern "C"
"""

_MODULE: dict = {}
_FUNCTION: dict = {}
NAMES = ("isthmus_im2col", "isthmus_col2im", "isthmus_dw_forward", "isthmus_dw_input_grad",
         "isthmus_dw_filter_grad", "isthmus_max_pool", "isthmus_max_pool_grad", "isthmus_bias_grad_nchw",
         "isthmus_nchw_bias_act")
NARROW_LIMIT = 1 << 30  # elements: below it every flat index, and every grid stride added to one, fits an int


def kernel(cp, name: str, wide: bool = True):
    """The compiled kernel `name`, with 64-bit (`wide`) or 32-bit flat indices (each module is
    compiled once per process)."""
    fn = _FUNCTION.get((wide, name))
    if fn is None:
        mod = _MODULE.get(wide)
        if mod is None:
            mod = _MODULE[wide] = cp.RawModule(code=SOURCE, options=() if wide else ("-DNARROW_INDEX",))
        fn = _FUNCTION[(wide, name)] = mod.get_function(name)  # (get_function costs a few us a call)
    return fn


def preload(cp, *names: str) -> None:
    """Compile both modules now (when a plan is compiled), never inside a captured step."""
    for name in names:
        kernel(cp, name, True)
        kernel(cp, name, False)


def wide(args) -> bool:
    """Whether any array among a launch's arguments is too large for 32-bit indices."""
    return any(getattr(a, "size", 0) >= NARROW_LIMIT for a in args)


def geom_args(n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl):
    return tuple(np.int32(v) for v in (n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl))


def launch(cp, name: str, total: int, args) -> None:
    """A grid-stride launch over `total` items."""
    threads = 256
    blocks = max(1, min((total + threads - 1) // threads, 65535 * 4))
    kernel(cp, name, wide(args))((blocks,), (threads,), args)


def im2col(cp, x, cols, geom) -> None:
    """cols [C*kh*kw, N*OH*OW] from x (both contiguous; `geom` from geom_args): 16x16 output
    tiles, about 8 images a block."""
    n, oh, ow = int(geom[0]), int(geom[4]), int(geom[5])
    grid = (((oh + 15) // 16) * ((ow + 15) // 16), max(1, min(65535, (n + 7) // 8)), min(cols.shape[0], 65535))
    args = (x, cols) + tuple(geom)
    kernel(cp, "isthmus_im2col", wide(args))(grid, (16, 16), args)


def col2im(cp, dcols, dx, geom) -> None:
    """dx [N, C, H, W] from the columns' gradient dcols [C*kh*kw, N*OH*OW] (both contiguous)."""
    launch(cp, "isthmus_col2im", dx.size, (dcols, dx) + tuple(geom))


def nchw_bias_act(cp, y2, bias, n: int, o: int, plane: int, act: int):
    """[O, N*plane] -> contiguous [N, O, plane], plus bias [O] and activation code `act`."""
    y = cp.empty((n, o, plane), dtype=cp.float32)
    w = wide((y2, y))
    args = (y2, bias, y, np.int32(n), np.int32(o), (np.int64 if w else np.int32)(plane), np.int32(act))
    grid = (max(1, min((plane + 255) // 256, 4096)), max(1, min(n * o, 65535)))
    kernel(cp, "isthmus_nchw_bias_act", w)(grid, (256,), args)
    return y


def bias_grad_nchw(cp, dy):
    """The per-channel sums of a contiguous float32 NCHW (or N, C, any) tensor: about 512 blocks
    of partial sums, then one small reduction (deterministic: no atomics)."""
    n, c = dy.shape[0], dy.shape[1]
    hw = dy.size // max(n * c, 1)
    splits = max(1, min(n, -(-512 // c)))
    part = cp.empty((c, splits), dtype=cp.float32)
    args = (dy, part, np.int32(n), np.int32(c), np.int32(hw), np.int32(splits))
    kernel(cp, "isthmus_bias_grad_nchw", wide(args))((c, splits), (256,), args)
    return part.sum(axis=1)


def usable(xp, *arrays) -> bool:
    """cupy float32 arrays: the RawKernels apply."""
    return hasattr(xp, "RawModule") and all(a.dtype == np.float32 for a in arrays)
