"""opcontext.WideIm2col: every tap's column is the padded input's window, read as flat runs
over stride phases (or, compact, out of one 6-d window view), checked against windows sliced
directly out of np.pad."""
import numpy as np
import pytest

from isthmus.edge.opcontext import WideIm2col, Window

CASES = [  # n, c, h, w, kh, kw, sh, sw, dh, dw, pads (t, b, l, r)
    (1, 3, 9, 9, 3, 3, 1, 1, 1, 1, (1, 1, 1, 1)),
    (2, 4, 8, 7, 3, 2, 2, 1, 1, 1, (1, 0, 0, 1)),
    (1, 4, 10, 10, 3, 3, 1, 2, 2, 1, (2, 2, 1, 1)),
    (1, 2, 6, 6, 5, 5, 2, 2, 1, 1, (2, 2, 2, 2)),
    (1, 3, 48, 48, 3, 3, 2, 2, 1, 1, (0, 1, 0, 1)),
    (2, 3, 11, 13, 3, 3, 3, 2, 2, 3, (2, 1, 3, 0)),
    (1, 2, 5, 5, 1, 1, 2, 2, 1, 1, (0, 0, 0, 0)),
    (1, 1, 4, 9, 4, 2, 1, 3, 1, 4, (0, 0, 0, 0)),
    (1, 2, 9, 9, 2, 2, 3, 3, 1, 1, (1, 0, 0, 1)),  # stride beyond the window: phases no tap reads
]


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("n,c,h,w,kh,kw,sh,sw,dh,dw,pads", CASES)
def test_columns_are_the_padded_windows(n, c, h, w, kh, kw, sh, sw, dh, dw, pads, compact):
    t, b, l, r = pads
    oh, ow = (h + t + b - (kh - 1) * dh - 1) // sh + 1, (w + l + r - (kw - 1) * dw - 1) // sw + 1
    wide = WideIm2col(Window(n, c, h, w, kh, kw, sh, sw, dh, dw, t, b, l, r, oh, ow), compact)
    assert sorted(wide.order) == list(range(kh * kw))
    x = np.random.default_rng(0).standard_normal((n, c, h, w)).astype(np.float32)
    phases = np.full(wide.phase_shape, np.nan, np.float32)  # whatever the arena held before
    cols = np.full(wide.cols_shape, np.nan, np.float32)
    wide.bind(x, phases, cols, 7.0)()
    assert not np.isnan(cols).any()  # junk columns read filled memory too, never stale bytes
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=7.0)
    for k, tap in enumerate(wide.order):
        i, j = divmod(tap, kw)
        want = xp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
        got = wide.out_view(cols[:, k].reshape(c, -1)).transpose(1, 0, 2, 3)
        np.testing.assert_array_equal(got, want)
    again = np.full(wide.cols_shape, np.nan, np.float32)
    wide.bind(x, phases, again, 7.0)()  # the step is repeatable on the same memory
    np.testing.assert_array_equal(again, cols)
