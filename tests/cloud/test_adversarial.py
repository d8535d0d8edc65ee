"""Adversarial checks of the default settings (issue 23): every attack here must fail.

Servers are started by the tests on free ports; attacks come from this process, over loopback
or over this host's own non-loopback address. Each test lists the attacks that succeeded and
asserts the list is empty (0 unauthorised operations), after checking that the legitimate
caller still works (so a test cannot pass because nothing works at all).
"""
import socket
import warnings

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import isthmus as ism  # noqa: E402
from isthmus.cloud import graph_codec, rpc  # noqa: E402
from isthmus.cloud.cluster import ClusterSpec  # noqa: E402
from isthmus.cloud.errors import PermissionDenied, TaskUnavailable, WorkerError  # noqa: E402
from isthmus.cloud.master_rpc import MasterClient  # noqa: E402
from isthmus.cloud.server import InsecureBindWarning, Server, safe_bind_host  # noqa: E402
from isthmus.wire.security import ClientSecurity, ServerSecurity  # noqa: E402

T = 3.0   # every call's deadline
DEV = "/job:worker/task:0/device:CPU:0"
CLUSTER_TOKEN, CLIENT_TOKEN = "cluster-secret-1", "client-secret-2"


def _own_address():
    """An address of this host, other than 127.0.0.1, that a server bound to every interface answers
    on: 127.0.0.2. It is in the loopback range, so no test traffic ever leaves this machine (the
    house rule), yet a server that binds 127.0.0.1 only is unreachable there. None where it does not
    work (then the network half is skipped)."""
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        probe.listen(1)
        try:
            with socket.create_connection(("127.0.0.2", probe.getsockname()[1]), timeout=2):
                return "127.0.0.2"
        except OSError:
            return None


def _spec_ip():
    """A non-loopback address to write into a cluster spec (only ever bound, never sent to)."""
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        return "192.0.2.250"
    return "192.0.2.250" if addr.startswith("127.") else addr


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphs():
    """(trainer graph: variable w, init, read; attacker graph: writes 99 into w; reader graph)."""
    g = ism.Graph(seed=0)
    with g.as_default():
        w = ism.Variable(np.full((2,), 1.5, np.float32), name="w")
        ism.global_variables_initializer()
        ism.identity(w.value(), name="read")
    bad = ism.Graph(seed=0)
    with bad.as_default():
        w2 = ism.Variable(np.zeros((2,), np.float32), name="w")
        w2.assign(np.full((2,), 99.0, np.float32), name="overwrite")
    rd = ism.Graph(seed=0)
    with rd.as_default():
        w3 = ism.Variable(np.zeros((2,), np.float32), name="w")
        ism.identity(w3.value(), name="read")
    return g, bad, rd


def _start(security=None, spec_host="127.0.0.1", insecure=False):
    port = _free_port()
    cluster = ClusterSpec({"worker": [f"{spec_host}:{port}"]})
    return Server(cluster, "worker", 0, security=security, insecure=insecure, recv_timeout=2.0), port


def _attacks(addr, client_sec, trainer_handle):
    """Every unauthorised operation tried against `addr`; the names of those that succeeded."""
    _, bad, _ = _graphs()
    done = []

    def attempt(name, fn):
        try:
            fn()
            done.append(name)
        except (ism.IsthmusError, grpc.RpcError):
            pass

    w = rpc.WorkerClient(addr, timeout=T, security=client_sec, shm_enabled=False)
    m = MasterClient(addr, timeout=T, security=client_sec or ClientSecurity(tls=False))
    try:
        attempt("read: GetStatus lists graph handles", w.status)
        attempt("write: CreateSession of an Assign", lambda: m.run_step(m.create_session(bad), {}, [],
                                                                       ["overwrite"], timeout=T))
        attempt("write: RunStep of the trainer's session", lambda: m.run_step(trainer_handle, {}, [], ["init"],
                                                                             timeout=T))
        attempt("graph run: RegisterGraph", lambda: w.register_graph(bad, DEV))
        attempt("graph run: RunGraph", lambda: w.run_graph(trainer_handle, 1, {}, [], timeout=T))
        attempt("read: RecvTensor", lambda: w.recv_tensor(DEV, "/job:x/task:0/device:CPU:0", "t", 1, timeout=1.0))
        attempt("deregistration: DeregisterGraph", lambda: w.deregister_graph("/job:worker/task:0/graph:x:1"))
        attempt("deregistration: CloseSession of the trainer's", lambda: m.close_session(trainer_handle))
        attempt("abort: AbortStep", lambda: w.abort_step(1, RuntimeError("x"), timeout=T))
    finally:
        w.close()
        m.close()
    return done


def _trainer(addr, sec):
    g, _, _ = _graphs()
    m = MasterClient(addr, timeout=T, security=sec)
    h = m.create_session(graph_codec.encode(g))
    m.run_step(h, {}, [], ["init"], timeout=T)
    return m, h


def _value(m, h):
    return m.run_step(h, {}, ["read:0"], timeout=T)[0][0][0]


@pytest.mark.parametrize("spec_host", ["0.0.0.0", "hostname", "own-ip"])
def test_default_server_is_loopback_only_whatever_the_spec_says(spec_host):
    own = _own_address()
    host = {"0.0.0.0": "0.0.0.0", "hostname": socket.gethostname(), "own-ip": _spec_ip()}[spec_host]
    server, port = _start(spec_host=host)
    try:
        assert server.host == "127.0.0.1"
        m, h = _trainer(f"127.0.0.1:{port}", ClientSecurity(tls=False))   # the local user works
        assert _value(m, h) == 1.5
        if own is None:
            pytest.skip("no non-loopback address on this host: the bind itself is checked above")
        done = _attacks(f"{own}:{port}", None, h)
        assert done == [], f"unauthorised operations over {own}: {done}"
        assert _value(m, h) == 1.5
        m.close()
    finally:
        server.stop()


def test_insecure_binds_the_spec_host_and_warns():
    own = _own_address()
    if own is None:
        pytest.skip("no non-loopback address on this host")
    with pytest.warns(InsecureBindWarning, match="without TLS and a token"):
        server, port = _start(spec_host="0.0.0.0", insecure=True)
    try:
        # reachable from the network: the check the default test relies on can fail
        with rpc.WorkerClient(f"{own}:{port}", timeout=T, shm_enabled=False) as c:
            assert c.status()["task"] == "/job:worker/task:0"
    finally:
        server.stop()


def test_tls_and_token_may_bind_beyond_loopback_without_warning(tmp_path):
    pytest.importorskip("cryptography")
    from ..tls_certs import make_certs
    certs = make_certs(tmp_path)
    tls_only = ServerSecurity.from_files(str(certs.server_cert), str(certs.server_key))
    full = ServerSecurity.from_files(str(certs.server_cert), str(certs.server_key), token="t0ken")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert safe_bind_host("0.0.0.0", full) == "0.0.0.0"
        assert safe_bind_host("0.0.0.0", tls_only) == "127.0.0.1"          # TLS alone is not enough
        assert safe_bind_host("0.0.0.0", ServerSecurity(token="t0ken")) == "127.0.0.1"   # nor a token alone
        assert safe_bind_host("::1") == "::1" and safe_bind_host("localhost") == "localhost"


def test_token_roles_allow_no_unauthorised_operation():
    sec = ServerSecurity(token=CLUSTER_TOKEN, client_token=CLIENT_TOKEN)
    server, port = _start(security=sec)
    addr = f"127.0.0.1:{port}"
    cluster_c = ClientSecurity(tls=False, token=CLUSTER_TOKEN)
    client_c = ClientSecurity(tls=False, token=CLIENT_TOKEN)
    try:
        m, h = _trainer(addr, cluster_c)
        assert _value(m, h) == 1.5
        for who, sec_c in (("no token", None), ("a wrong token", ClientSecurity(tls=False, token="guess")),
                           ("the client token", client_c)):
            done = _attacks(addr, sec_c, h)
            assert done == [], f"unauthorised operations with {who}: {done}"
        assert _value(m, h) == 1.5   # the variable was never overwritten
        # what a client token may do: run a graph that only reads, and read its fetches
        _, bad, rd = _graphs()
        c = MasterClient(addr, timeout=T, security=client_c)
        hr = c.create_session(graph_codec.encode(rd))
        assert c.run_step(hr, {}, ["read:0"], timeout=T)[0][0].tolist() == [1.5, 1.5]
        hb = c.create_session(graph_codec.encode(bad))
        with pytest.raises(PermissionDenied, match="'overwrite' \\(Assign\\) writes state"):
            c.run_step(hb, {}, [], ["overwrite"], timeout=T)
        with pytest.raises(PermissionDenied, match="'w/Assign' \\(Assign\\) writes state"):
            c.run_step(hr, {}, [], ["w/Assign"], timeout=T)
        assert _value(m, h) == 1.5
        c.close_session(hr)   # its own session
        c.close_session(hb)
        with pytest.raises(WorkerError, match="PERMISSION_DENIED.*cluster token"):
            with rpc.WorkerClient(addr, timeout=T, security=client_c, shm_enabled=False) as w:
                w.status()
        c.close()
        m.close()
    finally:
        server.stop()


def test_client_token_needs_a_different_cluster_token():
    from isthmus.wire.security import SecurityError
    with pytest.raises(SecurityError, match="cluster token"):
        ServerSecurity(client_token="only-this")
    with pytest.raises(SecurityError, match="differs"):
        ServerSecurity(token="same", client_token="same")


def test_session_handles_are_not_guessable():
    server, port = _start()
    try:
        g, _, _ = _graphs()
        m = MasterClient(f"127.0.0.1:{port}", timeout=T, security=ClientSecurity(tls=False))
        h = m.create_session(graph_codec.encode(g))
        assert len(h.rsplit(":", 1)[1]) == 32   # 128 random bits
        m.close()
    finally:
        server.stop()


def test_the_attack_list_detects_success_with_the_cluster_token():
    """The control: with the cluster token the same attacks do succeed, so an empty list above
    means refused, not broken."""
    sec = ServerSecurity(token=CLUSTER_TOKEN, client_token=CLIENT_TOKEN)
    server, port = _start(security=sec)
    addr = f"127.0.0.1:{port}"
    cluster_c = ClientSecurity(tls=False, token=CLUSTER_TOKEN)
    try:
        m, h = _trainer(addr, cluster_c)
        done = _attacks(addr, cluster_c, h)
        for name in ("read: GetStatus lists graph handles", "write: CreateSession of an Assign",
                     "graph run: RegisterGraph", "deregistration: CloseSession of the trainer's"):
            assert name in done
        m.close()
    finally:
        server.stop()


def _assert_invalid_argument(port, method):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        if method.endswith("Stream"):
            call = ch.unary_stream(method, request_serializer=None, response_deserializer=None)
            fn = lambda: list(call(b"\xff\xff\xff\xff", timeout=T))  # noqa: E731
        else:
            call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
            fn = lambda: call(b"\xff\xff\xff\xff", timeout=T)  # noqa: E731
        with pytest.raises(grpc.RpcError) as ei:
            fn()
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value.details()
        assert f"{method}: malformed request bytes" in ei.value.details()


@pytest.mark.parametrize("method", [f"/isthmus.Master/{m}" for m in (
    "CreateSession", "ExtendSession", "RunStep", "CloseSession", "ListDevices")] + [f"/isthmus.Worker/{m}" for m in (
    "RegisterGraph", "RunGraph", "RecvTensor", "RecvTensorStream", "AbortStep", "DeregisterGraph", "GetStatus")])
def test_undecodable_bytes_get_invalid_argument_on_every_service(method):
    server, port = _start()
    try:
        _assert_invalid_argument(port, method)
    finally:
        server.stop()


def test_undecodable_bytes_get_invalid_argument_on_the_offload_service():
    from isthmus.cloud.offload import OffloadServer
    from isthmus.cloud.offload_model import CloudModel, cloud_part
    g = ism.Graph()
    with g.as_default():
        ism.relu(ism.placeholder("float32", (None, 2), name="x"), name="y")
    with OffloadServer(CloudModel("m", {"whole": cloud_part(ism.Session(g), ["x"], ["y"], "whole")})) as srv:
        for m in ("Describe", "Infer", "Stats"):
            _assert_invalid_argument(srv.port, f"/isthmus.Offload/{m}")


@pytest.mark.parametrize("insecure", [False, True])
def test_isthmus_server_command_binds_loopback_unless_insecure(insecure):
    """`isthmus server` with a spec naming 0.0.0.0: loopback and a note by default; --insecure binds
    every interface and warns."""
    import subprocess
    import sys
    import time
    port = _free_port()
    cmd = [sys.executable, "-m", "isthmus.cloud.server", "--cluster", f"worker=0.0.0.0:{port}", "--job", "worker"]
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("ISTHMUS_")}
    p = subprocess.Popen(cmd + (["--insecure"] if insecure else []), env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        err, deadline = "", time.monotonic() + 60
        while "listening on port" not in err and time.monotonic() < deadline and p.poll() is None:
            err += p.stderr.readline()
        assert "listening on port" in err, err
        if insecure:
            assert "InsecureBindWarning" in err and "without TLS and a token" in err
        else:
            assert "binding 127.0.0.1 instead of 0.0.0.0" in err
        own = _own_address()
        if own is not None:
            reached = True
            try:
                with rpc.WorkerClient(f"{own}:{port}", timeout=T, shm_enabled=False) as c:
                    c.status()
            except WorkerError:
                reached = False
            assert reached == insecure
    finally:
        p.terminate()
        p.wait(20)


def _describe(address):
    from isthmus.proto import offload_pb2, offload_pb2_grpc
    with grpc.insecure_channel(address) as ch:
        return offload_pb2_grpc.OffloadStub(ch).Describe(offload_pb2.DescribeRequest(), timeout=T)


def test_the_offload_service_binds_loopback_unless_insecure():
    """`isthmus serve --host 0.0.0.0` (OffloadServer) without TLS and a token: 127.0.0.1 only; with
    --insecure (insecure=True) the host asked for, and a warning."""
    from isthmus.cloud.offload import OffloadServer
    from isthmus.cloud.offload_model import CloudModel, cloud_part
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 2), name="x")
        y = ism.relu(x, name="y")
    model = CloudModel("m", {"whole": cloud_part(ism.Session(g), ["x"], [y], "whole")})
    own = _own_address()
    with OffloadServer(model, host="0.0.0.0") as srv:
        assert [p.name for p in _describe(f"127.0.0.1:{srv.port}").parts] == ["whole"]   # the local user works
        if own is not None:
            with pytest.raises(grpc.RpcError) as e:
                _describe(f"{own}:{srv.port}")
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    if own is None:
        pytest.skip("no non-loopback address on this host: the loopback half is checked above")
    with pytest.warns(InsecureBindWarning, match="without TLS and a token"):
        srv = OffloadServer(model, host="0.0.0.0", insecure=True)
    try:
        assert [p.name for p in _describe(f"{own}:{srv.port}").parts] == ["whole"]   # the check above can fail
    finally:
        srv.stop()
