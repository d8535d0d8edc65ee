"""ONNX import of the ai.onnx.preview.training optimizer steps (Adagrad, Adam, Momentum) and two
ai.onnx.ml ops (Binarizer, ArrayFeatureExtractor), as elementwise core ops. An optimizer node
updates n tensors at once: inputs R, T, then n of each of X, G and the state (H; V, H; V); outputs
the n new X, then the n new of each state."""
from __future__ import annotations

import numpy as np

import isthmus.core as ism

from .onnx_import import _attrs, _s, handler, refuse_unless

TRAINING, ML = "ai.onnx.preview.training.", "ai.onnx.ml."


def _groups(ins, states: int):
    """(R, T, [(X, G, state...) per tensor]) from an optimizer node's inputs."""
    refuse_unless(len(ins) >= 2 + 2 + states and (len(ins) - 2) % (2 + states) == 0,
                  f"{len(ins)} inputs do not make R, T and n tuples of X, G and {states} state tensor(s)")
    n = (len(ins) - 2) // (2 + states)
    rest = ins[2:]
    return ins[0], ins[1], [tuple(rest[k * n + i] for k in range(2 + states)) for i in range(n)]


def _float(v, like):
    return ism.cast(v, like.dtype) if v.dtype != like.dtype else v


@handler(TRAINING + "Adagrad", 1, attrs=("decay_factor", "epsilon", "norm_coefficient"))
def _adagrad(c, node, ins):
    at = _attrs(node)
    decay, eps, norm = (float(at.get(k, d)) for k, d in (("decay_factor", 0.0), ("epsilon", 0.0),
                                                          ("norm_coefficient", 0.0)))
    r, t, groups = _groups(ins, 1)
    xs, hs = [], []
    for x, g, h in groups:
        rate = ism.div(_float(r, x), ism.add(ism.mul(_float(t, x), decay), 1.0))
        gr = ism.add(ism.mul(x, norm), g)
        h_new = ism.add(h, ism.square(gr))
        xs.append(ism.sub(x, ism.div(ism.mul(rate, gr), ism.add(ism.sqrt(h_new), eps))))
        hs.append(h_new)
    return xs + hs


@handler(TRAINING + "Momentum", 1, attrs=("alpha", "beta", "mode", "norm_coefficient"))
def _momentum(c, node, ins):
    at = _attrs(node)
    alpha, beta, norm = float(at["alpha"]), float(at["beta"]), float(at["norm_coefficient"])
    mode = _s(at.get("mode", "standard"))
    refuse_unless(mode in ("standard", "nesterov"), f"mode '{mode}' is not standard or nesterov")
    r, t, groups = _groups(ins, 1)
    xs, vs = [], []
    for x, g, v in groups:
        gr = ism.add(ism.mul(x, norm), g)
        b = ism.where(ism.greater(t, ism.zeros_like(t)), ism.constant(np.array(beta, x.dtype)),
                      ism.constant(np.array(1.0, x.dtype)))
        v_new = ism.add(ism.mul(v, alpha), ism.mul(b, gr))
        step = v_new if mode == "standard" else ism.add(gr, ism.mul(v_new, alpha))
        xs.append(ism.sub(x, ism.mul(_float(r, x), step)))
        vs.append(v_new)
    return xs + vs


@handler(TRAINING + "Adam", 1, attrs=("alpha", "beta", "epsilon", "norm_coefficient", "norm_coefficient_post"))
def _adam(c, node, ins):
    at = _attrs(node)
    alpha, beta = float(at.get("alpha", 0.9)), float(at.get("beta", 0.999))
    eps, norm, post = float(at.get("epsilon", 0.0)), float(at.get("norm_coefficient", 0.0)), \
        float(at.get("norm_coefficient_post", 0.0))
    r, t, groups = _groups(ins, 2)
    xs, vs, hs = [], [], []
    for x, g, v, h in groups:
        gr = ism.add(ism.mul(x, norm), g)
        v_new = ism.add(ism.mul(v, alpha), ism.mul(gr, 1 - alpha))
        h_new = ism.add(ism.mul(h, beta), ism.mul(ism.square(gr), 1 - beta))
        tf, rf = ism.maximum(_float(t, x), 1.0), _float(r, x)  # T >= 1 in the branch where() keeps
        # bias correction from the first step on: R sqrt(1 - beta^T) / (1 - alpha^T); at T = 0, R
        corrected = ism.div(ism.mul(rf, ism.sqrt(ism.sub(1.0, ism.pow(ism.constant(np.array(beta, x.dtype)), tf)))),
                            ism.sub(1.0, ism.pow(ism.constant(np.array(alpha, x.dtype)), tf)))
        rate = ism.where(ism.greater(t, ism.zeros_like(t)), corrected, rf)
        x_new = ism.sub(x, ism.mul(rate, ism.div(v_new, ism.add(ism.sqrt(h_new), eps))))
        xs.append(ism.mul(x_new, 1 - post))
        vs.append(v_new)
        hs.append(h_new)
    return xs + vs + hs


@handler(ML + "Binarizer", 1, attrs=("threshold",))
def _binarizer(c, node, ins):
    x = ins[0]
    thr = float(_attrs(node).get("threshold", 0.0))
    return [ism.cast(ism.greater(x, ism.constant(np.array(thr, x.dtype))), x.dtype)]


@handler(ML + "ArrayFeatureExtractor", 1, attrs=())
def _array_feature_extractor(c, node, ins):
    """The last axis's entries at the (flattened) indices; a 1-D input gives a (1, k) result."""
    x, idx = ins
    picked = ism.gather(x, ism.reshape(ism.cast(idx, np.int64), (-1,)), len(x.shape) - 1)
    return [ism.reshape(picked, (1, -1)) if len(x.shape) == 1 else picked]
