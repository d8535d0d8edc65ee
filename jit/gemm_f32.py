"""fp32 GEMM with the bias and a clamp in its epilogue, for the edge's 1x1 convolutions at batch 1.

A 1x1 convolution is Y [O, P] = W [O, K] @ X [K, P] + bias, then relu/relu6. numpy runs the product
through BLAS, which packs both operands on every call (on a MobileNet's 6x6 planes the 576 x 96
weights cost as much to pack as to multiply), then the bias and the clamp take another pass over
Y (about 45 us of MobileNetV2-96's 900 us of 1x1 convolutions, one thread). Here the weights are
packed once, at prepare, as [O/4, K, 4]; X is read in place, 16 columns at a time; a 6 x 16 tile
of accumulators (twelve <8 x float> vectors; two such tiles cover three packed blocks, the last
O mod 12 rows a 4 x 16 tile) starts at the bias, takes one FMA per weight and column vector along
K, and is clamped and stored. The tile is LLVM IR (a numba intrinsic, as in jit/gemm_int8.py),
since numba leaves such a register-blocked loop unvectorized. The im2col gather lives in
jit/im2col.py (re-exported here); jit/conv_direct.py turns the tile around for convolutions.

Columns past the last whole 16 go through a zero-padded copy of their [K, P mod 16] panel and a
[O, 16] tile buffer (scratch). O must be a multiple of 4 (MobileNets' widths are multiples of 8);
callers keep BLAS otherwise.
"""
from __future__ import annotations

import numba as nb  # imported only when a kernel is first prepared
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .gemm_int8 import supported
from .im2col import im2col, im2col_ld  # noqa: F401  (callers import them from here)

MR, NR = 4, 16  # tile: output rows, columns (two vectors of eight floats)
# K chunk: a [KC, 16] panel of x (at most 10 KB) stays in L1 while the row tiles pass. K goes in
# equal chunks of at most 160 (chunk_len): a fixed 128 left short tails (K 144 = 128 + 16, 147 = 128 +
# 19), each paying the tiles' start and end; equal chunks ran 5-11% faster on K 144, 147 and 288
# (one thread, hot caches), even elsewhere. Sums cross chunks through y exactly (float32), so the
# chunking never changes the bytes.
KC = 160


def _splat(builder, v, vt):
    i32 = ir.IntType(32)
    e = builder.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(i32, 0))
    return builder.shuffle_vector(e, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(i32, vt.count), None))


def close_k_loop(builder, entry, loop, done, i, kn, accs, new, init):
    """End a tile's K loop: the accumulators' back edges (new), i + 1 while below kn, then at `done`
    the final accumulators (phis of init from entry and new from the loop), in accs' order."""
    i2 = builder.add(i, ir.Constant(i.type, 1))
    for a, v in zip(accs, new):
        a.add_incoming(v, loop)
    i.add_incoming(i2, loop)
    builder.cbranch(builder.icmp_signed("<", i2, kn), loop, done)
    builder.position_at_end(done)
    results = []
    for n, v in enumerate(new):  # every phi first
        res = builder.phi(v.type)
        res.add_incoming(init[n], entry)
        res.add_incoming(v, loop)
        results.append(res)
    return results


# The 6 x 16 tiles: 12 accumulators (and two x vectors and a broadcast: 15 of the 16 ymm registers)
# against the 4 x 16 tile's 8, which only just covered the FMA latency (4 cycles x 2 ports); two of
# them cover three packed blocks of 4 rows, the first from lane 0 of block ob, the second from lane 2.
# They pay from K 96 on: batches of images, one thread, weights packed, x in place: K 128-144 0.94-0.96x
# the 4 x 16 tile's time, K 96 even, K 16-64 1.04-1.14x (MobileNetV2's expansions; short K spends
# its time in the tiles' starts and ends, and there the 6-row tile's two weight blocks cost more).
SIX_MIN_K = 96
# pixels up to which packed_pays takes any k (6x6 planes; see there)
DEEP_MAX_P = 36
# Small weights (O K <= 4096, one K chunk) of 96+ rows over 1024+ columns: row groups outer, panels
# inner (_rows_first). Panel by panel, each panel's stores touch one line in each of O rows:
# MobileNetV2's 16 -> 96 on 48x48 ran at 0.83x hot, 0.56x cache-cold (8 MB flushed) rows first,
# 0.55-0.69x in the whole model at batch 32 (image by image). Where it did not pay in the model: the
# 3-channel 3x3 stems (32 and 64 rows, K 27, x the im2col columns re-read per row group: 1.07-1.11x
# at batch 32), 24x24 planes (24 -> 144 at batch 32 1.0-1.1x; alone 1.02x hot, 0.83x cold), larger
# weights (64 -> 384 on 24x24, O K 24576: 1.17x hot, alone). One thread, load ~2-3. 32 -> 16 on 48x48
# alone: 0.87x hot, 0.73x cold, not seen in the model, left panel by panel.
ROWS_FIRST_MAX_OK, ROWS_FIRST_MIN_O, ROWS_FIRST_MIN_P = 4096, 96, 1024
SIX_A = ((0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1))
SIX_B = ((0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3))


def _make_tile(nv: int, mb: int = 1, rowmap=None):
    """The tile intrinsic over nv vectors of 8 columns (2: the main loop; 1: a short last panel) and
    mb blocks of 4 rows (2 for a short panel: eight independent accumulators keep the FMAs busy), or
    the rows of rowmap ((block after ob, lane) per row)."""
    @intrinsic
    def tile(typingctx, wp, x, ldx, px, y, ldy, py, ob, bias, k, k0, kn, first, lo, hi):
        sig = types.void(wp, x, ldx, px, y, ldy, py, ob, bias, k, k0, kn, first, lo, hi)
        return sig, lambda context, builder, signature, args: _tile_ir(context, builder, signature, args, nv, mb,
                                                                       rowmap=rowmap)
    return tile


def _make_tile_add(nv: int, mb: int = 1, rowmap=None):
    """_make_tile's tile with a residual addend r (flat, y's layout): the first K chunk starts at
    bias + r instead of the bias, so the addend costs no pass of its own."""
    @intrinsic
    def tile(typingctx, wp, x, ldx, px, y, ldy, py, ob, bias, k, k0, kn, first, lo, hi, r):
        sig = types.void(wp, x, ldx, px, y, ldy, py, ob, bias, k, k0, kn, first, lo, hi, r)
        return sig, lambda context, builder, signature, args: _tile_ir(context, builder, signature, args, nv, mb,
                                                                       residual=True, rowmap=rowmap)
    return tile


def _tile_ir(context, builder, signature, args, nv, mb, offsets=False, residual=False, rowmap=None):
    """y[(ob 4 + r) ldy + py + j] = clamp(s + sum over k0 <= i < k0 + kn of wp[ob + r // 4, i, r % 4]
    x[i ldx + px + j], lo, hi) for r < 4 mb, j < 8 nv, s = bias[ob 4 + r] when first is nonzero, else
    that y (a K chunk after the first): wp the packed weights [O/4, k, 4], x and y flat float32. A NaN
    passes the clamp. offsets: ldx is an int64 array and row i of x starts at ldx[i] (an implicit
    im2col: jit.conv_wide). residual: args[15] is r (flat, y's layout), and s = bias + r there."""
    f32, i64 = ir.FloatType(), ir.IntType(64)
    v8 = ir.VectorType(f32, 8)
    arrs = [context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 1, 4, 8)]
    wptr, xptr, yptr, bptr = (builder.bitcast(a.data, f32.as_pointer()) for a in arrs)
    ldx, px, ldy, py, ob, k, k0, kn, first, lo, hi = (args[i] for i in (2, 3, 5, 6, 7, 9, 10, 11, 12, 13, 14))
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8, v8, v8]), "llvm.fma.v8f32")
    rowmap = rowmap or [(r // MR, r % MR) for r in range(MR * mb)]
    nr, mb = len(rowmap), rowmap[-1][0] + 1
    outrow = [MR * b + lane for b, lane in rowmap]  # the tile's rows, from ob's first
    wbases = [builder.mul(builder.add(builder.mul(builder.add(ob, ir.Constant(i64, b)), k), k0), ir.Constant(i64, MR))
              for b in range(mb)]
    rows = [builder.add(builder.mul(builder.add(builder.mul(ob, ir.Constant(i64, MR)), ir.Constant(i64, r)), ldy), py)
            for r in outrow]
    from_bias = builder.icmp_signed("!=", first, ir.Constant(first.type, 0))
    if residual:
        rarr = context.make_array(signature.args[15])(context, builder, args[15])
        rptr = builder.bitcast(rarr.data, f32.as_pointer())
    init = []
    for r in range(nr):
        b = _splat(builder, builder.load(builder.gep(bptr, [builder.add(builder.mul(ob, ir.Constant(i64, MR)),
                                                                         ir.Constant(i64, outrow[r]))])), v8)
        for j in range(nv):
            off = builder.add(rows[r], ir.Constant(i64, 8 * j))
            ptr = builder.bitcast(builder.gep(yptr, [off]), v8.as_pointer())
            start = b
            if residual:
                start = builder.fadd(b, builder.load(builder.bitcast(builder.gep(rptr, [off]), v8.as_pointer()), align=4))
            init.append(builder.select(from_bias, start, builder.load(ptr, align=4)))
    entry = builder.basic_block
    loop, done = builder.append_basic_block("tile.loop"), builder.append_basic_block("tile.done")
    builder.cbranch(builder.icmp_signed(">", kn, ir.Constant(i64, 0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    accs = [builder.phi(v8) for _ in range(nv * nr)]
    for n, a in enumerate(accs):
        a.add_incoming(init[n], entry)
    if offsets:
        optr = context.make_array(signature.args[2])(context, builder, ldx).data
        xo = builder.add(builder.load(builder.gep(optr, [builder.add(k0, i)])), px)
    else:
        xo = builder.add(builder.mul(builder.add(k0, i), ldx), px)
    xs = [builder.load(builder.bitcast(builder.gep(xptr, [builder.add(xo, ir.Constant(i64, 8 * j))]),
                                       v8.as_pointer()), align=4) for j in range(nv)]
    wos = [builder.add(wb, builder.mul(i, ir.Constant(i64, MR))) for wb in wbases]
    new = []
    for r, (blk, lane) in enumerate(rowmap):
        wv = _splat(builder, builder.load(builder.gep(wptr, [builder.add(wos[blk], ir.Constant(i64, lane))])), v8)
        new += [builder.call(fma, [wv, xs[j], accs[nv * r + j]]) for j in range(nv)]
    results = close_k_loop(builder, entry, loop, done, i, kn, accs, new, init)
    lov, hiv = _splat(builder, lo, v8), _splat(builder, hi, v8)
    for r in range(nr):
        row = rows[r]
        for j in range(nv):
            v = results[nv * r + j]
            v = builder.select(builder.fcmp_ordered("<", v, lov), lov, v)
            v = builder.select(builder.fcmp_ordered(">", v, hiv), hiv, v)
            ptr = builder.gep(yptr, [builder.add(row, ir.Constant(i64, 8 * j))])
            builder.store(v, builder.bitcast(ptr, v8.as_pointer()), align=4)
    return context.get_dummy_value()


_tile, _tile8, _tile8x8 = _make_tile(2), _make_tile(1), _make_tile(1, 2)
_tile6a, _tile6b = _make_tile(2, rowmap=SIX_A), _make_tile(2, rowmap=SIX_B)
_tile_add, _tile8_add, _tile8x8_add = _make_tile_add(2), _make_tile_add(1), _make_tile_add(1, 2)
_tile6a_add, _tile6b_add = _make_tile_add(2, rowmap=SIX_A), _make_tile_add(2, rowmap=SIX_B)


@nb.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def chunk_len(k):
    """The length of K's equal chunks of at most KC."""
    return -(-k // -(-k // KC)) if k > 0 else 1


@nb.njit(nogil=True, cache=True, boundscheck=False)
def _panels(wp, bias, xf, ldx, px, yf, ldy, py, o, k, lo, hi, narrow):
    """Every row tile over one 16-column panel (8 when narrow), K in chunks (chunk_len: the chunk of x
    stays in L1 while the row tiles pass; chunks after the first start from y, the last clamps)."""
    inf = np.float32(np.inf)
    kc = chunk_len(k)
    for k0 in range(0, k, kc):
        kn = min(kc, k - k0)
        last = k0 + kn >= k
        clo, chi = (lo, hi) if last else (-inf, inf)
        if narrow:  # 8 rows at a time where two row blocks remain
            nb4 = o // MR
            for ob in range(0, nb4 - 1, 2):
                _tile8x8(wp, xf, ldx, px, yf, ldy, py, ob, bias, k, k0, kn, k0 == 0, clo, chi)
            if nb4 % 2:
                _tile8(wp, xf, ldx, px, yf, ldy, py, nb4 - 1, bias, k, k0, kn, k0 == 0, clo, chi)
        else:  # pairs of 6-row tiles over three blocks (K >= SIX_MIN_K), the last blocks 4 rows at a time
            nb4 = o // MR
            for ob in range(0, nb4 - 2 if k >= SIX_MIN_K else 0, 3):
                _tile6a(wp, xf, ldx, px, yf, ldy, py, ob, bias, k, k0, kn, k0 == 0, clo, chi)
                _tile6b(wp, xf, ldx, px, yf, ldy, py, ob + 1, bias, k, k0, kn, k0 == 0, clo, chi)
            for ob in range(nb4 // 3 * 3 if k >= SIX_MIN_K else 0, nb4):
                _tile(wp, xf, ldx, px, yf, ldy, py, ob, bias, k, k0, kn, k0 == 0, clo, chi)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def _rows_first(wp, bias, xf, ldx, whole, yf, ldy, o, k, lo, hi):
    """_panels' tiles over the first `whole` columns (one K chunk: k <= KC), each group of output rows
    along all the panels before the next group: the stores run along a few rows at a time, not one
    line in each of O rows per panel. The same tiles, so the same bytes."""
    nb4 = o // MR
    six = k >= SIX_MIN_K
    for ob in range(0, nb4 - 2 if six else 0, 3):
        for p0 in range(0, whole, NR):
            _tile6a(wp, xf, ldx, p0, yf, ldy, p0, ob, bias, k, 0, k, True, lo, hi)
            _tile6b(wp, xf, ldx, p0, yf, ldy, p0, ob + 1, bias, k, 0, k, True, lo, hi)
    for ob in range(nb4 // 3 * 3 if six else 0, nb4):
        for p0 in range(0, whole, NR):
            _tile(wp, xf, ldx, p0, yf, ldy, p0, ob, bias, k, 0, k, True, lo, hi)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemm_bias_clamp(wp, bias, x, lo, hi, y, panel, tile):
    """y [O, P] = clamp(W @ x [K, P] + bias, lo, hi), W packed by pack_weights ([O/4, K, 4]), bias [O];
    panel [K, 16] and tile [O, 16] scratch for the last P mod 16 columns (contents do not matter)."""
    k, p = x.shape
    gemm_bias_clamp_ld(wp, bias, x.reshape(k * p), p, k, p, lo, hi, y, panel, tile)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemm_bias_clamp_ld(wp, bias, xf, ldx, k, p, lo, hi, y, panel, tile):
    """gemm_bias_clamp with x [K, P] read from the flat xf at row stride ldx >= P (see leading_dim:
    a stride of a multiple of 1 KB put every row of a panel in one L1 set, and the kernel ran at a
    third of its speed on 32 x 1024 columns)."""
    o = y.shape[0]
    yf = y.reshape(o * p)
    whole = p // NR * NR
    if k <= KC and o * k <= ROWS_FIRST_MAX_OK and o >= ROWS_FIRST_MIN_O and whole >= ROWS_FIRST_MIN_P:
        _rows_first(wp, bias, xf, ldx, whole, yf, p, o, k, lo, hi)
    else:
        for p0 in range(0, whole, NR):
            _panels(wp, bias, xf, ldx, p0, yf, p, p0, o, k, lo, hi, False)
    rest = p - whole
    if rest:
        tail_in(xf, ldx, k, whole, rest, panel)
        _panels(wp, bias, panel.reshape(k * NR), NR, 0, tile.reshape(o * NR), NR, 0, o, k, lo, hi, rest <= NR // 2)
        tail_out(tile, y, whole, rest)


# output rows per block of a split GEMM (rows_range): 24 = the 12-row groups of the six-row tile pairs and
# the 8-row groups of the narrow tail's tiles, so every row gets the tile it gets in the whole product
# (the same FMA chains: the same bytes however the blocks are cut)
ROWS_BLOCK = 24


@nb.njit(nogil=True, cache=True, boundscheck=False)
def rows_range(wp, bias, xf, ldx, k, p, lo, hi, y, b0, b1):
    """gemm_bias_clamp_ld over output rows [ROWS_BLOCK b0, min(ROWS_BLOCK b1, O)) of y [O, P] (xf, ldx,
    k, p as there; wp pack_weights' [O/4, K, 4]), with this call's tail scratch: a batch-1 product split
    by output rows, each thread streaming its own rows' weights."""
    r0, r1 = b0 * ROWS_BLOCK, min(b1 * ROWS_BLOCK, y.shape[0])
    if r1 > r0:
        gemm_bias_clamp_ld(wp[r0 // MR:r1 // MR], bias[r0:r1], xf, ldx, k, p, lo, hi, y[r0:r1],
                           np.empty((k, NR), np.float32), np.empty((r1 - r0, NR), np.float32))


# columns per block of a split GEMM over few output rows (cols_range): whole 16-column panels
COLS_BLOCK = 64


@nb.njit(nogil=True, cache=True, boundscheck=False)
def cols_range(wp, bias, xf, ldx, k, p, lo, hi, y, b0, b1):
    """gemm_bias_clamp_ld over columns [COLS_BLOCK b0, min(COLS_BLOCK b1, P)) of y [O, P]: a batch-1
    product of few output rows (one ROWS_BLOCK) over a wide plane, split by pixels. Each 16-column
    panel gets the tiles of the whole call (the row-groups-first order of gemm_bias_clamp_ld runs the
    same tiles), the last P mod 16 columns through this call's tail scratch: the same bytes."""
    o = y.shape[0]
    yf = y.reshape(o * p)
    whole = p // NR * NR
    c0, c1 = b0 * COLS_BLOCK, min(b1 * COLS_BLOCK, p)
    for p0 in range(c0, min(c1, whole), NR):
        _panels(wp, bias, xf, ldx, p0, yf, p, p0, o, k, lo, hi, False)
    rest = p - whole
    if rest and c1 == p and c0 < p:
        panel, tile = np.empty((k, NR), np.float32), np.empty((o, NR), np.float32)
        tail_in(xf, ldx, k, whole, rest, panel)
        _panels(wp, bias, panel.reshape(k * NR), NR, 0, tile.reshape(o * NR), NR, 0, o, k, lo, hi, rest <= NR // 2)
        tail_out(tile, y, whole, rest)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def tail_in(src, ld, rows, whole, rest, dst):
    """dst[:rows] [rows, NR] = columns whole .. whole + rest of the flat src [rows, ld], zero-padded: the
    last P mod 16 columns as a whole panel for the tile."""
    for i in range(rows):
        d = dst[i]
        for j in range(rest):
            d[j] = src[i * ld + whole + j]
        for j in range(rest, NR):
            d[j] = 0


@nb.njit(nogil=True, cache=True, boundscheck=False)
def tail_out(tile, y, whole, rest):
    """y[:, whole:whole + rest] = the tile's first rest columns of its first y.shape[0] rows (tail_in's
    way back)."""
    for r in range(y.shape[0]):
        src, dst = tile[r], y[r]
        for j in range(rest):
            dst[whole + j] = src[j]


def leading_dim(p: int) -> int:
    """A row stride for a [K, P] operand of gemm_bias_clamp_ld: P rounded up to whole 64-byte lines,
    an odd number of them, so that a panel's rows spread over the L1 sets."""
    lines = -(-p // NR)
    return NR * (lines + 1 - lines % 2)


def packed_pays(o: int, k: int, p: int) -> bool:
    """Whether a batch-1 convolution's GEMM of o outputs, k inputs (channels x taps) over p pixels
    runs faster here (weights packed once, bias and clamp in the epilogue) than BLAS, which packs
    both operands on every call, plus a bias pass: o a multiple of 4, at least 16 pixels,
    k <= 256 or at most DEEP_MAX_P pixels, and AVX2. MobileNet's 6x6 planes with k <= 192: 0.5-0.9x
    BLAS + the bias pass. Deeper k (the core CNN's k = 800 ran as fast as BLAS) only on small
    planes: with the 6 x 16 tiles, 1x1s of k 384-576 on 6x6 planes 0.97-1.02x BLAS + bias (L2-cold,
    one thread), and 0.83-0.95x the pixel-rows GEMM (core.ops.conv_pixels), whose gather they skip.
    The edge interpreter and the executor both ask here (the caller checks constant weights)."""
    return o % MR == 0 and p >= 16 and (k <= 256 or p <= DEEP_MAX_P) and supported()


def pack_weights(w: np.ndarray) -> np.ndarray:
    """w [O, K] float32 (O a multiple of 4) -> [O/4, K, 4]: four rows' weights side by side per k."""
    o, k = w.shape
    if o % MR:
        raise ValueError(f"fp32 GEMM: {o} output rows are not a multiple of {MR}")
    return np.ascontiguousarray(w.astype(np.float32).reshape(o // MR, MR, k).transpose(0, 2, 1))


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_images_ld(x, h, w, geo, wp, bias, lo, hi, out, ldx, i0, i1):
    """out[i] [O, OH OW] = clamp(W @ im2col(x[i]) + bias, lo, hi) for i0 <= i < i1: x [N, C, H W] the
    unpadded images, wp pack_weights' W, geo as im2col_ld's, the columns at row stride ldx
    (leading_dim) in a scratch of this call."""
    k = x.shape[1] * geo[0] * geo[1]
    o, p = out.shape[1], out.shape[2]
    cols = np.empty((k, ldx), np.float32)
    panel = np.empty((k, NR), np.float32)
    tile = np.empty((o, NR), np.float32)
    cf = cols.reshape(k * ldx)
    for i in range(i0, i1):
        im2col_ld(x[i], h, w, geo, cols)
        gemm_bias_clamp_ld(wp, bias, cf, ldx, k, p, lo, hi, out[i], panel, tile)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_image_ld(x, h, w, geo, wp, bias, lo, hi, y, cols):
    """One image's convolution in one call (one dispatch, not two): y [O, OH OW] = clamp(W @
    im2col(x) + bias, lo, hi), x [C, H W] unpadded, cols a [C kh kw, ldx] scratch (leading_dim)."""
    k, ldx = cols.shape
    im2col_ld(x, h, w, geo, cols)
    gemm_bias_clamp_ld(wp, bias, cols.reshape(k * ldx), ldx, k, y.shape[1], lo, hi, y,
                       np.empty((k, NR), np.float32), np.empty((y.shape[0], NR), np.float32))


@nb.njit(nogil=True, cache=True, boundscheck=False)
def pointwise_images(x, wp, bias, lo, hi, out, i0, i1):
    """out[i] [O, P] = clamp(W @ x[i] [C, P] + bias, lo, hi) for i0 <= i < i1: a batch's 1x1
    convolutions on the packed GEMM, the weights packed once (not by BLAS per call)."""
    k, o = x.shape[1], out.shape[1]
    panel = np.empty((k, NR), np.float32)
    tile = np.empty((o, NR), np.float32)
    for i in range(i0, i1):
        gemm_bias_clamp(wp, bias, x[i], lo, hi, out[i], panel, tile)
