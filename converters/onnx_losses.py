"""ONNX import of the loss ops as compositions of core ops: NegativeLogLikelihoodLoss and
SoftmaxCrossEntropyLoss (class axis 1, optional per-class weights, ignore_index, none/sum/mean)."""
from __future__ import annotations

import numpy as np

import isthmus.core as ism

from .onnx_import import ImportError_, _attrs, _s, handler


def _nll(x, target, weight, ignore_index, reduction: str):
    """-x[n, target[n, ...], ...] * weight[target], with ignored targets weighing 0."""
    if reduction not in ("none", "sum", "mean"):
        raise ImportError_(f"reduction '{reduction}' is not supported (none, sum, mean are)")
    if len(x.shape) < 2 or len(target.shape) != len(x.shape) - 1:
        raise ImportError_(f"input of rank {len(x.shape)} needs a target of rank {len(x.shape) - 1}, "
                           f"got {len(target.shape)}")
    t = ism.cast(target, np.int64) if target.dtype != np.int64 else target
    keep = None
    if ignore_index is not None:
        keep = ism.not_equal(t, ism.constant(np.array(ignore_index, np.int64)))
        t = ism.where(keep, t, ism.zeros_like(t))
    picked = ism.squeeze(ism.gather_elements(x, ism.expand_dims(t, 1), 1), (1,))
    w = ism.gather(weight, t) if weight is not None else None
    if keep is not None:
        zero = ism.zeros_like(picked)
        w = ism.where(keep, w if w is not None else ism.ones_like(picked), zero)
    loss = ism.neg(picked if w is None else ism.mul(picked, w))
    if reduction == "none":
        return loss
    total = ism.reduce_sum(loss)
    if reduction == "sum":
        return total
    if w is None:
        return ism.reduce_mean(loss)
    return ism.div(total, ism.reduce_sum(w))


@handler("NegativeLogLikelihoodLoss", 12, attrs=("ignore_index", "reduction"))
def _nll_loss(c, node, ins):
    at = _attrs(node)
    weight = ins[2] if len(ins) > 2 else None
    return [_nll(ins[0], ins[1], weight, at.get("ignore_index"), _s(at.get("reduction", "mean")))]


@handler("SoftmaxCrossEntropyLoss", 12, attrs=("ignore_index", "reduction"))
def _sce_loss(c, node, ins):
    at = _attrs(node)
    log_prob = ism.log_softmax(ins[0], 1)
    weight = ins[2] if len(ins) > 2 else None
    loss = _nll(log_prob, ins[1], weight, at.get("ignore_index"), _s(at.get("reduction", "mean")))
    return [loss, log_prob]
