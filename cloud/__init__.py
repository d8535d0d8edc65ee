"""isthmus.cloud (see DESIGN.md): the gRPC runtime. `LocalCluster` (a cluster of local processes)
loads grpc when first used."""
def __getattr__(name: str):
    if name in ("LocalCluster", "LocalClusterError"):  # deferred: local_cluster loads grpc
        from . import local_cluster
        return getattr(local_cluster, name)
    raise AttributeError(f"module 'isthmus.cloud' has no attribute '{name}'")


__all__ = ["LocalCluster", "LocalClusterError"]
