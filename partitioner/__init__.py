"""isthmus.partitioner: split one graph between the edge and the cloud (DESIGN.md, "Splitting a graph").

    cost = CostModel.edge_cloud(LinkModel.parse("5mbps", "40ms"), batch_size=1)
    plan = plan_split(graph, cost, outputs=[y])       # mincut placement + prediction
    print(plan.explain())
    parts = plan.partition()                          # one subgraph per device, Send/Recv between
    y_value, = parts.run({"x": x_value})              # the parts run together, in process

Modules: devices (profiles, links), costmodel, calibrate, problem (constraints and the
objective), client_cost (the edge client's own cost per request, priced in every plan), placement (mincut, greedy, exhaustive, baselines), partition, runner, plan,
threads (the BLAS thread count, which a profile holds only for: ISTHMUS_BLAS_THREADS or set_blas_threads).
"""
from .client_cost import DEFAULT_EDGE_SLOWDOWN, ClientCost
from .client_cost import HERE as CLIENT_HERE
from .costmodel import CostModel, op_cost
from ..wire.link import LinkModel
from .devices import CLOUD, CLOUD_DEVICE, EDGE, EDGE_DEVICE, DeviceProfile
from .measured import node_times_from_kernels
from .partition import Part, Partition, Transfer, partition
from .placement import cloud_only, edge_only, place_exhaustive, place_greedy, place_layer_split, place_mincut
from .plan import AdaptivePlanner, SplitPlan, plan_split
from .plots import graph_svg, latency_svg
from .problem import Constraints, Placement, PlacementError, Problem
from .runner import SplitSession
from .threads import blas_threads, check_threads, limited_blas_threads, set_blas_threads
from .threads import apply_env_once as _apply_blas_env

_apply_blas_env()  # ISTHMUS_BLAS_THREADS, once per process


def __getattr__(name: str):
    if name == "calibrate_profile":
        from .calibrate import calibrate  # deferred: calibrate.py loads scipy.optimize and its op-timing cases
        return calibrate
    raise AttributeError(f"module 'isthmus.partitioner' has no attribute '{name}'")

__all__ = ["CostModel", "op_cost", "DeviceProfile", "LinkModel", "CLOUD", "EDGE", "CLOUD_DEVICE", "EDGE_DEVICE",
           "Part", "Partition", "Transfer", "partition", "place_mincut", "place_greedy", "place_exhaustive", "place_layer_split",
           "edge_only", "cloud_only", "AdaptivePlanner", "SplitPlan", "plan_split", "Constraints", "Placement",
           "PlacementError", "Problem", "SplitSession", "blas_threads", "set_blas_threads", "limited_blas_threads",
           "check_threads", "ClientCost", "CLIENT_HERE", "DEFAULT_EDGE_SLOWDOWN", "node_times_from_kernels",
           "graph_svg", "latency_svg", "calibrate_profile"]
