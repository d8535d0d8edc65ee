"""Data-parallel replicas on several GPUs of one host (core/data_parallel.py, core/collective.py).

In CI on 2 and 3 stand-in GPUs (each with its own array module, meter and cap, arrays that refuse
to meet another GPU's without a copy or the communicator); under `pytest -m gpu` on real GPUs with
NCCL (one GPU: a one-rank NCCL communicator; two where the machine has them).
"""
import gc

import numpy as np
import pytest

import isthmus as ism
from isthmus.core import gpu
from isthmus.core.collective import (AllReduceGroup, CollectiveTimeout, SimulatedCommunicator, SingleRank,
                                     all_reduce)
from isthmus.core.data_parallel import DataParallel, ReplicaStepError, make_communicator
from isthmus.core.simgpu import DeviceMixError, SimArray, sim_xp

D, H, C = 6, 8, 3
LR, MOM = 0.3, 0.9


def _init(seed=0):
    rng = np.random.default_rng(seed)
    return {"W0": (rng.standard_normal((D, H)) * 0.5).astype(np.float32),
            "b0": (rng.standard_normal(H) * 0.1).astype(np.float32),
            "W1": (rng.standard_normal((H, C)) * 0.5).astype(np.float32),
            "b1": np.zeros(C, np.float32)}


def _model_fn(seed=0):
    def model_fn():
        p = {k: ism.Variable(v, name=k) for k, v in _init(seed).items()}
        x = ism.placeholder("float32", (None, D), name="x")
        y = ism.placeholder("int32", (None,), name="y")
        h = ism.relu(ism.bias_add(x @ p["W0"], p["b0"]))
        loss = ism.reduce_mean(ism.sparse_softmax_cross_entropy(y, ism.bias_add(h @ p["W1"], p["b1"])))
        return loss, [x, y]
    return model_fn


def _batch(n, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, D)).astype(np.float32), rng.integers(0, C, n).astype(np.int32)


def _numpy_step(p, x, y):
    """Hand-written loss and gradients of the MLP on the whole batch (float64)."""
    q = {k: v.astype(np.float64) for k, v in p.items()}
    x = x.astype(np.float64)
    h = np.maximum(x @ q["W0"] + q["b0"], 0)
    z = h @ q["W1"] + q["b1"]
    z = z - z.max(1, keepdims=True)
    pr = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    loss = -np.mean(np.log(pr[np.arange(len(y)), y]))
    dz = pr.copy()
    dz[np.arange(len(y)), y] -= 1
    dz /= len(y)
    dh = (dz @ q["W1"].T) * (h > 0)
    return loss, {"W0": x.T @ dh, "b0": dh.sum(0), "W1": h.T @ dz, "b1": dz.sum(0)}


def _reference(steps, x, y, momentum):
    p = {k: v.astype(np.float64) for k, v in _init().items()}
    acc = {k: np.zeros_like(v) for k, v in p.items()}
    losses = []
    for _ in range(steps):
        loss, g = _numpy_step(p, x, y)
        losses.append(loss)
        for k in p:
            if momentum:
                acc[k] = MOM * acc[k] + g[k]
                p[k] = p[k] - LR * acc[k]
            else:
                p[k] = p[k] - LR * g[k]
    return losses, p


def _opt(momentum):
    return (lambda: ism.optimizers.Momentum(LR, MOM)) if momentum else (lambda: ism.optimizers.SGD(LR))


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("momentum", [False, True], ids=["sgd", "momentum"])
def test_all_reduced_step_equals_one_step_on_the_whole_batch(n, momentum):
    x, y = _batch(12)
    want_losses, want = _reference(3, x, y, momentum)
    with DataParallel(_model_fn(), _opt(momentum), devices=n, gpu="simulated") as dp:
        assert dp.communicator.kind == "simulated" and len(dp.replicas) == n
        got = [dp.step({"x": x, "y": y}) for _ in range(3)]
        np.testing.assert_allclose(got, want_losses, rtol=2e-5)
        for k, v in want.items():
            np.testing.assert_allclose(dp.variable_value(k), v, rtol=2e-4, atol=2e-6)
        # every replica holds the same bits: parameters, optimizer slots, the step counter
        for rep in dp.replicas[1:]:
            for var in rep.variables:
                name = var.node.name
                assert np.array_equal(dp.variable_value(name, rep.rank), dp.variable_value(name, 0)), name
        assert int(dp.variable_value("global_step", n - 1)) == 3
    # and a single-device Session's steps on the whole batch agree with the replicas' too
    g = ism.Graph()
    with g.as_default():
        loss, (xt, yt) = _model_fn()()
        train = _opt(momentum)().minimize(loss)
        init = ism.global_variables_initializer()
    s = ism.Session(g, device="gpu", gpu="simulated")
    s.run(init)
    single = [s.run([loss, train], {xt: x, yt: y})[0] for _ in range(3)]
    np.testing.assert_allclose(got, single, rtol=2e-5)


def _bn_model_fn():
    rng = np.random.default_rng(3)
    x = ism.placeholder("float32", (None, D), name="x")
    y = ism.placeholder("int32", (None,), name="y")
    h = x @ ism.Variable((rng.standard_normal((D, H)) * 0.5).astype(np.float32), name="W0")
    h = ism.relu(ism.nn.BatchNorm(momentum=0.8, name="bn")(h, training=True))
    logits = ism.bias_add(h @ ism.Variable((rng.standard_normal((H, C)) * 0.5).astype(np.float32), name="W1"),
                          ism.Variable(np.zeros(C, np.float32), name="b1"))
    return ism.reduce_mean(ism.sparse_softmax_cross_entropy(y, logits)), [x, y]


def test_batch_norm_moving_statistics_are_averaged_across_replicas():
    n, x, y = 2, *_batch(8)
    with DataParallel(_bn_model_fn, _opt(False), devices=n, gpu="simulated") as dp:
        names = [v.node.name for v in dp.replicas[0].variables]
        before = {k: dp.variable_value(k) for k in names}
        dp.step({"x": x, "y": y})
        after = {k: dp.variable_value(k) for k in names}
        for k in names:
            assert np.array_equal(dp.variable_value(k, 1), after[k]), k
    # the reference: each shard on a single-device session, its gradients and new moving
    # statistics averaged here, the SGD step applied here
    grads, stats = [], []
    for r in range(n):
        g = ism.Graph()
        with g.as_default():
            loss, (xt, yt) = _bn_model_fn()
            trainable = ism.trainable_variables()
            gr = ism.gradients(loss, trainable)
            upd = g.get_collection("update_ops")
            init = ism.global_variables_initializer()
        s = ism.Session(g)
        s.run(init)
        m = len(y) // n
        out = s.run(gr + [u.outputs[0] for u in upd], {xt: x[r * m:(r + 1) * m], yt: y[r * m:(r + 1) * m]})
        grads.append(dict(zip([v.node.name for v in trainable], out[:len(gr)])))
        stats.append(dict(zip([u.inputs[0].node.name for u in upd], out[len(gr):])))
    for k in grads[0]:
        want = before[k] - LR * np.mean([gd[k] for gd in grads], axis=0)
        np.testing.assert_allclose(after[k], want, rtol=1e-5, atol=1e-6, err_msg=k)
    assert set(stats[0]) == {"bn/moving_mean", "bn/moving_variance"}
    for k in stats[0]:
        np.testing.assert_allclose(after[k], np.mean([st[k] for st in stats], axis=0), rtol=1e-5, atol=1e-7,
                                   err_msg=k)
        assert not np.allclose(after[k], before[k])


def test_replicas_start_identical_even_when_model_fn_draws_differently():
    calls = []

    def model_fn():
        calls.append(1)
        return _model_fn(seed=len(calls))()   # each replica's own random initial values
    with DataParallel(model_fn, _opt(False), devices=2, gpu="simulated") as dp:
        assert not np.array_equal(_init(1)["W0"], _init(2)["W0"])
        for k in ("W0", "b0", "W1"):
            assert np.array_equal(dp.variable_value(k, 0), _init(1)[k])   # replica 0's, copied to all
            assert np.array_equal(dp.variable_value(k, 1), _init(1)[k])
        dp.step([*_batch(4)])                                            # a list in input order works too
        assert np.array_equal(dp.variable_value("W0", 0), dp.variable_value("W0", 1))


def test_a_checkpoint_restores_every_replica(tmp_path):
    x, y = _batch(6)
    with DataParallel(_model_fn(), _opt(True), devices=3, gpu="simulated") as dp:
        dp.step({"x": x, "y": y})
        path = dp.save(str(tmp_path / "dp"))
        ahead = [dp.step({"x": x, "y": y}) for _ in range(2)]
        w_ahead = dp.variable_value("W1", 2)
    assert path.endswith("dp-1.npz")
    with DataParallel(_model_fn(), _opt(True), devices=3, gpu="simulated") as dp:
        dp.restore(path)
        assert int(dp.variable_value("global_step", 2)) == 1
        again = [dp.step({"x": x, "y": y}) for _ in range(2)]   # the momentum slots came back too
        assert again == ahead
        assert np.array_equal(dp.variable_value("W1", 2), w_ahead)


def test_one_replica_with_the_single_rank_communicator():
    x, y = _batch(6)
    want_losses, want = _reference(2, x, y, False)
    with DataParallel(_model_fn(), _opt(False), devices=1, gpu="simulated", communicator="single") as dp:
        assert dp.communicator.kind == "single"
        np.testing.assert_allclose([dp.step({"x": x, "y": y}) for _ in range(2)], want_losses, rtol=2e-5)
        np.testing.assert_allclose(dp.variable_value("W1"), want["W1"], rtol=2e-4, atol=2e-6)


def test_a_failing_replica_is_named_and_no_replica_applies_the_step():
    x, y = _batch(9)
    with DataParallel(_model_fn(), _opt(True), devices=3, gpu="simulated", timeout_s=20) as dp:
        dp.step({"x": x, "y": y})
        before = [{v.node.name: dp.variable_value(v.node.name, r) for v in dp.replicas[r].variables}
                  for r in range(3)]
        bad = y.copy()
        bad[7] = 99                      # a class id out of range, in replica 2's shard (rows 6-8)
        with pytest.raises(ReplicaStepError) as info:
            dp.step({"x": x, "y": bad})
        msg = str(info.value)
        assert "replica 2 (/device:GPU:2)" in msg and "SparseSoftmaxCrossEntropy" in msg, msg
        assert "no replica applied this step" in msg and info.value.applied is False
        for r in range(3):
            for name, v in before[r].items():
                assert np.array_equal(dp.variable_value(name, r), v), (r, name)
        dp.step({"x": x, "y": y})        # the next step runs as usual
        assert int(dp.variable_value("global_step", 2)) == 2


def test_a_failure_after_the_all_reduce_stops_training_until_resynchronised():
    from isthmus.core.data_parallel import ReplicaDivergedError
    x, y = _batch(4)
    with DataParallel(_model_fn(), _opt(False), devices=2, gpu="simulated") as dp:
        sess = dp.replicas[1].session
        run = sess.run

        def failing_after(*a, **k):   # replica 1's step runs (all-reduce included), then fails
            run(*a, **k)
            raise RuntimeError("injected after the update")
        sess.run = failing_after
        with pytest.raises(ReplicaDivergedError, match=r"replica 1 \(/device:GPU:1\).*replicas \[0\] applied"):
            dp.step({"x": x, "y": y})
        sess.run = run
        with pytest.raises(ReplicaDivergedError, match="call sync_parameters"):
            dp.step({"x": x, "y": y})
        dp.sync_parameters()
        dp.step({"x": x, "y": y})
        assert np.array_equal(dp.variable_value("W0", 0), dp.variable_value("W0", 1))


def test_memory_cap_per_device():
    x, y = _batch(8)
    with DataParallel(_model_fn(), _opt(False), devices=2, gpu="simulated",
                      gpu_memory=["1GiB", "64MiB"]) as dp:
        dp.step({"x": x, "y": y})
        stats = dp.memory_stats()
        assert stats["/device:GPU:0"]["cap_bytes"] == 1 << 30 and stats["/device:GPU:1"]["cap_bytes"] == 64 << 20
        for s in stats.values():
            assert 0 < s["peak_bytes"] <= s["cap_bytes"]
        # GPU:1's cap just above what it holds now: its step runs out of memory, GPU:0's does not
        dev1 = dp.replicas[1].session.devices.get("/device:GPU:1")
        w_before = dp.variable_value("W0", 0)
        gc.collect()     # GPU:1's meter is the process's: earlier tests' garbage freed mid-step would make room
        gc.disable()
        dev1.set_memory_cap(dev1.used_bytes() + 64)
        try:
            with pytest.raises(ReplicaStepError, match=r"replica 1 \(/device:GPU:1\).*out of device memory"):
                dp.step({"x": x, "y": y})
        finally:
            gc.enable()
            dev1.set_memory_cap(64 << 20)
        assert dp.memory_stats()["/device:GPU:0"]["cap_bytes"] == 1 << 30   # the other GPU's cap is its own
        assert np.array_equal(dp.variable_value("W0", 0), w_before)
        dp.step({"x": x, "y": y})


def test_fit_over_batches_keyed_by_input_name():
    x, y = _batch(20)
    with DataParallel(_model_fn(), _opt(False), devices=2, gpu="simulated") as dp:
        hist = dp.fit(ism.train.Batches({"x": x, "y": y}, batch_size=8, seed=0, drop_last=True), epochs=3)
        assert len(hist) == 3 and dp.steps == 6 and hist[-1] < hist[0]


def test_feeds_must_split_evenly_and_name_an_input():
    with DataParallel(_model_fn(), _opt(False), devices=2, gpu="simulated") as dp:
        x, y = _batch(5)
        with pytest.raises(ValueError, match=r"input 'x:0'.*5.*2 replicas"):
            dp.step({"x": x, "y": y})
        with pytest.raises(KeyError, match="not one of the model's inputs"):
            dp.step({"z": x})
    with pytest.raises(ValueError, match="give the stand-in a number"):
        DataParallel(_model_fn(), _opt(False), devices="all", gpu="simulated")


def test_arrays_of_two_stand_in_gpus_refuse_to_mix():
    a = sim_xp(0).ones(3, np.float32)
    b = sim_xp(1).ones(3, np.float32)
    assert (a.gpu_index, b.gpu_index, (b * 2).gpu_index, b[1:].gpu_index) == (0, 1, 1, 1)
    with pytest.raises(DeviceMixError, match="GPU:0.*GPU:1"):
        a + b
    with pytest.raises(DeviceMixError):
        sim_xp(0).concatenate([a, b])
    with pytest.raises(DeviceMixError):
        sim_xp(0).exp(b)                 # GPU:0's array module given GPU:1's array


def test_a_cross_device_read_without_a_copy_names_the_node():
    from isthmus.core.device_binding import DeviceBinding
    from isthmus.core.executor import KernelContext, Plan
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (3,), name="x")
        a = g.add_node("DeviceCopy", [x], {"src": "/device:CPU:0", "dst": "/device:GPU:1"}, name="up",
                       device="/device:GPU:1").outputs[0]
        b = g.add_node("Exp", [a], name="e1", device="/device:GPU:1").outputs[0]
        c = g.add_node("Relu", [b], name="r0", device="/device:GPU:0").outputs[0]   # no copy GPU:1 -> GPU:0
        d = g.add_node("DeviceCopy", [c], {"src": "/device:GPU:0", "dst": "/device:CPU:0"}, name="down",
                       device="/device:CPU:0").outputs[0]
    s = ism.Session(g, device="gpu", gpu="simulated")
    plan = Plan([d], [x], KernelContext(np, s.state), False, DeviceBinding(s.devices, s.state))
    with pytest.raises(ism.ExecutionError, match=r"node 'r0' \(Relu\) on /device:GPU:0.*on /device:GPU:1"):
        plan(np.ones(3, np.float32))
    # with the copy pass, the value goes GPU:1 -> GPU:0 through a DeviceCopy and the result is right
    g2 = ism.Graph()
    with g2.as_default():
        x2 = ism.placeholder("float32", (3,), name="x")
        with ism.device("/device:GPU:1"):
            b2 = ism.exp(x2)
        with ism.device("/device:GPU:0"):
            c2 = ism.relu(b2 - 2.0)
    xv = np.array([0.0, 1.0, 2.0], np.float32)
    got = ism.Session(g2, device="gpu", gpu="simulated").run(c2, {x2: xv})
    np.testing.assert_allclose(got, np.maximum(np.exp(xv) - 2, 0), rtol=1e-6)


def test_simulated_communicator_sums_in_place_and_refuses_other_devices():
    comm = SimulatedCommunicator([0, 1, 2])
    bufs = [[sim_xp(r).asarray(np.full(4, r + 1.0, np.float32))] for r in range(3)]
    comm.all_reduce_sum(bufs)
    for r in range(3):
        assert bufs[r][0].gpu_index == r
        np.testing.assert_array_equal(bufs[r][0].get(), np.full(4, 6.0, np.float32))
    with pytest.raises(ValueError, match="rank 1's buffer is on /device:GPU:0"):
        comm.all_reduce_sum([[sim_xp(0).zeros(2)], [sim_xp(0).zeros(2)], [sim_xp(2).zeros(2)]])
    with pytest.raises(ValueError, match="differ from rank 0's"):
        comm.all_reduce_sum([[sim_xp(0).zeros(2)], [sim_xp(1).zeros(3)], [sim_xp(2).zeros(2)]])


def test_a_rank_alone_times_out_naming_the_missing_ranks():
    group = AllReduceGroup(SimulatedCommunicator([0, 1]), timeout_s=0.2)
    with pytest.raises(CollectiveTimeout, match=r"rank 0 waited 0.2 s for ranks \[1\]"):
        group.all_reduce(0, [sim_xp(0).zeros(2)])


def test_all_reduce_node_mean_of_several_dtypes_on_one_replica():
    group = AllReduceGroup(SingleRank(0))
    g = ism.Graph()
    with g.as_default():
        a = ism.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
        b = ism.constant(np.array([1.5, 2.5]))                      # float64: a pack of its own
        ra, rb = all_reduce([a, b], group, 0)
    assert ra.shape == (2, 3) and rb.dtype == np.float64
    got_a, got_b = ism.Session(g, device="gpu", gpu="simulated").run([ra, rb])
    np.testing.assert_array_equal(got_a, np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(got_b, [1.5, 2.5])


def test_one_real_gpu_without_nccl_gets_the_identity(monkeypatch):
    monkeypatch.setattr(gpu, "nccl_unavailable_reason", lambda: "no NCCL here")
    assert make_communicator("auto", "cuda", [0], [None]).kind == "single"
    with pytest.raises(RuntimeError, match="needs NCCL: no NCCL here"):
        make_communicator("auto", "cuda", [0, 1], [None, None])


# ---- real GPUs ----------------------------------------------------------------------------------
_NO_NCCL = gpu.nccl_unavailable_reason() if gpu.gpu_available() else f"no GPU: {gpu.unavailable_reason()}"
needs_nccl = [pytest.mark.gpu, pytest.mark.skipif(bool(_NO_NCCL), reason=f"NCCL unusable: {_NO_NCCL}")]


@pytest.mark.parametrize("n", [pytest.param(1, marks=needs_nccl),
                               pytest.param(2, marks=needs_nccl + [pytest.mark.skipif(
                                   gpu.device_count() < 2, reason=f"{gpu.device_count()} GPU(s) here, 2 needed")])])
def test_nccl_data_parallel_on_real_gpus(n):
    x, y = _batch(12)
    want_losses, want = _reference(3, x, y, True)
    with DataParallel(_model_fn(), _opt(True), devices=n, gpu="cuda", communicator="nccl") as dp:
        assert dp.communicator.kind == "nccl"
        np.testing.assert_allclose([dp.step({"x": x, "y": y}) for _ in range(3)], want_losses, rtol=1e-4)
        for k, v in want.items():
            np.testing.assert_allclose(dp.variable_value(k, n - 1), v, rtol=1e-3, atol=1e-5)
        for rep in dp.replicas[1:]:
            assert np.array_equal(dp.variable_value("W0", rep.rank), dp.variable_value("W0", 0))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu.gpu_available(), reason=f"no GPU: {gpu.unavailable_reason()}")
def test_one_real_gpu_trains_whichever_communicator_it_has():
    x, y = _batch(8)
    want_losses, want = _reference(2, x, y, False)
    with DataParallel(_model_fn(), _opt(False), devices=1, gpu="cuda") as dp:
        assert dp.communicator.kind == ("single" if _NO_NCCL else "nccl")
        np.testing.assert_allclose([dp.step({"x": x, "y": y}) for _ in range(2)], want_losses, rtol=1e-4)
        np.testing.assert_allclose(dp.variable_value("W0"), want["W0"], rtol=1e-3, atol=1e-5)
        stats = dp.memory_stats()["/device:GPU:0"]
        assert 0 < stats["peak_bytes"] <= stats["cap_bytes"]


@pytest.mark.gpu
@pytest.mark.skipif(bool(_NO_NCCL), reason=f"NCCL unusable: {_NO_NCCL}")
def test_nccl_communicator_sums_one_rank_in_place():
    from isthmus.core.collective import NcclCommunicator
    cp = gpu.array_module("GPU")
    comm = NcclCommunicator([0], [gpu.new_stream(0)])
    with comm.streams[0]:            # made on the stream the reduction runs on (a non-blocking one)
        buf = cp.arange(5, dtype=cp.float32)
    comm.all_reduce_sum([[buf]])
    comm.streams[0].synchronize()
    np.testing.assert_array_equal(cp.asnumpy(buf), np.arange(5, dtype=np.float32))
    assert not isinstance(buf, SimArray)
    comm.close()
