"""TLS and bearer tokens on isthmus gRPC servers (wire/security.py), with throwaway certificates."""
import os
import tempfile

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("cryptography")

import isthmus as ism  # noqa: E402
from isthmus.cloud import rpc  # noqa: E402
from isthmus.cloud.server import serve_worker  # noqa: E402
from isthmus.cloud.errors import TaskUnavailable, WorkerError  # noqa: E402
from isthmus.cloud.worker import Worker  # noqa: E402
from isthmus.wire.security import ClientSecurity, SecurityError, ServerSecurity, make_channel  # noqa: E402

from ..tls_certs import make_certs  # noqa: E402

TIMEOUT = 5.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def _serve(security):
    w = Worker("/job:worker/task:0", recv_timeout=5.0, wire=True)
    server, port = serve_worker(w, security=security)
    return server, f"127.0.0.1:{port}"


def _status(addr, security):
    c = rpc.WorkerClient(addr, timeout=TIMEOUT, security=security)
    try:
        return c.status()
    finally:
        c.close()


def _stop(server):
    server.stop(grace=None).wait(5)


def test_tls_and_token_accepts_the_right_client_and_refuses_the_rest(certs):
    srv = ServerSecurity.from_files(str(certs.server_cert), str(certs.server_key), token_file=str(certs.token))
    assert srv.describe() == "TLS + bearer token"
    server, addr = _serve(srv)
    try:
        good = ClientSecurity.from_files(ca=str(certs.ca), token_file=str(certs.token))
        assert _status(addr, good) is not None
        # no token: UNAUTHENTICATED, naming what is missing
        with pytest.raises(WorkerError, match="UNAUTHENTICATED.*requires a bearer token"):
            _status(addr, ClientSecurity.from_files(ca=str(certs.ca)))
        with pytest.raises(WorkerError, match="UNAUTHENTICATED.*token is wrong"):
            _status(addr, ClientSecurity(root_ca=certs.ca.read_bytes(), token="not-the-token"))
        # plaintext against a TLS port: the handshake fails, the call is refused
        with pytest.raises(TaskUnavailable):
            _status(addr, ClientSecurity(tls=False, token=certs.token.read_text().strip()))
        with pytest.raises(TaskUnavailable):
            _status(addr, None)
        # a client trusting another CA refuses the server
        with pytest.raises(TaskUnavailable):
            _status(addr, ClientSecurity(root_ca=certs.other_ca.read_bytes(), token="x"))
        # the server is still serving after all that
        assert _status(addr, good) is not None
    finally:
        _stop(server)


def test_health_check_needs_no_token(certs):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    server, addr = _serve(ServerSecurity(token="tok-123"))
    try:
        with make_channel(addr, None) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(WorkerError, match="UNAUTHENTICATED"):
            _status(addr, None)
        assert _status(addr, ClientSecurity(tls=False, token="tok-123")) is not None
    finally:
        _stop(server)


def test_mutual_tls_requires_a_client_certificate(certs):
    srv = ServerSecurity.from_files(str(certs.server_cert), str(certs.server_key), client_ca=str(certs.ca))
    server, addr = _serve(srv)
    try:
        with pytest.raises(TaskUnavailable):
            _status(addr, ClientSecurity.from_files(ca=str(certs.ca)))
        ok = ClientSecurity.from_files(ca=str(certs.ca), cert=str(certs.client_cert), key=str(certs.client_key))
        assert _status(addr, ok) is not None
    finally:
        _stop(server)


def test_graph_runs_over_tls(certs):
    """A real subgraph registered and run through a TLS + token channel gives the local result."""
    from isthmus.cloud import graph_codec
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, [None, 3], name="x")
        y = ism.reduce_sum(x * x, axis=1, name="y")
    srv = ServerSecurity.from_files(str(certs.server_cert), str(certs.server_key), token_file=str(certs.token))
    server, addr = _serve(srv)
    try:
        c = rpc.WorkerClient(addr, timeout=TIMEOUT,
                             security=ClientSecurity.from_files(ca=str(certs.ca), token_file=str(certs.token)))
        h = c.register_graph(graph_codec.to_bytes(g))
        xv = np.arange(6, dtype=np.float32).reshape(2, 3)
        (out,) = c.run_graph(h, 1, {"x:0": xv}, ["y:0"])
        np.testing.assert_array_equal(out, (xv * xv).sum(axis=1))
        c.close()
    finally:
        _stop(server)


def test_settings_are_validated(tmp_path, certs):
    with pytest.raises(SecurityError, match="both"):
        ServerSecurity.from_files(cert=str(certs.server_cert))
    with pytest.raises(SecurityError, match="need TLS"):
        ServerSecurity(client_ca=certs.ca.read_bytes())
    bad = tmp_path / "notpem.pem"
    bad.write_bytes(b"hello")
    with pytest.raises(SecurityError, match="notpem.pem.*not PEM"):
        ServerSecurity.from_files(str(bad), str(certs.server_key))
    with pytest.raises(SecurityError, match="cannot read token file"):
        ClientSecurity.from_files(token_file=str(tmp_path / "missing.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(SecurityError, match="empty"):
        ServerSecurity.from_files(token_file=str(empty))
    with pytest.raises(SecurityError, match="printable"):
        ClientSecurity(token="two words", tls=False)
    assert ServerSecurity.from_env({}) is None and ClientSecurity.from_env({}) is None
    env = {"ISTHMUS_TLS_CERT": str(certs.server_cert), "ISTHMUS_TLS_KEY": str(certs.server_key),
           "ISTHMUS_TOKEN_FILE": str(certs.token)}
    s, c = ServerSecurity.from_env(env), ClientSecurity.from_env(env)
    assert s.tls and s.token == c.token and c.tls and c.root_ca == certs.server_cert.read_bytes()


def test_local_cluster_with_tls_and_token_from_the_environment(certs, monkeypatch):
    """Every task of a cluster serves TLS + token when the environment says so; a session
    with the settings trains as a local one, a client without the token is refused."""
    from isthmus.cloud.local_cluster import LocalCluster
    from isthmus.cloud.master_rpc import MasterClient
    from isthmus.cloud.session import DistributedSession
    monkeypatch.setenv("ISTHMUS_TLS_CERT", str(certs.server_cert))
    monkeypatch.setenv("ISTHMUS_TLS_KEY", str(certs.server_key))
    monkeypatch.setenv("ISTHMUS_TLS_CA", str(certs.ca))
    monkeypatch.setenv("ISTHMUS_TOKEN_FILE", str(certs.token))
    g = ism.Graph()
    with g.as_default():
        with ism.device("/job:ps/task:0"):
            w = ism.Variable(np.ones((3, 1), np.float32), name="w")
        x = ism.placeholder(ism.float32, [None, 3], name="x")
        loss = ism.reduce_sum(ism.matmul(x, w) ** 2)
        step = ism.optimizers.SGD(0.1).minimize(loss)
        init = ism.global_variables_initializer()
    xv = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
    with ism.Session(g) as local:
        local.run(init)
        for _ in range(3):
            local.run(step, {x: xv})
        want = local.run(w)
    with LocalCluster({"ps": 1, "worker": 1}) as lc:
        sess = DistributedSession(g, lc.target)
        sess.run(init)
        for _ in range(3):
            sess.run(step, {x: xv})
        np.testing.assert_array_equal(sess.run(w), want)
        sess.close()
        refused = MasterClient(lc.target, timeout=TIMEOUT,
                               security=ClientSecurity(root_ca=certs.ca.read_bytes()))
        with pytest.raises(WorkerError, match="UNAUTHENTICATED"):
            refused.create_session(g)
        refused.channel.close()


def test_offload_server_health_names_its_own_service():
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from isthmus.cloud.offload import OffloadServer
    from isthmus.cloud.offload_model import cloud_part
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, [None, 2], name="x")
        ism.identity(x * 2.0, name="y")
    from isthmus.cloud.offload_model import save_cloud_parts
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.cloud")
        save_cloud_parts(path, [cloud_part(g, ["x:0"], ["y:0"], "p")])
        with OffloadServer(path) as srv:
            with make_channel(srv.address, None) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                for name in ("", "isthmus.Offload"):
                    r = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=TIMEOUT)
                    assert r.status == health_pb2.HealthCheckResponse.SERVING
                with pytest.raises(grpc.RpcError) as e:
                    stub.Check(health_pb2.HealthCheckRequest(service="isthmus.Worker"), timeout=TIMEOUT)
                assert e.value.code() == grpc.StatusCode.NOT_FOUND
