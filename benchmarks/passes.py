"""Graph passes: node counts before/after and inference latency with passes on and off, for the
core CNN and a MobileNetV2-style network at 96x96, batch 1 (weights frozen into constants).
Target (control-flow/passes issue): >= 1.3x faster with passes on for the MobileNet-style net.
"""
from __future__ import annotations

import os

import numpy as np

import isthmus as ism
from cnn import build_isthmus as build_cnn, init as cnn_init
from models import mobilenet_v2
from timing import emit, interleaved_medians


def measure(graph, x, out, xv, repeats=31):
    sess = ism.Session(graph)
    sess.run(ism.global_variables_initializer(graph))
    frozen = ism.freeze(sess, [out])
    on, off = ism.Session(frozen), ism.Session(frozen, optimize=False)
    name, xn = out.name, x.name
    a, b = on.run(name, {xn: xv}), off.run(name, {xn: xv})
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    n_on = len([n for n in on.plan_for(name, {xn: None}).nodes if n.op != "Const"])
    n_off = len([n for n in off.plan_for(name, {xn: None}).nodes if n.op != "Const"])
    t = interleaved_medians({"on": lambda: on.run(name, {xn: xv}), "off": lambda: off.run(name, {xn: xv})},
                            repeats=repeats)
    t_on, t_off = t["on"], t["off"]
    return {"nodes_passes_off": n_off, "nodes_passes_on": n_on, "ms_passes_off": round(t_off * 1e3, 3),
            "ms_passes_on": round(t_on * 1e3, 3), "speedup": round(t_off / t_on, 3)}


def main():
    g, x, logits = mobilenet_v2()
    mob = measure(g, x, logits, np.random.default_rng(0).standard_normal((1, 3, 96, 96)).astype(np.float32))
    cnn_sess, cx, _, _, _ = build_cnn(cnn_init(), batch=1)
    cg = cnn_sess.graph
    clogits = [n for n in cg.nodes if n.op == "BiasAdd"][-1].outputs[0]
    cnn = measure(cg, cx, clogits, np.random.default_rng(1).standard_normal((1, 1, 28, 28)).astype(np.float32))
    emit("passes", {"mobilenet_v2_96_batch1": mob, "cnn_batch1": cnn, "target_mobilenet_speedup": 1.3,
                    "pass": mob["speedup"] >= 1.3, "load_avg": os.getloadavg()[0]})


if __name__ == "__main__":
    main()
