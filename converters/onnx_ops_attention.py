"""ONNX import of Attention (opsets 23-24) and RotaryEmbedding (opset 23), onto core/ops/attention.py, and Einsum."""
from __future__ import annotations

import isthmus.core as ism

from .onnx_import import OnnxImportError, handler
from .onnx_ops_elementwise import attrs, where


def _opt(ins, i):
    return ins[i] if len(ins) > i else None


@handler("Attention", 23)
def _attention(c, node, ins):
    at = attrs(node)
    supported = {"is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale", "softcap",
                 "softmax_precision", "left_window_size", "right_window_size"}
    unknown = set(at) - supported
    if unknown:
        raise OnnxImportError(f"{where(node)}: unknown attribute(s) {sorted(unknown)}")
    softmax_dtype = None
    if at.get("softmax_precision"):
        from onnx import helper  # deferred: onnx is a heavy or optional dependency
        softmax_dtype = helper.tensor_dtype_to_np_dtype(at["softmax_precision"])
    y, pk, pv, qk = ism.attention(
        ins[0], ins[1], ins[2], _opt(ins, 3), _opt(ins, 4), _opt(ins, 5), _opt(ins, 6),
        scale=at.get("scale"), is_causal=bool(at.get("is_causal", 0)), q_num_heads=at.get("q_num_heads"),
        kv_num_heads=at.get("kv_num_heads"), softcap=float(at.get("softcap", 0.0)), softmax_dtype=softmax_dtype,
        qk_output_mode=int(at.get("qk_matmul_output_mode", 0)), left_window=int(at.get("left_window_size", -1)),
        right_window=int(at.get("right_window_size", -1)))
    return [y, pk, pv, qk]


@handler("RotaryEmbedding", 23)
def _rotary(c, node, ins):
    at = attrs(node)
    return [ism.rotary_embedding(ins[0], ins[1], ins[2], _opt(ins, 3), bool(at.get("interleaved", 0)),
                                 int(at.get("rotary_embedding_dim", 0)), at.get("num_heads"))]


@handler("Einsum", 12)
def _einsum(c, node, ins):
    return [ism.einsum(attrs(node)["equation"], *ins)]
