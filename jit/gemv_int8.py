"""int8 matrix-vector products with int32 accumulation, requantized per output: the edge's dense
layers at batch 1-3, where the weights stream once from memory per input row.

LLVM vectorizes numba's one-row dot product (jit.gemm_int8._dot) into 128-bit multiply-adds on
int8 loads sign-extended to int32 pairs: 8 products per instruction, about 20 GMAC/s here, half the
speed at which the weights arrive from cache. The loop here is written in LLVM IR (a numba
intrinsic): four weight rows at a time share one load of the activation vector (int16, converted
once per row of the input), each step sign-extends 16 int8 weights of a row to int16 and multiplies
them with 16 activations into eight int32 pairs (pmaddwd on 256-bit vectors).

Weights are int8 [ceil(N/4)*4, ceil(K/16)*16] with zero padding (pack_weights, once at prepare),
so neither the padded activation columns nor the padded rows need clearing or masking.
Requantization is jit.gemm_int8's (ties to even): out = rint(clamp(acc mf + cf, flo, fhi)) - off in float
where the caller proved it exact, else clamp(shift_round_even(acc q + c, s, zp), lo, hi) in int64.
"""
from __future__ import annotations

import numba as nb  # imported only when an int8 GEMV kernel is first prepared
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .requantize import shift_round_even

ROWS, KB = 4, 16  # weight rows per step, int8 weights per row per step


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


def pack_weights(wt: np.ndarray) -> np.ndarray:
    """Weights [N, K] within int8 (rows = output channels) -> int8 [ceil(N/4)*4, ceil(K/16)*16], zero
    padded (once, at prepare)."""
    n, k = wt.shape
    if wt.size and (int(wt.min()) < -128 or int(wt.max()) > 127):
        raise ValueError("int8 GEMV weights must fit in int8")
    w8 = np.zeros((-(-n // ROWS) * ROWS, -(-k // KB) * KB), np.int8)
    w8[:n, :k] = wt
    return w8


def activation_elems(k: int) -> int:
    """Elements of the int16 scratch holding one activation row (K rounded up to 16)."""
    return -(-k // KB) * KB


@nb.njit(nogil=True, cache=True, boundscheck=False)
def _widen(src, a16):
    for i in range(src.shape[0]):
        a16[i] = src[i]


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemv_requantize_float(w8, a, a16, mf, cf, flo, fhi, off, out):
    """out[m, n] = rint(clamp(dot(w8[n], a[m]) mf[n] + cf[n], flo, fhi)) - off for n < N = out.shape[1];
    a int8 [M, K], a16 int16 scratch (activation_elems(K)), w8 from pack_weights."""
    n_, kb = out.shape[1], w8.shape[1] // KB
    for m in range(a.shape[0]):
        _widen(a[m], a16)
        om = out[m]
        for n0 in range(0, n_, ROWS):
            s = _dot_rows(w8, a16, n0, kb)
            for r in range(min(ROWS, n_ - n0)):
                t = np.float64(s[r]) * mf[n0 + r] + cf[n0 + r]
                om[n0 + r] = np.int8(np.int32(np.rint(min(max(t, flo), fhi))) - off)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemv_requantize_int(w8, a, a16, q, c, s, zp, lo, hi, out):
    """gemv_requantize_float's product, requantized in int64:
    clamp(shift_round_even(acc q[n] + c[n], s[n], zp), lo, hi)."""
    n_, kb = out.shape[1], w8.shape[1] // KB
    for m in range(a.shape[0]):
        _widen(a[m], a16)
        om = out[m]
        for n0 in range(0, n_, ROWS):
            t = _dot_rows(w8, a16, n0, kb)
            for r in range(min(ROWS, n_ - n0)):
                n = n0 + r
                v = shift_round_even(np.int64(t[r]) * q[n] + c[n], s[n], zp)
                om[n] = np.int8(min(max(v, lo), hi))


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemv_int32(w8, a, a16, out):
    """out int32 [M, N] = the plain integer product a @ w8[:N].T (for tests and references)."""
    n_, kb = out.shape[1], w8.shape[1] // KB
    for m in range(a.shape[0]):
        _widen(a[m], a16)
        for n0 in range(0, n_, ROWS):
            s = _dot_rows(w8, a16, n0, kb)
            for r in range(min(ROWS, n_ - n0)):
                out[m, n0 + r] = s[r]
