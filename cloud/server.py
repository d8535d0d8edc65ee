"""One task of a cluster: a gRPC server with the Worker, the Master and health services.

    isthmus server --cluster SPEC --job worker --task 0
    isthmus server                      # cluster and task from $TF_CONFIG (or $ISTHMUS_CLUSTER + flags)

Every task can act as the master for clients that connect to it (as in TensorFlow), and
answers the standard gRPC health check (grpc.health.v1.Health, service "" and each
isthmus service). The server binds the port of its own address in the spec. Without TLS
and a token it binds 127.0.0.1 whatever the spec's host (a hostname, 0.0.0.0, an IP);
with both, the spec's host (every interface for a hostname); `--insecure`
(`insecure=True`) binds the spec's host without them and warns (docs/security.md).

Tasks on one host pass big tensors through shared memory (cloud/shm.py) unless
`shm_enabled=False`, `--no-shm` or ISTHMUS_SHM=0; a starting server unlinks the segments
that killed processes left behind.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import sys
import threading
import warnings
from concurrent import futures
from typing import Any, Dict, Optional, Sequence, Tuple

import grpc

from ..core.device_runtime import apply_device_flag
from ..partitioner.cluster_placement import default_worker
from ..wire.security import ClientSecurity, SecurityError, ServerSecurity
from . import shm
from .cluster import ClusterSpec, ClusterSpecError, TaskId, from_env, parse
from .errors import WorkerError
from .limits import DEFAULT_MAX_WAIT_S, DEFAULT_PER_PEER, WaitLimits
from .master import DEFAULT_STEP_TIMEOUT_S, Master
from .master_rpc import master_handler
from .rendezvous import DEFAULT_RECV_TIMEOUT_S
from .rpc import WorkerClient, channel_options, worker_handler
from .worker import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_RPC_TIMEOUT_S, Worker

HEALTH_SERVICES = ("", "isthmus.Worker", "isthmus.Master")
LOOPBACK = "127.0.0.1"


class InsecureBindWarning(UserWarning):
    """A server listens beyond loopback without TLS and a token (--insecure)."""


def is_loopback(host: str) -> bool:
    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def safe_bind_host(host: str, security: Optional[ServerSecurity] = None, insecure: bool = False,
                   what: str = "server", quiet: bool = False) -> str:
    """The host a server may bind: `host` when it is loopback, or when TLS and a token are on
    (or `insecure`, with a warning); else 127.0.0.1, saying so (unless `quiet`)."""
    if is_loopback(host) or (security is not None and security.exposable):
        return host
    if quiet:
        return host if insecure else LOOPBACK
    if insecure:
        warnings.warn(f"{what}: listening on {host} without TLS and a token (--insecure): anyone who "
                      "can reach the port can read and overwrite variables and run any graph",
                      InsecureBindWarning, stacklevel=3)
        return host
    print(f"{what}: binding {LOOPBACK} instead of {host}: without TLS and a token a server listens on "
          "loopback only (give --tls-cert/--tls-key and --token-file, or --insecure)", file=sys.stderr)
    return LOOPBACK


class _Malformed:
    """What a request deserializer returns for bytes it cannot parse (gRPC would answer INTERNAL)."""
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def _tolerant(deserialize):
    def parse(data):
        try:
            return deserialize(data)
        except Exception as e:  # noqa: BLE001  (protobuf's DecodeError, or a hand-written reader's)
            return _Malformed(e)
    return parse


class _MalformedGuard(grpc.ServerInterceptor):
    """Undecodable request bytes end INVALID_ARGUMENT, naming the method, before any handler runs."""

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = details.method

        def guard(behaviour):
            def run(request, context):
                if isinstance(request, _Malformed):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: malformed request bytes: "
                                  f"{type(request.error).__name__}: {request.error}")
                return behaviour(request, context)
            return run
        for attr, make in (("unary_unary", grpc.unary_unary_rpc_method_handler),
                           ("unary_stream", grpc.unary_stream_rpc_method_handler)):
            fn = getattr(handler, attr, None)
            if fn is not None:
                return make(guard(fn), request_deserializer=_tolerant(handler.request_deserializer),
                            response_serializer=handler.response_serializer)
        return handler   # streaming requests: each message is parsed as it is read


def start_grpc_server(handlers: Sequence, host: str = "127.0.0.1", port: int = 0, max_workers: int = 64,
                      max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                      health: bool = True, security: Optional[ServerSecurity] = None,
                      health_services: Sequence[str] = HEALTH_SERVICES,
                      insecure: bool = False) -> Tuple[grpc.Server, int]:
    """A started server with `handlers` (and the health service): (server, bound port).
    `security`: TLS and/or a bearer token on every call (wire/security.py); None: plaintext.
    Without TLS and a token it binds loopback whatever `host` says, unless `insecure`
    (safe_bind_host). `health_services`: the service names the health check answers SERVING for."""
    host = safe_bind_host(host, security, insecure)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="isthmus-rpc"),
                         options=channel_options(max_message_bytes) + [("grpc.so_reuseport", 0)],
                         interceptors=(security.interceptors() if security else []) + [_MalformedGuard()])
    server.add_generic_rpc_handlers(tuple(handlers))
    if health:
        try:
            # deferred: grpc_health is optional (its ImportError is handled)
            from grpc_health.v1 import health as health_mod, health_pb2, health_pb2_grpc
        except ImportError:  # grpcio-health-checking is a dependency; without it, no health service
            pass
        else:
            hs = health_mod.HealthServicer()
            for name in health_services:
                hs.set(name, health_pb2.HealthCheckResponse.SERVING)
            health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    try:
        bound = (security.add_port(server, f"{host}:{port}") if security
                 else server.add_insecure_port(f"{host}:{port}"))
    except RuntimeError as e:
        raise WorkerError(f"cannot listen on {host}:{port}: {e}") from None
    if bound == 0:
        raise WorkerError(f"cannot listen on {host}:{port}")
    server.start()
    return server, bound


def serve_worker(worker: Worker, host: str = "127.0.0.1", port: int = 0, max_workers: int = 64,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, extra_handlers: Sequence = (), security=None,
                 insecure: bool = False):
    """A started gRPC server for `worker` alone (port 0: a free port): (server, port); Server below
    serves a whole task (worker, master, health). `security`: a wire.security.ServerSecurity."""
    limits = WaitLimits(max(DEFAULT_MAX_WAIT_S, worker.recv_timeout), threads=max_workers)
    return start_grpc_server([worker_handler(worker, limits), *extra_handlers], host, port, max_workers,
                             max_message_bytes, security=security, insecure=insecure)


def bind_host(address: str) -> str:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return "127.0.0.1"
    try:
        ipaddress.ip_address(host)
        return host if ":" not in host else f"[{host}]"
    except ValueError:
        return "0.0.0.0"


class Server:
    """Task `job`/`task` of `cluster`, serving until stop(). With `cluster=None` the server
    starts on `port` (0: a free one) and learns its cluster later (`set_cluster`), as the
    local-cluster helper does to start tasks on free ports without races."""

    def __init__(self, cluster: Optional[ClusterSpec], job: str, task: int, host: Optional[str] = None,
                 port: Optional[int] = None, max_workers: int = 64,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, recv_timeout: float = DEFAULT_RECV_TIMEOUT_S,
                 rpc_timeout: float = DEFAULT_RPC_TIMEOUT_S, step_timeout: float = DEFAULT_STEP_TIMEOUT_S,
                 security: Optional[ServerSecurity] = None, client_security: Optional[ClientSecurity] = None,
                 shm_enabled: Optional[bool] = None, insecure: bool = False,
                 max_recv_wait_s: float = DEFAULT_MAX_WAIT_S, max_waiting_per_peer: int = DEFAULT_PER_PEER):
        self.task_id = TaskId(job, int(task))
        self.shm_enabled = shm.enabled_by_env() if shm_enabled is None else bool(shm_enabled)
        shm.sweep()  # segments of killed processes
        self.security = security
        self.client_security = client_security
        self.cluster: Optional[ClusterSpec] = None
        self.rpc_timeout = rpc_timeout
        self.max_message_bytes = max_message_bytes
        self._clients: Dict[str, Any] = {}
        self._lock = threading.Lock()
        self.worker = Worker(self.task_id.name, peers=self.task_for_device, recv_timeout=recv_timeout, wire=True,
                             shm_enabled=self.shm_enabled)
        self.master = Master(None, self.task_for_device, step_timeout=step_timeout)
        if cluster is not None:
            address = cluster.address(job, task)
            host = host or bind_host(address)
            port = int(address.rsplit(":", 1)[1]) if port is None else port
        self.host = safe_bind_host(host or LOOPBACK, security, insecure, quiet=True)
        # RecvTensor's wait is capped here, whatever the caller asks (never below --recv-timeout)
        self.limits = WaitLimits(max(max_recv_wait_s, recv_timeout), max_waiting_per_peer, threads=max_workers)
        self.server, self.port = start_grpc_server([worker_handler(self.worker, self.limits),
                                                    master_handler(self.master)],
                                                   host or LOOPBACK, port or 0, max_workers, max_message_bytes,
                                                   security=security, insecure=insecure)
        if cluster is not None:
            self.set_cluster(cluster)

    def set_cluster(self, cluster: ClusterSpec) -> None:
        cluster.address(self.task_id.job, self.task_id.index)
        self.cluster = cluster
        self.master.cluster = cluster
        self.master.default_device = default_worker(cluster)

    @property
    def target(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def task_for_device(self, device: str):
        """The Worker (this task) or a WorkerClient (another task) holding `device`."""
        if self.cluster is None:
            raise WorkerError(f"{self.task_id}: the cluster is not known yet")
        t = self.cluster.task_of(device)
        if t == self.task_id:
            return self.worker
        c = self._clients.get(t.name)
        if c is None:
            with self._lock:
                c = self._clients.get(t.name)
                if c is None:
                    c = self._clients[t.name] = WorkerClient(self.cluster.address(t.job, t.index),
                                                             timeout=self.rpc_timeout, name=t.name,
                                                             max_message_bytes=self.max_message_bytes,
                                                             security=self.client_security,
                                                             shm_enabled=self.shm_enabled)
        return c

    def stop(self, grace: Optional[float] = None) -> None:
        self.worker.table.close()   # waiting RecvTensors end now, not at their cap
        self.master.close()
        self.server.stop(grace).wait(10)
        for c in self._clients.values():
            c.close()
        self.worker.close()

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self.server.wait_for_termination(timeout)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# ---- the command -----------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", help="cluster spec: JSON, a file, TF_CONFIG JSON, or "
                                          "'ps=host:port;worker=host:port,host:port' "
                                          "(default: $ISTHMUS_CLUSTER, then $TF_CONFIG)")
    parser.add_argument("--job", help="this task's job (default: TF_CONFIG's task type)")
    parser.add_argument("--task", type=int, help="this task's index (default: TF_CONFIG's task index, else 0)")
    parser.add_argument("--bind", help="host to listen on (default: from the task's address)")
    parser.add_argument("--port", type=int, help="port to listen on (default: the task's address's; 0: a free one)")
    parser.add_argument("--cluster-from-stdin", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu", "auto"],
                        help="where a worker places its part's nodes (ps tasks stay on the CPU; default cpu)")
    parser.add_argument("--recv-timeout", type=float, default=DEFAULT_RECV_TIMEOUT_S,
                        help="seconds a Recv waits for its tensor (default %(default)s)")
    parser.add_argument("--max-recv-wait", type=float, default=DEFAULT_MAX_WAIT_S,
                        help="longest wait a RecvTensor caller may ask for, in seconds (default %(default)s)")
    parser.add_argument("--max-waiting-per-peer", type=int, default=DEFAULT_PER_PEER,
                        help="RecvTensor calls one caller (one host, however many connections it opens) may "
                             "have waiting at once; more get RESOURCE_EXHAUSTED (default %(default)s)")
    parser.add_argument("--tls-cert", help="PEM certificate chain: serve TLS (default: $ISTHMUS_TLS_CERT)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert (default: $ISTHMUS_TLS_KEY)")
    parser.add_argument("--tls-client-ca", help="require client certificates signed by this CA "
                                                "(default: $ISTHMUS_TLS_CLIENT_CA)")
    parser.add_argument("--tls-ca", help="CA the other tasks' certificates chain to (default: $ISTHMUS_TLS_CA, "
                                         "else --tls-cert itself)")
    parser.add_argument("--token-file", help="require this bearer token on every call, and send it to the "
                                             "other tasks (default: $ISTHMUS_TOKEN_FILE)")
    parser.add_argument("--client-token-file",
                        help="also accept this token, for clients: it may run graphs that write no state and "
                             "read their fetches, nothing else (default: $ISTHMUS_CLIENT_TOKEN_FILE)")
    parser.add_argument("--insecure", action="store_true",
                        help="listen on the spec's (or --bind's) host even without TLS and a token; without "
                             "both a server otherwise binds 127.0.0.1 only")
    parser.add_argument("--no-shm", action="store_true",
                        help="never pass tensors through shared memory, even to tasks on this host "
                             "(default: on unless $ISTHMUS_SHM=0)")
    parser.add_argument("--max-message-mb", type=float, default=DEFAULT_MAX_MESSAGE_BYTES / (1 << 20),
                        help="largest gRPC message in MiB (default %(default)s); bigger tensors stream")


def _resolve(args) -> Tuple[Optional[ClusterSpec], str, int]:
    cluster, tid = None, None
    if args.cluster:
        cluster, tid = parse(args.cluster)
    elif not args.cluster_from_stdin:
        got = from_env()
        if got is None:
            raise ClusterSpecError("no cluster spec: give --cluster, or set $ISTHMUS_CLUSTER or $TF_CONFIG")
        cluster, tid = got
    job = args.job or (tid.job if tid else None)
    if job is None:
        raise ClusterSpecError("which task is this? give --job (and --task), or a TF_CONFIG with a task")
    task = args.task if args.task is not None else (tid.index if tid and tid.job == job else 0)
    if cluster is not None:
        cluster.address(job, task)
    return cluster, job, task


def security_from_args(args):
    """(ServerSecurity, ClientSecurity) from the flags, each flag defaulting to its variable."""
    env = dict(os.environ)
    for flag, var in (("tls_cert", "ISTHMUS_TLS_CERT"), ("tls_key", "ISTHMUS_TLS_KEY"),
                      ("tls_client_ca", "ISTHMUS_TLS_CLIENT_CA"), ("tls_ca", "ISTHMUS_TLS_CA"),
                      ("token_file", "ISTHMUS_TOKEN_FILE"), ("client_token_file", "ISTHMUS_CLIENT_TOKEN_FILE")):
        if getattr(args, flag, None):
            env[var] = getattr(args, flag)
    return ServerSecurity.from_env(env), ClientSecurity.from_env(env)


def run(args) -> int:
    try:
        cluster, job, task = _resolve(args)
        apply_device_flag(getattr(args, "device", "cpu"), job, "isthmus server")
        security, client_security = security_from_args(args)
        server = Server(cluster, job, task, host=args.bind, port=args.port, recv_timeout=args.recv_timeout,
                        max_message_bytes=int(args.max_message_mb * (1 << 20)),
                        security=security, client_security=client_security,
                        shm_enabled=False if args.no_shm else None, insecure=args.insecure,
                        max_recv_wait_s=args.max_recv_wait, max_waiting_per_peer=args.max_waiting_per_peer)
    except (ClusterSpecError, WorkerError, SecurityError) as e:
        print(f"isthmus server: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.cluster_from_stdin:  # the local-cluster handshake: port out, cluster in, ready out
        print(f"ISTHMUS_PORT {server.port}", flush=True)
        line = sys.stdin.readline()
        try:
            server.set_cluster(ClusterSpec.parse(json.loads(line)))
        except (ValueError, ClusterSpecError) as e:
            print(f"isthmus server: bad cluster from the parent: {e}", file=sys.stderr)
            server.stop()
            return 2
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
        print("ISTHMUS_READY", flush=True)
    else:
        mode = security.describe() if security else "plaintext, no token: keep it on a trusted network"
        print(f"isthmus server: /job:{job}/task:{task} listening on port {server.port} ({mode})",
              file=sys.stderr, flush=True)
    while not stop.wait(1.0):
        pass
    server.stop(grace=1.0)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="isthmus server", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
