"""The master and DistributedSession in process (no network): placement, partition, steps,
failures, a growing graph, concurrent steps; results equal a local Session's bit for bit."""
import threading

import numpy as np
import pytest

import isthmus as ism
from isthmus import nn
from isthmus.cloud.cluster import ClusterSpec
from isthmus.cloud.master import Master
from isthmus.partitioner.cluster_placement import place_on_cluster
from isthmus.cloud.session import DistributedSession
from isthmus.cloud.worker import Worker
from isthmus.core.errors import ExecutionError, FeedError
from isthmus.partitioner.problem import PlacementError

PS0, PS1 = "/job:ps/task:0/device:CPU:0", "/job:ps/task:1/device:CPU:0"
W0, W1 = "/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"


def in_process(jobs=None, wire=True):
    cluster = ClusterSpec(jobs or {"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})
    workers = {}

    def by_device(d):
        return workers[cluster.task_of(d).name]
    for t, _ in cluster.tasks():
        workers[t.name] = Worker(t.name, peers=by_device, wire=wire, recv_timeout=10.0)
    return Master(cluster, by_device, step_timeout=20.0), workers


def mlp(optimizer=lambda: ism.optimizers.Adam(2e-3)):
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 64), name="images")
        y = ism.placeholder("int32", (None,), name="labels")
        net = nn.Sequential([nn.Dense(32, activation="relu", name="fc1"),
                             nn.Dense(16, activation="relu", name="fc2"), nn.Dense(10, name="logits")])
        logits = net(x, training=True)
        loss = nn.sparse_softmax_cross_entropy(y, logits)
        train = optimizer().minimize(loss)
        init = ism.global_variables_initializer()
    return g, dict(x=x, y=y, loss=loss, train=train, init=init)


def batches(n=6, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.random((8, 64), dtype=np.float32), rng.integers(0, 10, 8).astype(np.int32)) for _ in range(n)]


def train(sess, t, data):
    sess.run(t["init"])
    return [sess.run([t["loss"], t["train"]], {t["x"]: xb, t["y"]: yb})[0] for xb, yb in data]


def test_training_equals_local_session_bit_for_bit():
    master, workers = in_process()
    data = batches()
    g, t = mlp()
    want = train(ism.Session(g), t, data)
    g, t = mlp()
    with DistributedSession(g, master=master) as s:
        got = train(s, t, data)
        w = g.node("fc1/kernel")
        assert np.asarray(s.run(w.outputs[0])).shape == (64, 32)
    assert [np.asarray(v).tobytes() for v in got] == [np.asarray(v).tobytes() for v in want]
    # variables went to the ps tasks (both used), compute to worker 0; nothing pending anywhere
    ms = next(iter(master._sessions.values()), None)
    assert ms is None  # closed
    st = {name: w.status() for name, w in workers.items()}
    assert st["/job:ps/task:0"]["steps_run"] > 0 and st["/job:ps/task:1"]["steps_run"] > 0
    assert st["/job:worker/task:1"]["steps_run"] == 0
    assert all(s["pending_tensors"] == 0 and s["handles"] == [] for s in st.values())


def test_placement_rules():
    g, t = mlp()
    with g.as_default(), ism.device("/job:worker/task:1"):
        pinned = ism.identity(t["loss"], name="pinned")
    c = ClusterSpec({"ps": ["h:1", "h:2"], "worker": ["h:3", "h:4"]})
    p = place_on_cluster(g, c)
    variables = [n for n in g.nodes if n.op == "Variable"]
    assert {p[v.name] for v in variables} == {PS0, PS1}
    for n in g.nodes:  # updates share their variable's device
        for k in n.opdef.ref_inputs:
            assert p[n.name] == p[n.inputs[k].node.name]
    assert p["pinned"] == W1 and p[t["loss"].node.name] == W0
    # without ps tasks everything runs on the default worker
    assert set(place_on_cluster(g, ClusterSpec({"worker": ["h:3", "h:4"]})).values()) == {W0, W1}
    with g.as_default(), ism.device("/job:chief"):
        ism.identity(t["loss"], name="nowhere")
    with pytest.raises(PlacementError, match="'nowhere'.*no job 'chief'"):
        place_on_cluster(g, c)


def test_variable_pinned_apart_from_its_update_is_refused():
    g = ism.Graph()
    with g.as_default():
        with ism.device("/job:ps/task:0"):
            v = ism.Variable(np.zeros(2, np.float32), name="v")
        with ism.device("/job:ps/task:1"):
            v.assign_add(np.ones(2, np.float32), name="bump")
    with pytest.raises(PlacementError, match="pinned apart"):
        place_on_cluster(g, ClusterSpec({"ps": ["h:1", "h:2"], "worker": ["h:3"]}))


def test_failing_op_aborts_the_step_and_names_the_node():
    master, workers = in_process()
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (None,), name="x")
        with ism.device("/job:worker/task:1"):
            r = ism.reshape(x * 2.0, (2, 2), name="needs_four")
        with ism.device("/job:worker/task:0"):
            out = ism.reduce_sum(r + 1.0, name="out")
    s = DistributedSession(g, master=master)
    assert float(s.run(out, {x: np.ones(4, np.float32)})) == 12.0
    with pytest.raises(ExecutionError, match="node 'needs_four' \\(Reshape\\)") as ei:
        s.run(out, {x: np.ones(3, np.float32)})
    assert ei.value.node_name == "needs_four"
    assert all(w.status()["pending_tensors"] == 0 for w in workers.values())
    assert float(s.run(out, {"x:0": np.ones(4, np.float32)})) == 12.0  # the session is still usable
    with pytest.raises(FeedError, match="placeholders only"):
        s.run(out, {r: np.ones((2, 2), np.float32)})
    s.close()


def test_growing_graph_keeps_variable_values_and_fetch_structures():
    master, _ = in_process()
    g = ism.Graph()
    with g.as_default():
        v = ism.Variable(np.arange(3, dtype=np.float32), name="v")
        init = ism.global_variables_initializer()
    s = DistributedSession(g, master=master)
    s.run(init)
    with g.as_default():
        bump = v.assign_add(np.ones(3, np.float32), name="bump")
        doubled = ism.identity(v * 2.0, name="doubled")
    s.run(bump)
    got = s.run({"a": [doubled, "v"], "b": ("v:0",), "op": bump, "node": g.node("bump")})
    assert got["a"][0].tolist() == [4.0, 6.0, 8.0] and got["a"][1].tolist() == [2.0, 3.0, 4.0]
    assert got["b"][0].tolist() == [2.0, 3.0, 4.0] and got["op"].tolist() == [2.0, 3.0, 4.0]
    assert got["node"] is None  # as a local Session answers
    s.close()


def test_concurrent_steps_of_one_session():
    master, _ = in_process()
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (None,), name="x")
        with ism.device("/job:worker/task:1"):
            h = ism.tanh(x, name="h")
        with ism.device("/job:worker/task:0"):
            y = ism.reduce_sum(h * h, name="y")
    s = DistributedSession(g, master=master)
    errors, results = [], {}

    def go(i):
        try:
            xv = np.full(5, i / 10, np.float32)
            for _ in range(10):
                results[i] = s.run(y, {x: xv})
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=go, args=(i,)) for i in range(6)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert not errors
    local = ism.Session(g)
    for i, v in results.items():
        assert np.asarray(v).tobytes() == np.asarray(local.run(y, {x: np.full(5, i / 10, np.float32)})).tobytes()


def test_control_flow_runs_distributed():
    master, _ = in_process({"worker": ["127.0.0.1:3", "127.0.0.1:4"]})
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, (3,), name="x")
        with ism.device("/job:worker/task:1"):
            total = ism.while_loop(lambda i, a: i < 5, lambda i, a: (i + 1, a * 1.5 + x),
                                   (ism.constant(0), ism.zeros((3,))))[1]
        pos = ism.cond(ism.reduce_sum(total) > 0.0, lambda: total * 2.0, lambda: -total)
    xv = np.array([1.0, -2.0, 0.5], np.float32)
    want = ism.Session(g).run(pos, {x: xv})
    with DistributedSession(g, master=master) as s:
        assert np.asarray(s.run(pos, {x: xv})).tobytes() == np.asarray(want).tobytes()


@pytest.mark.cpu  # bit for bit against a CPU session
def test_lstm_training_with_variables_on_ps_equals_local():
    def build():
        g = ism.Graph(seed=3)
        with g.as_default():
            x = ism.placeholder(ism.float32, (None, None, 3), name="x")
            lengths = ism.placeholder(ism.int32, (None,), name="len")
            outs, state = ism.rnn.dynamic_rnn(ism.rnn.LSTMCell(4), x, sequence_length=lengths)
            loss = ism.reduce_sum(outs * outs) + ism.reduce_sum(state[0])
            train = ism.optimizers.SGD(0.05).minimize(loss)
            init = ism.global_variables_initializer()
        return g, x, lengths, loss, train, init
    rng = np.random.default_rng(2)
    feeds = [(rng.standard_normal((2, 5, 3)).astype(np.float32), np.array([5, 3], np.int32)) for _ in range(3)]
    runs = []
    for kind in ("local", "distributed"):
        g, x, lengths, loss, train_op, init = build()
        s = ism.Session(g) if kind == "local" else DistributedSession(g, master=in_process()[0])
        s.run(init)
        runs.append([s.run([loss, train_op], {x: xv, lengths: lv})[0] for xv, lv in feeds])
        if kind == "distributed":
            plan = next(iter(s.master._sessions.values())).placement
            assert {plan[v.node.name] for v in ism.global_variables(g)} <= {PS0, PS1}
    assert [np.asarray(v).tobytes() for v in runs[0]] == [np.asarray(v).tobytes() for v in runs[1]]
