"""Starting an isthmus gRPC server and the channel options every isthmus channel uses: the plumbing
that the task server (server.py), the worker service (rpc.py), the master client (master_rpc.py)
and the offload service (offload.py) share, so that none of them imports another for it."""
from __future__ import annotations

from concurrent import futures
from typing import Optional, Sequence, Tuple

import grpc

from ..wire.security import ServerSecurity
from .errors import WorkerError
from .worker import DEFAULT_MAX_MESSAGE_BYTES


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
    # a restarted peer is found again within about a second (gRPC's default reconnect backoff grows
    # from 1 s to 120 s, which slows recovery after a task comes back)
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000)]


HEALTH_SERVICES = ("", "isthmus.Worker", "isthmus.Master")


def start_grpc_server(handlers: Sequence, host: str = "127.0.0.1", port: int = 0, max_workers: int = 64,
                      max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                      health: bool = True, security: Optional[ServerSecurity] = None,
                      health_services: Sequence[str] = HEALTH_SERVICES) -> Tuple[grpc.Server, int]:
    """A started server with `handlers` (and the health service): (server, bound port).
    `security`: TLS and/or a bearer token on every call (wire/security.py); None: plaintext.
    `health_services`: the service names the health check answers SERVING for ("" = the server)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="isthmus-rpc"),
                         options=channel_options(max_message_bytes) + [("grpc.so_reuseport", 0)],
                         interceptors=security.interceptors() if security else None)
    server.add_generic_rpc_handlers(tuple(handlers))
    if health:
        try:
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


__all__ = ["start_grpc_server", "channel_options", "HEALTH_SERVICES"]
