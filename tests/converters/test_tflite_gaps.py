"""TFLite import gaps of issue 20: STRIDED_SLICE (all masks, offset; after a conv that holds the value
NCHW), checked against numpy's indexing of the same NHWC values; sparse (CSR and block-sparse) constants
densified for DENSIFY, and malformed sparsity refused with messages that say "sparse"; MediaPipe custom
operators against references written from their published kernels' loops."""
import numpy as np
import pytest

from .test_tflite_import import _run, conv_opts, ref_conv
from .tflite_writer import TFLiteWriter

rng = np.random.default_rng(11)
F32 = np.float32


def _ss_opts(begin=0, end=0, ellipsis=0, new=0, shrink=0, offset=False):
    return dict(BeginMask=begin, EndMask=end, EllipsisMask=ellipsis, NewAxisMask=new, ShrinkAxisMask=shrink,
                Offset=offset)


CASES = [  # begin, end, strides, options, numpy key of the NHWC value, output shape
    ([0, 1, 0, 2], [2, 4, 5, 6], [1, 1, 2, 1], _ss_opts(), np.s_[0:2, 1:4, 0:5:2, 2:6], [2, 3, 3, 4]),
    ([0, 0, 0, 0], [0, 0, 0, 0], [1, -1, 1, 2], _ss_opts(begin=15, end=15), np.s_[:, ::-1, :, ::2], [2, 4, 5, 3]),
    ([1, 0], [0, 3], [1, 1], _ss_opts(ellipsis=1), np.s_[..., 0:3], [2, 4, 5, 3]),
    ([0, 2, 0, 0], [0, 3, 0, 0], [1, 1, 1, 1], _ss_opts(begin=13, end=13, shrink=2), np.s_[:, 2, :, :], [2, 5, 6]),
    ([0, 0, 1, 0], [0, 0, 3, 0], [1, 1, 1, 1], _ss_opts(begin=11, end=11, new=2), np.s_[:, None, 1:3, :], [2, 1, 2, 5, 6]),
    ([0, 1, 1, 0], [2, 2, 3, 6], [1, 1, 1, 1], _ss_opts(offset=True), np.s_[0:2, 1:3, 1:4, 0:6], [2, 2, 3, 6]),
]


@pytest.mark.parametrize("begin,end,strides,opts,key,shape", CASES)
def test_strided_slice_after_a_conv(begin, end, strides, opts, key, shape):
    w = TFLiteWriter()
    x = w.tensor("x", [2, 4, 5, 3])
    k = rng.standard_normal((6, 1, 1, 3)).astype(F32)
    c = w.tensor("c", [2, 4, 5, 6])
    w.op("CONV_2D", [x, w.const("k", k), -1], [c], conv_opts("VALID"), "Conv2DOptions")  # held NCHW from here
    y = w.tensor("y", shape)
    w.op("STRIDED_SLICE", [c] + [w.const(n, np.array(v, np.int32)) for n, v in
                                 (("begin", begin), ("end", end), ("strides", strides))], [y], opts,
         "StridedSliceOptions")
    data = w.finish([x], [y])
    xv = rng.standard_normal((2, 4, 5, 3)).astype(F32)
    (got,), _, _ = _run(data, {"x": xv}, nhwc_io=True)
    np.testing.assert_allclose(got, ref_conv(xv, k, None, 1, "VALID")[key], rtol=1e-5, atol=1e-6)


# ---- sparse constants ------------------------------------------------------------------------------------
class SparseWriter(TFLiteWriter):
    """TFLiteWriter whose tensors may carry SparsityParameters (only the non-zeros in their buffer)."""

    def sparse_const(self, name, shape, values, order, block_map, dims):
        i = self.tensor(name, shape, values.dtype, values)
        self.tensors[i]["sparsity"] = (order, block_map, dims)
        return i

    def _tensor(self, b, t):
        if "sparsity" not in t:
            return super()._tensor(b, t)
        import importlib

        import tflite
        DM, IV, SP = (importlib.import_module(f"tflite.{m}") for m in ("DimensionMetadata", "Int32Vector",
                                                                        "SparsityParameters"))
        order, block_map, dims = t["sparsity"]
        dm_offs = []
        for fmt, size, seg, idx in dims:
            vecs = []
            for arr in (seg, idx):
                if arr is None:
                    vecs.append(None)
                    continue
                data = b.CreateNumpyVector(np.asarray(arr, np.int32))
                IV.Int32VectorStart(b)
                IV.Int32VectorAddValues(b, data)
                vecs.append(IV.Int32VectorEnd(b))
            DM.DimensionMetadataStart(b)
            DM.DimensionMetadataAddFormat(b, fmt)
            DM.DimensionMetadataAddDenseSize(b, size)
            if vecs[0] is not None:
                DM.DimensionMetadataAddArraySegmentsType(b, 1)
                DM.DimensionMetadataAddArraySegments(b, vecs[0])
                DM.DimensionMetadataAddArrayIndicesType(b, 1)
                DM.DimensionMetadataAddArrayIndices(b, vecs[1])
            dm_offs.append(DM.DimensionMetadataEnd(b))
        tr = b.CreateNumpyVector(np.asarray(order, np.int32))
        bm = b.CreateNumpyVector(np.asarray(block_map, np.int32))
        dmv = self._offsets(b, SP.SparsityParametersStartDimMetadataVector, dm_offs)
        SP.SparsityParametersStart(b)
        SP.SparsityParametersAddTraversalOrder(b, tr)
        SP.SparsityParametersAddBlockMap(b, bm)
        SP.SparsityParametersAddDimMetadata(b, dmv)
        sp = SP.SparsityParametersEnd(b)
        name = b.CreateString(t["name"])
        shape = b.CreateNumpyVector(np.asarray(t["shape"], np.int32))
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape)
        tflite.TensorAddType(b, t["type"])
        tflite.TensorAddBuffer(b, t["buffer"])
        tflite.TensorAddName(b, name)
        tflite.TensorAddSparsity(b, sp)
        return tflite.TensorEnd(b)


def _csr(dense):
    """Row-major CSR of a 2-D array: (values, segments, indices)."""
    seg, idx, vals = [0], [], []
    for row in dense:
        nz = np.nonzero(row)[0]
        idx += nz.tolist()
        vals += row[nz].tolist()
        seg.append(len(idx))
    return np.array(vals, dense.dtype), seg, idx


def _fc_model(weights_index_fn):
    w = SparseWriter()
    x = w.tensor("x", [2, 6])
    wi = weights_index_fn(w)
    dense_w = w.tensor("wd", [4, 6])
    w.op("DENSIFY", [wi], [dense_w])
    y = w.tensor("y", [2, 4])
    w.op("FULLY_CONNECTED", [x, dense_w, -1], [y], dict(FusedActivationFunction=0), "FullyConnectedOptions")
    return w.finish([x], [y])


def test_csr_sparse_weights_densify_into_a_fully_connected_layer():
    dense = rng.standard_normal((4, 6)).astype(F32) * (rng.random((4, 6)) < 0.4)
    vals, seg, idx = _csr(dense)
    data = _fc_model(lambda w: w.sparse_const("ws", [4, 6], vals, [0, 1], [], [(0, 4, None, None), (1, 0, seg, idx)]))
    xv = rng.standard_normal((2, 6)).astype(F32)
    (got,), _, _ = _run(data, {"x": xv})
    np.testing.assert_allclose(got, xv @ dense.T, rtol=1e-5, atol=1e-6)


def test_block_sparse_weights_densify():
    # 4x6 in 1x2 blocks along the columns: 3 column blocks per row, some all zero
    dense = rng.standard_normal((4, 6)).astype(F32)
    keep = np.array([[1, 0, 1], [0, 0, 1], [1, 1, 1], [0, 1, 0]], bool)
    dense *= np.repeat(keep, 2, axis=1)
    seg, idx, vals = [0], [], []
    for r in range(4):
        for cb in np.nonzero(keep[r])[0]:
            idx.append(int(cb))
            vals += dense[r, 2 * cb:2 * cb + 2].tolist()
        seg.append(len(idx))
    data = _fc_model(lambda w: w.sparse_const("ws", [4, 6], np.array(vals, F32), [0, 1, 2], [1],
                                              [(0, 4, None, None), (1, 0, seg, idx), (0, 2, None, None)]))
    xv = rng.standard_normal((2, 6)).astype(F32)
    (got,), _, _ = _run(data, {"x": xv})
    np.testing.assert_allclose(got, xv @ dense.T, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sparse,msg", [
    (lambda w: w.sparse_const("ws", [4, 6], np.ones(5, F32), [0, 1], [], [(0, 4, None, None), (1, 0, [0, 1, 2, 3, 9], [0] * 5)]),
     "sparse tensor dimension 1 has segments outside"),
    (lambda w: w.sparse_const("ws", [4, 6], np.ones(3, F32), [0, 1], [], [(0, 4, None, None), (1, 0, [0, 1, 2, 3, 4], [0] * 4)]),
     "sparse tensor metadata addresses 4 values, the buffer holds 3"),
    (lambda w: w.sparse_const("ws", [4, 6], np.ones(4, F32), [0, 1], [], [(0, 4, None, None), (1, 0, [0, 1, 2, 3, 4], [0, 1, 2, 7])]),
     "sparse tensor indices fall outside its shape"),
    (lambda w: w.sparse_const("ws", [4, 6], np.ones(4, F32), [1, 0], [5], [(0, 4, None, None), (0, 6, None, None)]),
     "sparse tensor with inconsistent sparsity parameters"),
])
def test_malformed_sparsity_is_refused_saying_sparse(sparse, msg):
    from isthmus.converters.tflite_import import TFLiteImportError, from_tflite
    with pytest.raises(TFLiteImportError, match=msg):
        from_tflite(_fc_model(sparse))


# ---- MediaPipe custom operators: references written from their published kernels' loops ------------------
def _pool_opts(padding, stride, filt, act=0):
    return np.array([padding, stride[1], stride[0], filt[1], filt[0], act], "<i4").tobytes()


def np_max_pool_argmax(x, stride, filt, same):
    n, h, w, c = x.shape
    oh, ow = ((-(-h // stride[0]), -(-w // stride[1])) if same else
              ((h - filt[0] + stride[0]) // stride[0], (w - filt[1] + stride[1]) // stride[1]))
    ph = max(((oh - 1) * stride[0] + filt[0] - h) // 2, 0)
    pw = max(((ow - 1) * stride[1] + filt[1] - w) // 2, 0)
    out, idx = np.zeros((n, oh, ow, c), F32), np.zeros((n, oh, ow, c), F32)
    for b, oy, ox, ch in np.ndindex(n, oh, ow, c):
        best, at = -np.inf, 0
        for fy in range(filt[0]):
            for fx in range(filt[1]):
                y, xx = oy * stride[0] - ph + fy, ox * stride[1] - pw + fx
                if 0 <= y < h and 0 <= xx < w and x[b, y, xx, ch] > best:
                    best, at = x[b, y, xx, ch], fy * filt[1] + fx
        out[b, oy, ox, ch], idx[b, oy, ox, ch] = best, at + 0.1
    return out, idx


@pytest.mark.parametrize("same,stride,filt", [(True, (2, 2), (2, 2)), (True, (2, 1), (3, 3)), (False, (1, 2), (2, 3))])
def test_max_pooling_with_argmax(same, stride, filt):
    w = TFLiteWriter()
    x = w.tensor("x", [2, 5, 6, 3])
    oh, ow = np_max_pool_argmax(np.zeros((1, 5, 6, 1), F32), stride, filt, same)[0].shape[1:3]
    y, i = w.tensor("y", [2, oh, ow, 3]), w.tensor("i", [2, oh, ow, 3])
    w.custom_op("MaxPoolingWithArgmax2D", [x], [y, i], _pool_opts(1 if same else 2, stride, filt))
    data = w.finish([x], [y, i])
    xv = rng.standard_normal((2, 5, 6, 3)).astype(F32)
    xv[0, 0, :2, 0] = 7.0  # a tie: the first position in the window wins
    (gy, gi), _, _ = _run(data, {"x": xv}, nhwc_io=True)
    wy, wi = np_max_pool_argmax(xv, stride, filt, same)
    np.testing.assert_array_equal(gy, wy)
    np.testing.assert_array_equal(gi, wi)


def test_max_unpooling_inverts_max_pooling_with_argmax():
    w = TFLiteWriter()
    x = w.tensor("x", [1, 4, 6, 2])
    y, i = w.tensor("y", [1, 2, 3, 2]), w.tensor("i", [1, 2, 3, 2])
    w.custom_op("MaxPoolingWithArgmax2D", [x], [y, i], _pool_opts(1, (2, 2), (2, 2)))
    u = w.tensor("u", [1, 4, 6, 2])
    w.custom_op("MaxUnpooling2D", [y, i], [u], _pool_opts(1, (2, 2), (2, 2)))
    data = w.finish([x], [u])
    xv = rng.standard_normal((1, 4, 6, 2)).astype(F32)
    (got,), _, _ = _run(data, {"x": xv})
    want = np.zeros_like(xv)
    for b, yy, xx, c in np.ndindex(1, 2, 3, 2):
        win = xv[b, 2 * yy:2 * yy + 2, 2 * xx:2 * xx + 2, c]
        fy, fx = np.unravel_index(np.argmax(win), (2, 2))
        want[b, 2 * yy + fy, 2 * xx + fx, c] = win[fy, fx]
    np.testing.assert_array_equal(got, want)


def np_transpose_conv_bias(x, wt, b, stride, same):
    n, h, w_, ci = x.shape
    co, kh, kw, _ = wt.shape
    ph = max(0, kh - (h - 1) % stride[0] - 1) if same else 0
    pw = max(0, kw - (w_ - 1) % stride[1] - 1) if same else 0
    oh, ow = stride[0] * (h - 1) + kh - ph, stride[1] * (w_ - 1) + kw - pw
    out = np.broadcast_to(b, (n, oh, ow, co)).astype(np.float64).copy()
    for bb, iy, ix, c in np.ndindex(n, h, w_, ci):
        for fy, fx in np.ndindex(kh, kw):
            oy, ox = iy * stride[0] - ph // 2 + fy, ix * stride[1] - pw // 2 + fx
            if 0 <= oy < oh and 0 <= ox < ow:
                out[bb, oy, ox] += x[bb, iy, ix, c] * wt[:, fy, fx, c]
    return out


@pytest.mark.parametrize("same,stride,k", [(True, (2, 2), (4, 4)), (True, (2, 2), (3, 3)), (False, (2, 1), (3, 2)),
                                            (True, (3, 3), (2, 2))])
def test_convolution_2d_transpose_bias(same, stride, k):
    xv = rng.standard_normal((2, 3, 4, 5)).astype(F32)
    wt = rng.standard_normal((4,) + k + (5,)).astype(F32)
    bias = rng.standard_normal(4).astype(F32)
    want = np_transpose_conv_bias(xv, wt, bias, stride, same)
    w = TFLiteWriter()
    x = w.tensor("x", [2, 3, 4, 5])
    y = w.tensor("y", list(want.shape))
    w.custom_op("Convolution2DTransposeBias", [x, w.const("w", wt), w.const("b", bias)], [y],
                np.array([1 if same else 2, stride[1], stride[0]], "<i4").tobytes())
    data = w.finish([x], [y])
    (got,), _, _ = _run(data, {"x": xv}, nhwc_io=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_short_custom_options_are_named():
    from isthmus.converters.tflite_import import TFLiteImportError, from_tflite
    w = TFLiteWriter()
    x, y = w.tensor("x", [1, 4, 4, 1]), w.tensor("y", [1, 2, 2, 1])
    w.custom_op("MaxUnpooling2D", [x, x], [y], b"\x01\x00")
    with pytest.raises(TFLiteImportError, match="custom options hold 2 bytes, TfLitePoolParams needs 24"):
        from_tflite(w.finish([x], [y]))
