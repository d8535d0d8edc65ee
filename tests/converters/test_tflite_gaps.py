"""TFLite import gaps of issue 20: STRIDED_SLICE (all masks, offset; after a conv that holds the value
NCHW), checked against numpy's indexing of the same NHWC values; sparse (CSR and block-sparse) constants
densified for DENSIFY, and malformed sparsity refused with messages that say "sparse"."""
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
