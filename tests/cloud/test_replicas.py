"""Replica training on in-process tasks over real gRPC (cloud/replicas.py): synchronous
with b = 0 equals one large-batch step of a local Session (dense and sparse gradients),
backup workers drop and count late gradients and hide a straggler, async converges."""
import time

import numpy as np
import pytest

import isthmus as ism
from isthmus import nn
from isthmus.cloud.cluster import ClusterSpec
from isthmus.partitioner.cluster_placement import pin_replica, variable_devices
from isthmus.cloud.replicas import ReplicaTrainer
from isthmus.cloud.server import Server
from isthmus.partitioner.problem import PlacementError

B = 8


@pytest.fixture(scope="module")
def cluster():
    jobs = {"ps": 2, "worker": 3}
    made = {(job, i): Server(None, job, i, port=0, step_timeout=20.0, recv_timeout=10.0)
            for job, n in jobs.items() for i in range(n)}
    spec = ClusterSpec({job: [f"127.0.0.1:{made[(job, i)].port}" for i in range(n)] for job, n in jobs.items()})
    for s in made.values():
        s.set_cluster(spec)
    yield spec
    for s in made.values():
        s.stop()


def model():
    """Dense features plus an embedding lookup (a row-sparse gradient)."""
    x = ism.placeholder("float32", (None, 6), name="x")
    ids = ism.placeholder("int32", (None, 2), name="ids")
    y = ism.placeholder("int32", (None,), name="y")
    emb = nn.Embedding(12, 3, name="emb")(ids)
    feats = ism.concat([x, ism.reshape(emb, (-1, 6))], axis=1)
    h = nn.Dense(10, activation="tanh", name="h")(feats)
    loss = nn.sparse_softmax_cross_entropy(y, nn.Dense(3, name="out")(h))
    return loss, [x, ids, y]


def data(step, replica, n=B):
    rng = np.random.default_rng(1000 * step + replica)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    ids = rng.integers(0, 12, (n, 2)).astype(np.int32)
    y = ((x[:, 0] > 0).astype(np.int32) + (ids[:, 0] % 2)).astype(np.int32)
    return x, ids, y


def local_large_batch(steps, replicas, optimizer):
    """The reference: one process, each step's batch the concatenation of the replicas' shards."""
    g = ism.Graph(seed=0)
    with g.as_default():
        loss, inputs = model()
        train = optimizer().minimize(loss, global_step=ism.optimizers.get_or_create_global_step(g))
        init = ism.global_variables_initializer()
    sess = ism.Session(g)
    sess.run(init)
    for k in range(steps):
        shards = [data(k, r) for r in range(replicas)]
        sess.run(train, {t: np.concatenate([s[i] for s in shards]) for i, t in enumerate(inputs)})
    return {v.node.name: sess.variable_value(v) for v in ism.global_variables(g)}


def ps_values(trainer):
    """Every checkpointed variable, read back from the ps tasks through a fresh chief session."""
    sess = ism.Session(trainer.chief.graph, target="grpc://" + trainer.cluster.address("worker", 0))
    try:
        return {v.node.name: sess.variable_value(v) for v in trainer.checkpointed_variables}
    finally:
        sess.close()


@pytest.mark.parametrize("optimizer", [lambda: ism.optimizers.SGD(0.2), lambda: ism.optimizers.Adam(0.05)],
                         ids=["sgd", "adam"])
def test_sync_without_backup_equals_a_large_batch_step(cluster, optimizer):
    steps = 4
    t = ReplicaTrainer(model, optimizer, data, cluster, mode="sync", replicas=2, step_timeout=20.0)
    stats = t.train(steps)
    assert stats.steps == steps and stats.accepted == 2 * steps and stats.dropped == 0
    got, want = ps_values(t), local_large_batch(steps, 2, optimizer)
    assert set(want) <= set(got)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=2e-5, atol=2e-6, err_msg=name)
    # the embedding's sparse update touched only the rows the batches looked up
    used = {int(i) for k in range(steps) for r in range(2) for i in data(k, r)[1].ravel()}
    init = ism.Graph(seed=0)
    with init.as_default():
        model()
    table0 = ism.Session(init)
    table0.run(ism.global_variables_initializer(init))
    e0 = table0.variable_value(init.node("emb/embeddings"))
    untouched = sorted(set(range(12)) - used)
    np.testing.assert_array_equal(got["emb/embeddings"][untouched], e0[untouched])
    # variables (and their optimizer state) went to the ps tasks, spread over both
    devs = set(t.var_devices.values())
    assert devs == {"/job:ps/task:0/device:CPU:0", "/job:ps/task:1/device:CPU:0"}


def test_backup_workers_drop_and_count_late_gradients(cluster, caplog):
    steps = 6
    t = ReplicaTrainer(model, lambda: ism.optimizers.SGD(0.2), data, cluster, mode="sync", replicas=2, backup=1,
                       step_timeout=20.0)
    with caplog.at_level("INFO", logger="isthmus.replicas"):
        stats = t.train(steps)
    assert stats.steps == steps and stats.accepted == 2 * steps
    # every gradient a replica handed in was taken or dropped; with 3 replicas and 2 needed, some dropped
    assert stats.submitted == stats.accepted + stats.dropped
    assert stats.dropped >= 1
    logged = [r for r in caplog.records if "dropped the gradient of replica" in r.getMessage()]
    assert len(logged) == stats.dropped
    assert int(ps_values(t)["global_step"]) == steps


def test_a_straggler_does_not_slow_steps_with_a_backup_worker(cluster):
    delay = 0.6

    def slow_data(step, replica):
        if replica == 2:
            time.sleep(delay)      # replica 2 is a straggler on every step
        return data(step, replica)
    with_backup = ReplicaTrainer(model, lambda: ism.optimizers.SGD(0.2), slow_data, cluster, mode="sync",
                                 replicas=2, backup=1, step_timeout=20.0).train(4)
    assert with_backup.dropped >= 1   # the straggler's gradients, always late or stale

    def slow_pair(step, replica):
        return slow_data(step, 2 if replica == 1 else replica)
    without = ReplicaTrainer(model, lambda: ism.optimizers.SGD(0.2), slow_pair, cluster, mode="sync",
                             replicas=2, backup=0, step_timeout=20.0).train(2)
    slow, fast = float(np.median(without.step_times)), float(np.median(with_backup.step_times))
    assert slow >= delay * 0.9
    # without the backup every step waits for the straggler; with it, steps take what the others take
    # (a relative bound: it holds on a loaded machine, as long as a step takes less than `delay`)
    assert fast < 0.5 * slow, (fast, slow)


def test_async_replicas_converge(cluster):
    steps = 60
    t = ReplicaTrainer(model, lambda: ism.optimizers.Adam(0.05), data, cluster, mode="async", replicas=3,
                       step_timeout=20.0)
    stats = t.train(steps)
    assert int(ps_values(t)["global_step"]) == steps == stats.steps
    assert stats.accepted == steps and stats.dropped == 0
    first = np.mean([stats.losses[k] for k in range(9)])
    last = np.mean([stats.losses[k] for k in range(steps - 9, steps)])
    assert last < 0.6 * first, (first, last)


def test_pin_replica_shares_variables_and_pins_compute(cluster):
    g = ism.Graph(seed=0)
    with g.as_default():
        loss, _ = model()
        ism.optimizers.Momentum(0.1).minimize(loss)
    devs = variable_devices(g, cluster)
    pin_replica(g, "/job:worker/task:2/device:CPU:0", devs)
    for n in g.nodes:
        if n.op == "Variable":
            assert n.device == devs[n.name]
        elif n.op == "MatMul":
            assert n.device == "/job:worker/task:2/device:CPU:0"
    g2 = ism.Graph(seed=0)
    with g2.as_default():
        model()
    with pytest.raises(PlacementError, match="h/kernel"):
        pin_replica(g2, "/job:worker/task:0", {k: v for k, v in devs.items() if k != "h/kernel"})


def test_bad_arguments_are_refused(cluster):
    opt = lambda: ism.optimizers.SGD(0.1)  # noqa: E731
    with pytest.raises(ValueError, match="backup"):
        ReplicaTrainer(model, opt, data, cluster, mode="async", backup=1)
    with pytest.raises(ValueError, match="mode"):
        ReplicaTrainer(model, opt, data, cluster, mode="hogwild")
    with pytest.raises(ValueError, match="checkpoint_dir"):
        ReplicaTrainer(model, opt, data, cluster, checkpoint_every=5)
    t = ReplicaTrainer(model, opt, lambda k, r: data(k, r)[:2], cluster, replicas=1)
    with pytest.raises(ValueError, match="gave 2 values for 3 inputs"):
        t.train(1)


def test_constants_and_update_groups_run_where_they_are_used():
    """An optimizer's constants and the variables' initial values go to the ps with their
    consumers, and the NoOp grouping the ps updates runs on the ps: fewer transfers per step."""
    from isthmus.partitioner.cluster_placement import place_on_cluster
    from isthmus.partitioner.partition import partition
    g = ism.Graph(seed=0)
    with g.as_default():
        loss, _ = model()
        train = ism.optimizers.Adam(0.01).minimize(loss)
        init = ism.global_variables_initializer()
    spec = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]})
    p = place_on_cluster(g, spec)
    ps, w = "/job:ps/task:0/device:CPU:0", "/job:worker/task:0/device:CPU:0"
    assert p[train.name] == ps and p["h/kernel"] == ps and p["MatMul"] == w
    applies = [n for n in g.nodes if n.op == "ApplyAdam"]
    assert applies and all(p[t.node.name] == ps for n in applies for t in n.inputs if t.node.op == "Const")

    def recvs(outs):
        part = partition(g, p, outs)
        return [n for pt in part.parts.values() for n in pt.graph.nodes if n.op == "Recv"]
    assert recvs([init]) == []                        # initial values no longer travel to the ps
    crossing = {n.name for n in recvs([loss.node, train])}
    assert not any("Const" in c or "learning_rate" in c for c in crossing), crossing
