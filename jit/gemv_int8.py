"""int8 matrix-vector products with int32 accumulation, requantized per output: the edge's dense
layers at batch 1-3, where the weights stream once from memory per input row.

LLVM vectorizes numba's one-row dot product (jit.gemm_int8._dot) into 128-bit multiply-adds on
int8 loads sign-extended to int32 pairs: 8 products per instruction, about 20 GMAC/s here, half the
speed at which the weights arrive from cache. The loop here is written in LLVM IR (a numba
intrinsic): four weight rows at a time share one load of the activation vector (int16, converted
once per row of the input), each step sign-extends 16 int8 weights of a row to int16 and multiplies
them with 16 activations into eight int32 pairs (pmaddwd on 256-bit vectors).

Weights are int8 [ceil(N/4)*4, ceil(K/32)*32] with zero padding (pack_weights, once at prepare),
so neither the padded activation columns nor the padded rows need clearing or masking.

Where no weight is -128 (the quantizer's symmetric weights never are), the `sign` loop takes 32
weights of a row per step in two multiplies instead of 16 in one multiply and one widening:
pmaddubsw multiplies unsigned by signed bytes, so the activation goes in as |a| (unsigned, at most
128) and each weight as w sign(a) (psignb; exact since |w| <= 127), products at most 128 * 127 and
a pair's sum at most 32512, inside int16 (no saturation); pmaddwd against ones then sums pairs of
those into int32. The same integer dot product with 3 instead of 4 operations on the vector
multiply pipes per 32 weights. Its weights are interleaved (four rows' 32 bytes in one run), one
stream that the loop prefetches 8 KiB ahead: a dense layer's weights are read once per call and
have often left the caches since (the other layers, other processes).
Requantization is jit.gemm_int8's (ties to even): out = rint(clamp(acc mf + cf, flo, fhi)) - off in float
where the caller proved it exact, else clamp(shift_round_even(acc q + c, s, zp), lo, hi) in int64.
"""
from __future__ import annotations

import numba as nb  # imported only when an int8 GEMV kernel is first prepared
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

from .requantize import shift_round_even

ROWS, KB, KB2 = 4, 16, 32  # weight rows per step, int8 weights per row per step (KB2: the sign loop's)
# the sign loop's weights are one stream: prefetched this many bytes ahead. Measured in one process on the
# W2 CNN's 3136 x 1024 layer right after the fp32 and int8 interpreters ran (its weights partly evicted):
# 130-146 us without, 98 / 86 / 90 / 95 us at 4 / 8 / 16 / 32 KiB; 107-121 -> 70-77 us run twice in a row
PREFETCH = 8192


@intrinsic
def _dot_rows(typingctx, w, a16, n, kb):
    """(s0, s1, s2, s3), sr = sum over k < 16 kb of w[n + r, k] a16[k]: w int8 [Npad, Kpad] C order,
    a16 int16 [>= 16 kb]."""
    sig = types.UniTuple(types.int32, ROWS)(w, a16, n, kb)

    def codegen(context, builder, signature, args):
        wa, aa = (context.make_array(t)(context, builder, v) for t, v in zip(signature.args[:2], args[:2]))
        i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
        v8, v16, b16 = ir.VectorType(i32, 8), ir.VectorType(i16, 16), ir.VectorType(i8, 16)
        wptr, aptr = builder.bitcast(wa.data, i8.as_pointer()), builder.bitcast(aa.data, i16.as_pointer())
        ldw = cgutils.unpack_tuple(builder, wa.shape)[1]
        n_, kb_ = args[2], args[3]
        madd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v16, v16]),
                                              "llvm.x86.avx2.pmadd.wd")
        rows = [builder.mul(builder.add(n_, ir.Constant(i64, r)), ldw) for r in range(ROWS)]
        entry = builder.basic_block
        loop, done = builder.append_basic_block("gemv.loop"), builder.append_basic_block("gemv.done")
        zero = ir.Constant(v8, None)
        builder.cbranch(builder.icmp_signed(">", kb_, ir.Constant(i64, 0)), loop, done)
        builder.position_at_end(loop)
        k = builder.phi(i64)
        k.add_incoming(ir.Constant(i64, 0), entry)
        accs = [builder.phi(v8) for _ in range(ROWS)]
        for a in accs:
            a.add_incoming(zero, entry)
        off = builder.mul(k, ir.Constant(i64, KB))
        av = builder.load(builder.bitcast(builder.gep(aptr, [off]), v16.as_pointer()), align=2)
        new = []
        for r in range(ROWS):
            at = builder.gep(wptr, [builder.add(rows[r], off)])
            wv = builder.load(builder.bitcast(at, b16.as_pointer()), align=1)
            new.append(builder.add(accs[r], builder.call(madd, [builder.sext(wv, v16), av])))
        k2 = builder.add(k, ir.Constant(i64, 1))
        for a, v in zip(accs, new):
            a.add_incoming(v, loop)
        k.add_incoming(k2, loop)
        builder.cbranch(builder.icmp_signed("<", k2, kb_), loop, done)
        builder.position_at_end(done)
        sums = []
        for v in new:
            res = builder.phi(v8)
            res.add_incoming(zero, entry)
            res.add_incoming(v, loop)
            sums.append(res)
        outs = []
        for res in sums:  # the horizontal sum of eight lanes (wraps as int32, like the lanes)
            s = builder.extract_element(res, ir.Constant(i32, 0))
            for lane in range(1, 8):
                s = builder.add(s, builder.extract_element(res, ir.Constant(i32, lane)))
            outs.append(s)
        return context.make_tuple(builder, signature.return_type, outs)
    return sig, codegen


def _hsum(builder, v8):
    """The horizontal sum of eight int32 lanes (wraps as int32, like the lanes)."""
    i32 = ir.IntType(32)
    s = builder.extract_element(v8, ir.Constant(i32, 0))
    for lane in range(1, 8):
        s = builder.add(s, builder.extract_element(v8, ir.Constant(i32, lane)))
    return s


@intrinsic
def _dot_rows_sign(typingctx, w, ab, n, kb):
    """(s0, s1, s2, s3), sr = sum over k < 32 kb of w[n + r, k] a[k]: w = interleave(pack_weights(.))
    with no -128, ab uint8 [2 Kpad] holding |a| (unsigned) then a (signed)."""
    sig = types.UniTuple(types.int32, ROWS)(w, ab, n, kb)

    def codegen(context, builder, signature, args):
        wa, aa = (context.make_array(t)(context, builder, v) for t, v in zip(signature.args[:2], args[:2]))
        i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
        v8, v16, b32 = ir.VectorType(i32, 8), ir.VectorType(i16, 16), ir.VectorType(i8, 32)
        wptr, aptr = builder.bitcast(wa.data, i8.as_pointer()), builder.bitcast(aa.data, i8.as_pointer())
        ldw = cgutils.unpack_tuple(builder, wa.shape)[1]
        n_, kb_ = args[2], args[3]
        mod = builder.module
        psign = cgutils.get_or_insert_function(mod, ir.FunctionType(b32, [b32, b32]), "llvm.x86.avx2.psign.b")
        ubsw = cgutils.get_or_insert_function(mod, ir.FunctionType(v16, [b32, b32]), "llvm.x86.avx2.pmadd.ub.sw")
        madd = cgutils.get_or_insert_function(mod, ir.FunctionType(v8, [v16, v16]), "llvm.x86.avx2.pmadd.wd")
        ones = ir.Constant(v16, [1] * 16)
        base = builder.mul(n_, ldw)  # rows n..n+3 interleaved: step k's 4 x 32 bytes at n ldw + 128 k
        entry = builder.basic_block
        loop, done = builder.append_basic_block("gemv.loop"), builder.append_basic_block("gemv.done")
        zero = ir.Constant(v8, None)
        builder.cbranch(builder.icmp_signed(">", kb_, ir.Constant(i64, 0)), loop, done)
        builder.position_at_end(loop)
        k = builder.phi(i64)
        k.add_incoming(ir.Constant(i64, 0), entry)
        accs = [builder.phi(v8) for _ in range(ROWS)]
        for a in accs:
            a.add_incoming(zero, entry)
        off = builder.mul(k, ir.Constant(i64, KB2))
        wrow = builder.add(base, builder.mul(off, ir.Constant(i64, ROWS)))
        prefetch = cgutils.get_or_insert_function(mod, ir.FunctionType(ir.VoidType(), [i8.as_pointer(), i32, i32, i32]),
                                                  "llvm.prefetch.p0i8")  # (address, read, locality 3, data)
        for j in range(0, ROWS * KB2, 64):  # past the end it fetches nothing that faults (a hint)
            builder.call(prefetch, [builder.gep(wptr, [builder.add(wrow, ir.Constant(i64, PREFETCH + j))]),
                                    ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        uv, sv = (builder.load(builder.bitcast(builder.gep(aptr, [o]), b32.as_pointer()), align=1)
                  for o in (off, builder.add(off, ldw)))
        new = []
        for r in range(ROWS):
            at = builder.gep(wptr, [builder.add(wrow, ir.Constant(i64, r * KB2))])
            wv = builder.load(builder.bitcast(at, b32.as_pointer()), align=1)
            p16 = builder.call(ubsw, [uv, builder.call(psign, [wv, sv])])
            new.append(builder.add(accs[r], builder.call(madd, [p16, ones])))
        k2 = builder.add(k, ir.Constant(i64, 1))
        for a, v in zip(accs, new):
            a.add_incoming(v, loop)
        k.add_incoming(k2, loop)
        builder.cbranch(builder.icmp_signed("<", k2, kb_), loop, done)
        builder.position_at_end(done)
        outs = []
        for v in new:
            res = builder.phi(v8)
            res.add_incoming(zero, entry)
            res.add_incoming(v, loop)
            outs.append(res)
        return context.make_tuple(builder, signature.return_type, [_hsum(builder, v) for v in outs])
    return sig, codegen


def pack_weights(wt: np.ndarray) -> np.ndarray:
    """Weights [N, K] within int8 (rows = output channels) -> int8 [ceil(N/4)*4, ceil(K/32)*32], zero
    padded (once, at prepare)."""
    n, k = wt.shape
    if wt.size and (int(wt.min()) < -128 or int(wt.max()) > 127):
        raise ValueError("int8 GEMV weights must fit in int8")
    w8 = np.zeros((-(-n // ROWS) * ROWS, -(-k // KB2) * KB2), np.int8)
    w8[:n, :k] = wt
    return w8


def activation_elems(k: int) -> int:
    """Elements of the int16 scratch holding one activation row (K rounded up to 32; the sign loop
    reads the same bytes as |a| then a, uint8 [2 Kpad])."""
    return -(-k // KB2) * KB2


def signable(w8: np.ndarray) -> bool:
    """Whether the sign loop (gemv_sign_*) may take these packed weights: none is -128."""
    return not (w8 == -128).any()


def interleave(w8: np.ndarray) -> np.ndarray:
    """pack_weights' [Npad, Kpad] -> the sign loop's order, same shape: each block of four rows as
    [Kpad / 32, 4, 32], so that a step's four rows are one 128-byte run and the weights one stream."""
    npad, kpad = w8.shape
    t = w8.reshape(npad // ROWS, ROWS, kpad // KB2, KB2).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(t).reshape(npad, kpad)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def _widen(src, a16):
    for i in range(src.shape[0]):
        a16[i] = src[i]


@nb.njit(nogil=True, cache=True, boundscheck=False)
def _abs_sign(src, ab):
    """ab[:Kpad] = |src| as unsigned bytes (|-128| wraps to 128), ab[Kpad:] = src; zeros after K."""
    kpad, k = ab.shape[0] // 2, src.shape[0]
    mags, signs = ab[:kpad], ab[kpad:]
    for i in range(k):
        v = np.int16(src[i])
        mags[i] = np.uint8(max(v, -v))
        signs[i] = np.uint8(v & 0xFF)
    for i in range(k, kpad):
        mags[i] = 0
        signs[i] = 0


def _prep(src, scratch):
    """Row m's activations into the dot's scratch: _widen (int16 scratch) or _abs_sign (uint8)."""


@overload(_prep)
def _prep_for(src, scratch):
    """_prep chosen by the scratch's type when the kernel compiles."""
    if scratch.dtype == types.int16:
        return lambda src, scratch: _widen(src, scratch)
    return lambda src, scratch: _abs_sign(src, scratch)


def _dot(w8, scratch, n0, kb):
    """ROWS int32 sums: _dot_rows (int16 scratch) or _dot_rows_sign (uint8)."""


@overload(_dot)
def _dot_for(w8, scratch, n0, kb):
    """_dot chosen by the scratch's type when the kernel compiles."""
    if scratch.dtype == types.int16:
        return lambda w8, scratch, n0, kb: _dot_rows(w8, scratch, n0, kb)
    return lambda w8, scratch, n0, kb: _dot_rows_sign(w8, scratch, n0, kb)


def _put(om, s, n0, p):
    """om[n0:n0 + ROWS] from the sums s, by p: (mf, cf, flo, fhi, off) float requantization,
    (q, c, s, zp, lo, hi) integer requantization, None the plain int32 product."""


@overload(_put)
def _put_for(om, s, n0, p):
    """_put chosen by p's type when the kernel compiles."""
    if isinstance(p, types.NoneType):
        def put(om, s, n0, p):
            for r in range(min(ROWS, om.shape[0] - n0)):
                om[n0 + r] = s[r]
    elif len(p) == 5:
        def put(om, s, n0, p):
            mf, cf, flo, fhi, off = p
            for r in range(min(ROWS, om.shape[0] - n0)):
                t = np.float64(s[r]) * mf[n0 + r] + cf[n0 + r]
                om[n0 + r] = np.int8(np.int32(np.rint(min(max(t, flo), fhi))) - off)
    else:
        def put(om, s, n0, p):
            q, c, sh, zp, lo, hi = p
            for r in range(min(ROWS, om.shape[0] - n0)):
                n = n0 + r
                v = shift_round_even(np.int64(s[r]) * q[n] + c[n], sh[n], zp)
                om[n] = np.int8(min(max(v, lo), hi))
    return put


@nb.njit(nogil=True, boundscheck=False)
def _rows(w8, a, scratch, kb, p, out):
    """Every kernel's loop: per input row m, _prep(a[m], scratch), then ROWS outputs at a time
    _put(out[m], _dot(w8, scratch, n0, kb), n0, p); the scratch's type picks the dot, p's the
    requantization, when a kernel below compiles."""
    for m in range(a.shape[0]):
        _prep(a[m], scratch)
        om = out[m]
        for n0 in range(0, out.shape[1], ROWS):
            _put(om, _dot(w8, scratch, n0, kb), n0, p)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemv_requantize_float(w8, a, a16, mf, cf, flo, fhi, off, out):
    """out[m, n] = rint(clamp(dot(w8[n], a[m]) mf[n] + cf[n], flo, fhi)) - off for n < N = out.shape[1];
    a int8 [M, K], a16 int16 scratch (activation_elems(K)), w8 from pack_weights."""
    _rows(w8, a, a16, w8.shape[1] // KB, (mf, cf, flo, fhi, off), out)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemv_requantize_int(w8, a, a16, q, c, s, zp, lo, hi, out):
    """gemv_requantize_float's product, requantized in int64:
    clamp(shift_round_even(acc q[n] + c[n], s[n], zp), lo, hi)."""
    _rows(w8, a, a16, w8.shape[1] // KB, (q, c, s, zp, lo, hi), out)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemv_int32(w8, a, a16, out):
    """out int32 [M, N] = the plain integer product a @ w8[:N].T (for tests and references)."""
    _rows(w8, a, a16, w8.shape[1] // KB, None, out)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemv_sign_requantize_float(w8, a, ab, mf, cf, flo, fhi, off, out):
    """gemv_requantize_float through the sign loop: w8 = interleave(pack_weights(.)) with signable, ab
    uint8 scratch [2 activation_elems(K)] (the int16 scratch's bytes)."""
    _rows(w8, a, ab, w8.shape[1] // KB2, (mf, cf, flo, fhi, off), out)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemv_sign_requantize_int(w8, a, ab, q, c, s, zp, lo, hi, out):
    """gemv_requantize_int through the sign loop (gemv_sign_requantize_float's operands)."""
    _rows(w8, a, ab, w8.shape[1] // KB2, (q, c, s, zp, lo, hi), out)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemv_sign_int32(w8, a, ab, out):
    """gemv_int32 through the sign loop (for tests and references)."""
    _rows(w8, a, ab, w8.shape[1] // KB2, None, out)
