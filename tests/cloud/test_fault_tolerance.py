"""Fault tolerance on a LocalCluster of subprocess tasks: SIGKILL a ps or a worker in the
middle of synchronous training; the trainer names the lost task within a bounded time,
restarts it, restores the latest valid checkpoint and finishes with the variables of an
uninterrupted run (same data order), bit for bit."""
import time

import numpy as np
import pytest

import isthmus as ism
from isthmus import nn
from isthmus.cloud.fault import TaskFailure, failed_tasks
from isthmus.cloud.local_cluster import LocalCluster
from isthmus.cloud.replicas import ReplicaTrainer

STEPS, EVERY = 8, 3
DETECT_BOUND_S = 15.0


@pytest.fixture(scope="module")
def lc():
    with LocalCluster({"ps": 1, "worker": 2}, recv_timeout=10.0) as c:
        yield c


def model():
    x = ism.placeholder("float32", (None, 5), name="x")
    y = ism.placeholder("int32", (None,), name="y")
    h = nn.Dense(8, activation="relu", name="h")(x)
    return nn.sparse_softmax_cross_entropy(y, nn.Dense(3, name="out")(h)), [x, y]


def data(step, replica):
    rng = np.random.default_rng(100 * step + replica)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 1).astype(np.int32)


def optimizer():
    return ism.optimizers.Momentum(0.1, 0.9)


def final_values(trainer):
    sess = ism.Session(trainer.chief.graph, target="grpc://" + trainer.cluster.address("worker", 0))
    try:
        return {v.node.name: sess.variable_value(v) for v in trainer.checkpointed_variables}
    finally:
        sess.close()


def killing_data(lc, job, index, at_step, log, corrupt_dir=None):
    """The data, and a kill of the task just before a replica computes step `at_step` (replica
    1 kills its own worker, so that step cannot complete before the loss is seen). With
    `corrupt_dir`, a byte of the newest checkpoint there flips too (a torn disk)."""
    def batch(step, replica):
        if step == at_step and replica == (index if job == "worker" else 0) and not log:
            lc.kill(job, index)
            log.append(time.monotonic())
            if corrupt_dir is not None:
                path = ism.checkpoint.latest_checkpoint(corrupt_dir)
                raw = bytearray(open(path, "rb").read())
                raw[len(raw) // 2] ^= 0xFF
                open(path, "wb").write(bytes(raw))
        return data(step, replica)
    return batch


@pytest.fixture(scope="module")
def uninterrupted(lc, tmp_path_factory):
    t = ReplicaTrainer(model, optimizer, data, lc.cluster, replicas=2, step_timeout=20.0,
                       checkpoint_dir=str(tmp_path_factory.mktemp("ref")), checkpoint_every=EVERY)
    stats = t.train(STEPS)
    assert [s for s, _ in stats.restored] == [0] and len(stats.checkpoints) == STEPS // EVERY
    return final_values(t)


_RNG = np.random.default_rng(5)   # the step of each kill: random, and the same on every run


@pytest.mark.parametrize("job,index,at_step,corrupt", [("ps", 0, int(_RNG.integers(1, STEPS)), False),
                                                       ("worker", 1, int(_RNG.integers(EVERY, STEPS)), True)])
def test_killed_task_is_restarted_and_training_ends_as_uninterrupted(lc, uninterrupted, tmp_path, job, index,
                                                                      at_step, corrupt):
    killed = []
    batch = killing_data(lc, job, index, at_step, killed, str(tmp_path) if corrupt else None)
    t = ReplicaTrainer(model, optimizer, batch, lc.cluster, replicas=2,
                       step_timeout=20.0, checkpoint_dir=str(tmp_path), checkpoint_every=EVERY, restart=lc.restart)
    stats = t.train(STEPS)
    assert killed and stats.restarts == [f"/job:{job}/task:{index}"]
    assert lc.alive(job, index)
    (seen, message), = stats.failures
    assert seen - killed[0] < DETECT_BOUND_S
    assert f"/job:{job}/task:{index} at {lc.address(job, index)}" in message
    # resumed from the newest valid checkpoint before the kill (the one before it when the newest
    # was corrupted), and redid the steps after it once
    assert stats.restored[-1][0] == (at_step // EVERY) * EVERY - (EVERY if corrupt else 0)
    assert stats.steps == STEPS and stats.dropped == 0
    got = final_values(t)
    assert int(got["global_step"]) == STEPS
    for name, want in uninterrupted.items():
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_without_a_restart_the_lost_task_is_named_within_a_bounded_time(lc, tmp_path):
    killed = []
    t = ReplicaTrainer(model, optimizer, killing_data(lc, "ps", 0, 2, killed), lc.cluster, replicas=2,
                       step_timeout=20.0, checkpoint_dir=str(tmp_path), checkpoint_every=EVERY)
    try:
        with pytest.raises(TaskFailure, match=r"/job:ps/task:0 at 127\.0\.0\.1:\d+ stopped answering") as e:
            t.train(STEPS)
        assert time.monotonic() - killed[0] < DETECT_BOUND_S
        assert [str(x) for x in e.value.tasks] == ["/job:ps/task:0"]
        assert [str(x) for x in failed_tasks(lc.cluster)] == ["/job:ps/task:0"]
    finally:
        lc.restart("ps", 0)
    assert failed_tasks(lc.cluster) == []
