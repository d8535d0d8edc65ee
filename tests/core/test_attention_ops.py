"""attention (core/ops/attention.py) against the onnx package's reference implementation of Attention
(an independent numpy implementation), and its gradient (through the composite) against finite differences."""
import numpy as np
import pytest
from onnx.reference.ops.op_attention import _compute_attention

import isthmus as ism

from .opcheck import check_gradients, run_op

rng = np.random.default_rng(9)
Q4 = rng.standard_normal((2, 4, 3, 8)).astype(np.float32)
K4 = rng.standard_normal((2, 2, 5, 8)).astype(np.float32)
V4 = rng.standard_normal((2, 2, 5, 6)).astype(np.float32)
MASK_F = rng.standard_normal((3, 4)).astype(np.float32)  # shorter than the 5 keys: the rest is masked


def _ref(q, k, v, **kw):
    return _compute_attention(q, k, v, **kw)


CASES = [  # name, isthmus keywords, reference keywords, extra inputs
    ("gqa", {}, {}),
    ("causal", {"is_causal": True}, {"is_causal": True}),
    ("scaled_softcap", {"scale": 0.3, "softcap": 2.0}, {"scale": 0.3, "softcap": 2.0}),
    ("bool_mask", {"mask": np.tril(np.ones((3, 5), bool), 1)}, {"attn_mask": np.tril(np.ones((3, 5), bool), 1)}),
    ("float_mask_short", {"mask": MASK_F}, {"attn_mask": MASK_F}),
    ("window", {"left_window": 1, "right_window": 0}, {"left_window_size": 1, "right_window_size": 0}),
    ("probs_output", {"qk_output_mode": 3, "is_causal": True}, {"qk_matmul_output_mode": 3, "is_causal": True}),
]


@pytest.mark.parametrize("name,kw,ref_kw", CASES, ids=[c[0] for c in CASES])
def test_attention_matches_the_onnx_reference(name, kw, ref_kw):
    got, _ = run_op(lambda q, k, v: list(ism.attention(q, k, v, **kw)), [Q4, K4, V4])
    want = _ref(Q4, K4, V4, **ref_kw)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


def test_three_d_inputs_and_a_cache():
    q = rng.standard_normal((2, 3, 16)).astype(np.float32)   # 4 heads of 4
    k = rng.standard_normal((2, 2, 8)).astype(np.float32)    # 2 kv heads of 4
    v = rng.standard_normal((2, 2, 8)).astype(np.float32)
    pk = rng.standard_normal((2, 2, 4, 4)).astype(np.float32)
    pv = rng.standard_normal((2, 2, 4, 4)).astype(np.float32)
    got, _ = run_op(lambda *t: list(ism.attention(t[0], t[1], t[2], past_key=t[3], past_value=t[4], is_causal=True,
                                                  q_num_heads=4, kv_num_heads=2)), [q, k, v, pk, pv])
    want = _ref(q, k, v, past_key=pk, past_value=pv, is_causal=True, q_num_heads=4, kv_num_heads=2)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


def test_a_fully_masked_row_gives_zeros_and_a_finite_gradient():
    mask = np.ones((3, 5), bool)
    mask[1] = False
    got, _ = run_op(lambda q, k, v: ism.attention(q, k, v, mask=mask)[0], [Q4, K4, V4])
    assert np.all(got[0][:, :, 1] == 0) and np.all(np.isfinite(got[0]))
    check_gradients(lambda q, k, v: ism.attention(q, k, v, mask=mask)[0],
                    [Q4[:1, :2, :, :3].astype(np.float64), K4[:1, :1, :, :3].astype(np.float64),
                     V4[:1, :1, :, :2].astype(np.float64)])


def test_gradient_causal_with_softcap():
    check_gradients(lambda q, k, v: ism.attention(q, k, v, is_causal=True, softcap=3.0)[0],
                    [Q4[:1, :2, :, :3].astype(np.float64), K4[:1, :2, :4, :3].astype(np.float64),
                     V4[:1, :2, :4, :2].astype(np.float64)])


@pytest.mark.parametrize("interleaved,rotary_dim", [(False, 0), (True, 0), (False, 4), (True, 4)])
def test_rotary_embedding_matches_the_onnx_reference(interleaved, rotary_dim):
    from onnx.reference.ops.op_rotary_embedding import rotary_embedding as ref
    x = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    rd = rotary_dim or 8
    cos, sin = rng.standard_normal((10, rd // 2)).astype(np.float32), rng.standard_normal((10, rd // 2)).astype(np.float32)
    pos = np.array([[0, 2, 4, 6, 8], [1, 1, 2, 3, 5]])
    got, _ = run_op(lambda t, c, s: ism.rotary_embedding(t, c, s, ism.constant(pos), interleaved, rotary_dim), [x, cos, sin])
    np.testing.assert_allclose(got[0], ref(x, cos, sin, pos, interleaved=interleaved, rotary_embedding_dim=rotary_dim),
                               rtol=1e-5, atol=1e-6)
    x3 = x.transpose(0, 2, 1, 3).reshape(2, 5, 24)
    got3, _ = run_op(lambda t, c, s: ism.rotary_embedding(t, c, s, ism.constant(pos), interleaved, rotary_dim, 3),
                     [x3, cos, sin])
    np.testing.assert_allclose(got3[0], ref(x3, cos, sin, pos, interleaved=interleaved, rotary_embedding_dim=rotary_dim,
                                            num_heads=3), rtol=1e-5, atol=1e-6)


def test_rotary_embedding_gradient():
    pos = np.array([[0, 2, 1]])
    check_gradients(lambda t, c, s: ism.rotary_embedding(t, c, s, ism.constant(pos), True),
                    [rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((3, 2)), rng.standard_normal((3, 2))])
