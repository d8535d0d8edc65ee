"""`isthmus health HOST:PORT`: the standard gRPC health check of an isthmus server or offload
service, with the TLS and token settings of the environment; exit 0 when SERVING (a Kubernetes
exec readiness probe: kubelet's own gRPC probe speaks neither TLS nor tokens)."""
from __future__ import annotations

import argparse
import sys

from isthmus.wire.security import ClientSecurity, make_channel

from .errors import UsageError, positive_float

EXAMPLES = """examples:
  isthmus health 127.0.0.1:2222
  isthmus health localhost:7070 --service isthmus.Offload --timeout 2
TLS and the token come from $ISTHMUS_TLS_CA / $ISTHMUS_TLS_CERT and $ISTHMUS_TOKEN_FILE, as the server's."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog, p.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument("address", metavar="HOST:PORT", help="the server to check")
    p.add_argument("--service", default="", help="the service name to ask about (default: the whole server)")
    p.add_argument("--timeout", type=positive_float, default=3.0, help="seconds (default %(default)s)")


def check(address: str, service: str = "", timeout: float = 3.0) -> str:
    """The server's health status name (SERVING, NOT_SERVING, ...); an unreachable server raises."""
    import grpc  # deferred: grpc is a heavy or optional dependency
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # deferred: grpc_health is a heavy or optional dependency

    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"HOST:PORT {address!r}: expected host:port, e.g. 127.0.0.1:2222")
    with make_channel(address, ClientSecurity.from_env()) as ch:
        try:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as e:
            raise ConnectionError(f"{address}: {e.code().name}: {e.details()}") from None
    return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)


def run(args) -> int:
    status = check(args.address, args.service, args.timeout)
    print(f"{args.address}{' ' + args.service if args.service else ''}: {status}")
    return 0 if status == "SERVING" else 1


