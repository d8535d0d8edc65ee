"""Step tracing: same results as an untraced run, one event per executed node, Chrome JSON."""
import json

import numpy as np

import isthmus as ism


def test_traced_run_matches_and_exports_chrome_trace(tmp_path):
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 4), name="x")
        with ism.device("/job:cloud/task:0/device:CPU:0"):
            y = ism.nn.Dense(3, activation="relu", name="fc")(x)
        loss = ism.reduce_mean(y * y)
        step = ism.optimizers.SGD(0.1).minimize(loss)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    xv = np.ones((2, 4), np.float32)
    md = ism.RunMetadata()
    traced = sess.run([loss, y], {x: xv}, options=ism.RunOptions(trace=True), run_metadata=md)
    plain = sess.run([loss, y], {x: xv})
    np.testing.assert_array_equal(traced[0], plain[0])
    np.testing.assert_array_equal(traced[1], plain[1])
    plan = sess.plan_for([loss, y], {x: None})
    assert len(md.events) == len(plan.kernels)
    assert any(e.device == "/job:cloud/task:0/device:CPU:0" for e in md.events)
    assert all(e.end_us >= e.start_us for e in md.events)
    md2 = ism.RunMetadata()
    sess.run(step, {x: xv}, options=ism.RunOptions(trace=True), run_metadata=md2)
    assert "ApplyGradientDescent" in md2.by_op()
    path = md.write_chrome_trace(str(tmp_path / "trace.json"))
    data = json.load(open(path))
    names = {e["name"] for e in data["traceEvents"] if e["ph"] == "X"}
    assert any("fc" in n for n in names)
    assert {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M"} >= {"/job:cloud/task:0/device:CPU:0"}
