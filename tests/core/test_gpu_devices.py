"""GPU placement, copy nodes, memory cap and the executor's device binding.

Every test runs on the stand-in GPU (numpy underneath, arrays that refuse to mix with host
arrays) in CI, and on a real GPU under `pytest -m gpu` when cupy sees one.
"""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core import gpu
from isthmus.core.device_binding import DeviceMemoryError
from isthmus.core.errors import ExecutionError
from isthmus.core.passes.copies import copies_of, insert_copies
from isthmus.core.simgpu import SIM_XP, DeviceMixError

BACKENDS = [pytest.param("simulated", id="sim"),
            pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
                not gpu.gpu_available(), reason=f"no GPU: {gpu.unavailable_reason()}")])]


def _mlp(batch=16, seed=0):
    rng = np.random.default_rng(seed)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (batch, 20), name="x")
        y = ism.placeholder("int32", (batch,), name="y")
        h = x
        for i, (a, b) in enumerate([(20, 32), (32, 32), (32, 5)]):
            h = ism.bias_add(h @ ism.Variable((rng.standard_normal((a, b)) * 0.3).astype(np.float32), name=f"W{i}"),
                             ism.Variable(np.full(b, 0.01, np.float32), name=f"b{i}"))
            if i < 2:
                h = ism.relu(h)
        loss = ism.reduce_mean(ism.sparse_softmax_cross_entropy(y, h))
        train = ism.optimizers.Momentum(0.1, 0.9).minimize(loss)
        init = ism.global_variables_initializer()
    xs = rng.standard_normal((batch, 20)).astype(np.float32)
    ys = rng.integers(0, 5, batch).astype(np.int32)
    return g, x, y, loss, train, init, xs, ys


def _train(device, backend, steps=3):
    g, x, y, loss, train, init, xs, ys = _mlp()
    s = ism.Session(g, device=device, gpu=backend)
    s.run(init)
    losses = [s.run([loss, train], {x: xs, y: ys})[0] for _ in range(steps)]
    return s, g, losses


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_on_gpu_matches_cpu(backend):
    _, g_cpu, ref = _train("cpu", backend)
    s, g, got = _train("gpu", backend)
    for a, b in zip(got, ref):
        assert type(a) is np.ndarray  # fetches come back as numpy
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    w = s.variable_value(g.node("W0"))
    assert type(w) is np.ndarray and w.shape == (20, 32)


def test_a_constant_remade_on_another_device_keeps_what_it_waits_for():
    """A Const placed on the GPU and fetched to the host is made again there, with its control inputs:
    without them the run pruned what it waited for (a split part's Recv of a token), and that token's
    Send stayed pending in the rendezvous every step."""
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2,), name="x")
        gate = ism.exp(x, name="gate")
        with ism.control_dependencies([gate]):
            k = ism.constant(np.ones(2, np.float32), name="k")
    rw = insert_copies(g, list(g.nodes), [k], [x], "/device:GPU:0")
    remade = rw.fetches[0].node
    assert remade.op == "Const" and remade.device == "/device:CPU:0" and rw.stats["consts_remade"] == 1
    assert [c.name for c in remade.control_inputs] == ["gate"]


def test_copy_pass_one_copy_per_tensor_per_destination():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (4, 4), name="x")
        a = ism.exp(x, name="a")                       # on the GPU (session default)
        with ism.device("/device:CPU:0"):
            h1 = ism.neg(a, name="h1")                 # two host consumers of a: one copy back
            h2 = ism.abs(a, name="h2")
        b = ism.add(h1, h2, name="b")                  # back on the GPU
        c = ism.mul(b, 2.0, name="c")                  # its constant is made on the GPU, not copied
    rw = insert_copies(g, list(g.nodes), [c, a], [x], "/device:GPU:0")
    rw.graph.verify()
    counts = copies_of(rw.graph)
    host, dev = "/device:CPU:0", "/device:GPU:0"
    # x up once; a down once (shared by h1, h2 and the fetch of a); h1 and h2 up; c down
    assert counts == {(host, dev): 3, (dev, host): 2}
    assert rw.stats["consts_remade"] == 0  # the Const of c was placed on the GPU already
    dev_of = {n.name: n.device for n in rw.graph.nodes}
    assert dev_of["a"] == dev and dev_of["h1"] == host and dev_of["x"] == host
    assert all(f.node.op == "DeviceCopy" and f.node.attrs["dst"] == host for f in rw.fetches)
    s = ism.Session(g, device="gpu", gpu="simulated")
    xv = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)
    got_c, got_a = s.run([c, a], {x: xv})
    np.testing.assert_allclose(got_a, np.exp(xv), rtol=1e-6)
    np.testing.assert_allclose(got_c, 2 * (-np.exp(xv) + np.exp(xv)), atol=1e-6)


def test_copy_costs_bytes_in_the_cost_model():
    from isthmus.partitioner.costmodel import op_cost
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (256, 1024), name="x")
        n = g.add_node("DeviceCopy", [x], {"src": "/device:CPU:0", "dst": "/device:GPU:0"})
    c = op_cost(n)
    assert c.bytes_read == c.bytes_written == 256 * 1024 * 4 and c.flops == 0


def test_missing_copy_fails_on_the_stand_in():
    from isthmus.core.device_binding import DeviceBinding
    from isthmus.core.executor import KernelContext, Plan
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (3,), name="x")
        y = g.add_node("Relu", [x], name="r", device="/device:GPU:0").outputs[0]
    s = ism.Session(g, device="gpu", gpu="simulated")
    plan = Plan([y], [x], KernelContext(np, s.state), False, DeviceBinding(s.devices, s.state))  # no copy pass
    with pytest.raises(ism.ExecutionError, match=r"node 'r' \(Relu\).*host ndarray.*copy node is missing"):
        plan(np.ones(3, np.float32))


def test_stand_in_arrays_refuse_host_arrays():
    d = SIM_XP.asarray(np.arange(4, dtype=np.float32))
    with pytest.raises(DeviceMixError):
        d + np.ones(4, np.float32)
    with pytest.raises(DeviceMixError):
        SIM_XP.concatenate([d, np.ones(2, np.float32)])
    with pytest.raises(DeviceMixError):
        np.sum(np.ones(2)) + SIM_XP.maximum(d, np.zeros(4, np.float32))
    assert type(d * 2 + 1) is type(d) and type(SIM_XP.zeros(3)) is type(d) and type(d.sum()) is type(d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_cap_error_names_node_shape_and_cap(backend):
    import gc
    gc.collect()  # the stand-in counts every live device array of the process, as a pool does
    g = ism.Graph()
    with g.as_default():
        a = ism.placeholder("float32", (1024, 512), name="a")
        big = ism.matmul(a, ism.transpose(a), name="big_product")  # 4 MiB output under a 2 MiB cap
    s = ism.Session(g, device="gpu", gpu=backend, gpu_memory="3MiB")
    with pytest.raises(DeviceMemoryError) as e:
        s.run(big, {a: np.ones((1024, 512), np.float32)})
    msg = str(e.value)
    assert "big_product" in msg and "float32[1024,1024]" in msg and str(3 << 20) in msg
    small = ism.Session(g, device="gpu", gpu=backend, gpu_memory="64MiB")
    out = small.run(big, {a: np.ones((1024, 512), np.float32)})
    assert out[0, 0] == 512.0
    stats = small.memory_stats()["/device:GPU:0"]
    assert stats["cap_bytes"] == 64 << 20 and stats["peak_bytes"] >= 4 << 20  # the product was live


def test_memory_cap_error_in_a_captured_step_names_the_node():
    import gc
    gc.collect()
    g = ism.Graph()
    with g.as_default():
        a = ism.placeholder("float32", (1024, 512), name="a")
        big = ism.matmul(a, ism.transpose(a), name="big_product")
    s = ism.Session(g, device="gpu", gpu="simulated", gpu_memory="3MiB", capture=True)
    with pytest.raises(DeviceMemoryError, match="big_product.*float32\\[1024,1024\\]"):
        s.run(big, {a: np.ones((1024, 512), np.float32)})


def test_default_cap_is_never_the_whole_device(monkeypatch):
    monkeypatch.delenv("ISTHMUS_GPU_MEMORY", raising=False)
    s = ism.Session(ism.Graph(), device="gpu", gpu="simulated")
    d = s.devices.get("/device:GPU:0")
    assert d.cap_bytes < d.total_bytes
    monkeypatch.setenv("ISTHMUS_GPU_MEMORY", "256MiB")
    assert ism.Session(ism.Graph(), device="gpu", gpu="simulated").devices.get("/device:GPU:0").cap_bytes == 256 << 20


def test_gpu_session_without_cupy_names_the_reason(monkeypatch):
    if gpu.gpu_available():
        pytest.skip("a GPU is present")
    for k in ("ISTHMUS_DEVICE", "ISTHMUS_GPU"):  # the default backend (cuda), whatever the run's env
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(RuntimeError, match="no GPU is available"):
        ism.Session(ism.Graph(), device="gpu")
    assert ism.Session(ism.Graph(), device="auto").devices.default == "/device:CPU:0"


@pytest.mark.parametrize("backend", BACKENDS)
def test_variables_live_on_the_device_and_round_trip(backend):
    g = ism.Graph()
    with g.as_default():
        v = ism.Variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="v")
        upd = ism.assign_add(v, ism.constant(np.ones((2, 3), np.float32))) if hasattr(ism, "assign_add") else None
        init = ism.global_variables_initializer()
    s = ism.Session(g, device="gpu", gpu=backend)
    s.run(init)
    slot = s.state.slots["v"]
    assert s.devices.get("/device:GPU:0").is_device_array(slot.value)
    s.set_variable_value(v, np.full((2, 3), 7, np.float32))
    assert s.devices.get("/device:GPU:0").is_device_array(slot.value)
    np.testing.assert_array_equal(s.run(v), np.full((2, 3), 7, np.float32))
    if upd is not None:
        s.run(upd)
        np.testing.assert_array_equal(s.variable_value(v), np.full((2, 3), 8, np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_pinned_node_in_a_cpu_session(backend):
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (5,), name="x")
        with ism.device("/job:worker/task:0/device:GPU:0"):
            y = ism.square(x, name="sq")
        z = ism.add(y, x, name="z")
    s = ism.Session(g, gpu=backend)
    xv = np.arange(5, dtype=np.float32)
    np.testing.assert_allclose(s.run(z, {x: xv}), xv * xv + xv)
    assert copies_of(s.plan_for(z, {x: xv}).nodes[0].graph) == {("/device:CPU:0", "/device:GPU:0"): 1,
                                                               ("/device:GPU:0", "/device:CPU:0"): 1}


@pytest.mark.parametrize("backend", BACKENDS)
def test_captured_step_matches_eager(backend):
    from isthmus.core.capture import CapturedPlan
    res = {}
    for cap in (False, True):
        g, x, y, loss, train, init, xs, ys = _mlp()
        s = ism.Session(g, device="gpu", gpu=backend, capture=cap)
        s.run(init)
        res[cap] = [s.run([loss, train], {x: xs, y: ys})[0] for _ in range(4)] + [s.variable_value(g.node("W1"))]
        if cap:
            plan = s.plan_for([loss, train], {x: xs, y: ys})
            assert isinstance(plan, CapturedPlan)
            rep = plan.report()
            assert rep["recorded"] and rep["graphs"] >= 1 and rep["captured_nodes"] > 10, rep
    for a, b in zip(res[True], res[False]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_session_captures_a_step_from_its_second_run(backend):
    """capture="auto" (the default): the initializer (run once) stays eager, the training step is
    recorded on its second run and replayed after; the losses and weights equal capture=False's."""
    from isthmus.core.capture import AutoCapture, CapturedPlan
    res = {}
    for cap in ("default", False):
        g, x, y, loss, train, init, xs, ys = _mlp()
        s = ism.Session(g, device="gpu", gpu=backend) if cap == "default" else \
            ism.Session(g, device="gpu", gpu=backend, capture=False)
        s.run(init)
        losses = []
        for k in range(4):
            losses.append(s.run([loss, train], {x: xs, y: ys})[0])
            if cap == "default":
                plan = s.plan_for([loss, train], {x: xs, y: ys})
                assert isinstance(plan, AutoCapture)
                assert (plan.captured is None) == (k == 0), k  # eager first, recorded on the second run
        res[cap] = losses + [s.variable_value(g.node("W1"))]
        if cap == "default":
            assert isinstance(plan.captured, CapturedPlan) and plan.report()["recorded"]
            assert getattr(s.plan_for(init), "captured", None) is None  # run once: never recorded
    for a, b in zip(res["default"], res[False]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_captured_step_sees_a_restored_variable(backend):
    """A graph reads a variable at the address it had when recorded: set_variable_value (as a
    checkpoint restore does) gives the slot a new array, and the next call records again."""
    res = {}
    for cap in (True, False):
        g, x, y, loss, train, init, xs, ys = _mlp()
        s = ism.Session(g, device="gpu", gpu=backend, capture=cap)
        s.run(init)
        w0 = s.variable_value(g.node("W0"))
        out = [s.run([loss, train], {x: xs, y: ys})[0] for _ in range(3)]
        s.set_variable_value(g.node("W0"), w0 * 0.5)  # a host value: the slot's array changes
        out += [s.run([loss, train], {x: xs, y: ys})[0] for _ in range(3)]
        res[cap] = out + [s.variable_value(g.node("W0"))]
    assert not np.isclose(res[False][3], res[False][2])  # the restore changed the loss
    for a, b in zip(res[True], res[False]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_captured_step_error_names_the_node():
    g = ism.Graph()
    with g.as_default():
        i = ism.placeholder("int32", (2,), name="i")
        v = ism.Variable(np.zeros(3, np.float32), name="v")
        bad = ism.gather(v * 2.0, i, name="picks")  # an index out of range fails at run time
        init = ism.global_variables_initializer()
    s = ism.Session(g, device="gpu", gpu="simulated", capture=True)
    s.run(init)
    with pytest.raises(ExecutionError, match="node 'picks' \\(Gather") as e:
        s.run(bad, {i: np.array([0, 7], np.int32)})
    assert e.value.node_name == "picks"


@pytest.mark.parametrize("capture", [True, "auto"])
def test_capture_is_off_where_a_fed_value_sets_a_shape(capture):
    """Fixed feed shapes do not make a fixed-shape plan: an ONNX Pad whose pads are fed gives a
    new output shape per run, which fixed graph buffers cannot hold (core/capture.static_shapes)."""
    from onnx import TensorProto, helper
    from isthmus.converters.onnx_import import from_onnx
    from isthmus.core.capture import CapturedPlan
    node = helper.make_node
    gr = helper.make_graph([node("Pad", ["x", "p"], ["y"]), node("Exp", ["y"], ["z"])], "pad",
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                            helper.make_tensor_value_info("p", TensorProto.INT64, [4])],
                           [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    g, ins, outs = from_onnx(m)
    s = ism.Session(g, device="gpu", gpu="simulated", capture=capture)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    for pads in ([0, 1, 0, 2], [1, 0, 0, 0], [0, 0, 2, 4], [1, 1, 1, 1]):
        got = s.run(outs[0], {ins["x"]: x, ins["p"]: np.array(pads, np.int64)})
        want = np.exp(np.pad(x, ((pads[0], pads[2]), (pads[1], pads[3]))))
        np.testing.assert_allclose(got, want, rtol=1e-6)
    plan = s.plan_for(outs[0], {ins["x"]: x, ins["p"]: np.zeros(4, np.int64)})
    assert not isinstance(plan, CapturedPlan) and getattr(plan, "captured", None) is None


def test_capture_is_off_where_shapes_vary():
    from isthmus.core.capture import CapturedPlan
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 3), name="x")
        y = ism.reduce_sum(ism.exp(x))
    s = ism.Session(g, device="gpu", gpu="simulated", capture=True)
    for n in (2, 5):
        np.testing.assert_allclose(s.run(y, {x: np.zeros((n, 3), np.float32)}), 3.0 * n)
    assert not isinstance(s.plan_for(y, {x: np.zeros((2, 3), np.float32)}), CapturedPlan)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu.gpu_available(), reason=f"no GPU: {gpu.unavailable_reason()}")
@pytest.mark.parametrize("m,k,n,ta,tb,act", [(128, 784, 512, False, False, "relu"), (512, 128, 512, True, False, "none"),
                                             (130, 70, 33, False, True, "relu6"), (5, 3, 2, True, True, "sigmoid"),
                                             (4096, 512, 10, False, False, "tanh")])
def test_capture_gemm_kernel(m, k, n, ta, tb, act):
    from isthmus.core.gpu_kernels.gemm import gemm
    cp = gpu.array_module("GPU")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    da, db = cp.asarray(a), cp.asarray(b)
    got = gemm(cp, da.T if ta else da, db.T if tb else db, cp.asarray(bias), act).get()
    want = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64) + bias
    want = {"none": want, "relu": np.maximum(want, 0), "relu6": np.clip(want, 0, 6), "tanh": np.tanh(want),
            "sigmoid": 1 / (1 + np.exp(-want))}[act]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_gpu_calibration_writes_a_gpu_profile_with_copy_costs(tmp_path):
    from isthmus.partitioner.calibrate_gpu import calibrate_gpu
    from isthmus.partitioner.devices import DeviceProfile
    prof = calibrate_gpu("gpu", ops=["MatMul", "Relu"], level="quick", backend="simulated")
    assert prof.kind == "GPU" and {"MatMul", "Relu", "DeviceCopy"} <= set(prof.op_coeffs)
    path = tmp_path / "gpu.json"
    prof.save(str(path))
    again = DeviceProfile.load(str(path)) if hasattr(DeviceProfile, "load") else DeviceProfile.from_json(path.read_text())
    assert again.op_time("DeviceCopy", 0, 2 << 20) > again.op_time("DeviceCopy", 0, 2 << 10) > 0


def test_device_flag_of_the_server_commands(monkeypatch):
    from isthmus.core.device_runtime import apply_device_flag
    monkeypatch.delenv("ISTHMUS_DEVICE", raising=False)
    assert apply_device_flag("gpu", "ps") == "cpu"  # parameter servers stay on the CPU
    assert apply_device_flag("cpu", "worker") == "cpu"
    if not gpu.gpu_available():
        assert apply_device_flag("auto", "worker") == "cpu"
        with pytest.raises(SystemExit, match="no GPU is available"):
            apply_device_flag("gpu", "worker")
    with pytest.raises(SystemExit, match="--device must be"):
        apply_device_flag("tpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_host_values_in_a_variable_move_to_the_device_on_read(backend):
    g = ism.Graph()
    with g.as_default():
        v = ism.Variable(np.zeros(3, np.float32), name="v")
        y = ism.add(v, 1.0)
    s = ism.Session(g, device="gpu", gpu=backend)
    s.state.slot(g.node("v")).value = np.arange(3, dtype=np.float32)  # as a cloud task's RPC assign does
    np.testing.assert_allclose(s.run(y), [1, 2, 3])
    assert s.devices.get("/device:GPU:0").is_device_array(s.state.slots["v"].value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_trace_reports_device_events_and_peak(backend):
    g, x, y, loss, train, init, xs, ys = _mlp()
    s = ism.Session(g, device="gpu", gpu=backend)
    s.run(init)
    md = ism.RunMetadata()
    got = s.run([loss, train], {x: xs, y: ys}, options=ism.RunOptions(trace=True), run_metadata=md)[0]
    assert np.isfinite(got) and type(got) is np.ndarray
    assert md.device_peak_bytes["/device:GPU:0"] > 0
    devices = {e.device for e in md.events}
    assert "/device:GPU:0" in devices and any(e.op == "DeviceCopy" for e in md.events)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalar_and_large_feeds_keep_their_shapes(backend):
    g = ism.Graph()
    with g.as_default():
        s = ism.placeholder("float32", (), name="s")
        big = ism.placeholder("float32", (512, 1024), name="big")  # 2 MiB: staged through pinned memory
        y = ism.reduce_sum(ism.mul(big, s), name="y")
        z = ism.mul(s, 2.0, name="z")
    sess = ism.Session(g, device="gpu", gpu=backend)
    bv = np.ones((512, 1024), np.float32)
    got_y, got_z = sess.run([y, z], {s: 0.5, big: bv})
    assert got_z.shape == () and float(got_z) == 1.0
    assert float(got_y) == 0.5 * bv.size


def test_gpu_pins_run_on_the_host_without_a_gpu(monkeypatch):
    """A graph partitioned for a cluster names GPUs this machine may lack: soft placement."""
    if gpu.gpu_available():
        pytest.skip("a GPU is present")
    for k in ("ISTHMUS_DEVICE", "ISTHMUS_GPU"):  # the default backend (cuda), whatever the run's env
        monkeypatch.delenv(k, raising=False)
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (3,), name="x")
        with ism.device("/job:cloud/task:1/device:GPU:0"):
            y = ism.exp(x)
    s = ism.Session(g)
    np.testing.assert_allclose(s.run(y, {x: np.zeros(3, np.float32)}), np.ones(3))
    assert all(n.op != "DeviceCopy" for n in s.plan_for(y, {x: np.zeros(3, np.float32)}).nodes)


def test_capture_option_is_checked():
    with pytest.raises(ValueError, match="capture must be True, False or 'auto'"):
        ism.Session(ism.Graph(), capture="always")
