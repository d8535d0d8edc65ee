"""isthmus.cloud (see DESIGN.md): the gRPC runtime. Importing it registers the DistributedSession
behind `Session(graph, target="grpc://host:port")`; grpc itself loads only when one is made (or
when `LocalCluster`, a cluster of local processes, is first used)."""
from ..core.session import register_remote_session


def _distributed_session(graph, target: str):
    from .session import DistributedSession  # deferred: the session loads grpc and the master
    return DistributedSession(graph, target)


register_remote_session(_distributed_session)


def __getattr__(name: str):
    if name in ("LocalCluster", "LocalClusterError"):  # deferred: local_cluster loads grpc
        from . import local_cluster  # deferred: local_cluster loads grpc
        return getattr(local_cluster, name)
    raise AttributeError(f"module 'isthmus.cloud' has no attribute '{name}'")


__all__ = ["LocalCluster", "LocalClusterError"]
