"""core.Session(graph, target="grpc://...") runs on a cluster: the same training as a
DistributedSession and as a local Session, with core importing nothing of cloud."""
import ast
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import isthmus as ism
from isthmus import nn
from isthmus.cloud.cluster import ClusterSpec
from isthmus.cloud.server import Server
from isthmus.cloud.session import DistributedSession


def servers(jobs):
    """Tasks of a cluster as in-process gRPC servers on free loopback ports."""
    made = {(job, i): Server(None, job, i, port=0, step_timeout=20.0, recv_timeout=10.0)
            for job, n in jobs.items() for i in range(n)}
    spec = ClusterSpec({job: [f"127.0.0.1:{made[(job, i)].port}" for i in range(n)] for job, n in jobs.items()})
    for s in made.values():
        s.set_cluster(spec)
    return made


def mlp():
    g = ism.Graph(seed=3)
    with g.as_default():
        x = ism.placeholder("float32", (None, 16), name="x")
        y = ism.placeholder("int32", (None,), name="y")
        net = nn.Sequential([nn.Dense(12, activation="relu", name="h"), nn.Dense(4, name="out")])
        loss = nn.sparse_softmax_cross_entropy(y, net(x, training=True))
        train = ism.optimizers.Momentum(0.1).minimize(loss)
        init = ism.global_variables_initializer()
    return g, x, y, loss, train, init


def run(sess, parts):
    _, x, y, loss, train, init = parts
    rng = np.random.default_rng(1)
    sess.run(init)
    out = []
    for _ in range(5):
        xb, yb = rng.random((6, 16), dtype=np.float32), rng.integers(0, 4, 6).astype(np.int32)
        out.append(sess.run([loss, train], {x: xb, y: yb})[0])
    return [np.asarray(v).tobytes() for v in out]


@pytest.mark.cpu  # bit for bit against a CPU session
def test_session_with_a_grpc_target_is_a_distributed_session():
    made = servers({"ps": 1, "worker": 1})
    try:
        target = made[("worker", 0)].target
        parts = mlp()
        want = run(ism.Session(parts[0]), parts)
        parts = mlp()
        with ism.Session(parts[0], target=target) as s:
            assert isinstance(s, DistributedSession) and s.target == target
            got_core = run(s, parts)
        parts = mlp()
        with DistributedSession(parts[0], target) as s:
            got_cloud = run(s, parts)
        assert got_core == got_cloud == want
        # the variables really live on the ps task
        assert made[("ps", 0)].worker.steps_run > 0
    finally:
        for s in made.values():
            s.stop()


def test_bad_targets_are_refused_clearly():
    g = ism.Graph()
    with pytest.raises(ValueError, match="grpc://host:port"):
        ism.Session(g, target="local")
    with pytest.raises(ValueError, match="parallel"):
        ism.Session(g, target="grpc://127.0.0.1:1", parallel=False)


def test_core_knows_the_cloud_session_only_through_its_registry():
    """cloud registers its DistributedSession with core (register_remote_session) when imported:
    core/session.py neither imports the cloud nor names it; without a registration the error says what to do."""
    src = pathlib.Path(ism.__file__).resolve().parent / "core" / "session.py"
    tree = ast.parse(src.read_text())
    mods = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    mods += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not any("cloud" in m for m in mods)
    assert "importlib" not in src.read_text() and "import_module" not in src.read_text()
    code = ("import isthmus.core as c, sys\n"
            "try:\n    c.Session(c.Graph(), target='grpc://127.0.0.1:1')\n"
            "except RuntimeError as e:\n    print('refused:', e)\n"
            "import isthmus.cloud\n"
            "try:\n    c.Session(c.Graph(), target='grpc://127.0.0.1:1')\n"
            "except Exception as e:\n    print('cloud:', type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: target 'grpc://127.0.0.1:1': no cluster runtime is registered; import isthmus.cloud" in out.stdout
    # registered: the cloud's session tried the (closed) port
    assert "cloud: TaskUnavailable task master at 127.0.0.1:1 is unreachable" in out.stdout, out.stdout


def test_variables_are_read_and_set_on_the_ps_and_a_saver_round_trips(tmp_path):
    made = servers({"ps": 1, "worker": 1})
    try:
        parts = mlp()
        g = parts[0]
        with ism.Session(g, target=made[("worker", 0)].target) as s:
            run(s, parts)
            saver = ism.Saver(graph=g)
            path = saver.save(s, str(tmp_path / "m"), global_step=5)
            kernel = g.node("h/kernel")
            want = s.variable_value(kernel)
            s.set_variable_value(kernel, np.zeros_like(want))
            assert not s.variable_value(kernel).any()
            with pytest.raises(ism.FeedError, match=r"variable 'h/kernel' is float32\[16,12\]"):
                s.set_variable_value(kernel, np.zeros((3, 3), np.float32))
            assert saver.restore_latest_valid(s, str(tmp_path)) == path
            np.testing.assert_array_equal(s.variable_value(kernel), want)
    finally:
        for s in made.values():
            s.stop()
