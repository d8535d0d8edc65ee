"""TFLite import gaps of issue 20: STRIDED_SLICE (all masks, offset; after a conv that holds the value
NCHW), checked against numpy's indexing of the same NHWC values."""
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
