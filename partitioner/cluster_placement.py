"""Placing a client's graph on a cluster's tasks (a plain dict node name -> device), beside the
edge/cloud placement of placement.py; cloud/master.py and cloud/replicas.py call it.

The rules of TensorFlow's distributed runtime, where a cost model has no say:
- a node the user pinned (`with device("/job:worker/task:1")`) runs there; a partial pin
  is completed with task 0 and the task's CPU:0;
- a variable, the ops that update it (and a control-flow node whose body updates it), and
  the producer and readers of an opaque value form a group that shares one device
  (colocation.py: the rule the edge/cloud Problem applies too);
- a group holding variables and no pin goes to a `ps` task: the one holding the fewest
  variable bytes so far (TF's greedy load balancing), in graph order;
- everything else runs on the default worker (`/job:worker/task:0`, or the first job's
  task 0 when the cluster has no `worker` job).

`cluster` is a cloud/cluster.py ClusterSpec (jobs, num_tasks, address, tasks); its address()
raises a ValueError for a task it does not have.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple

import numpy as np

from ..core.devices import DeviceSpec
from ..core.graph import Graph, Node
from .colocation import colocation_groups
from .problem import PlacementError



class ClusterSpec(Protocol):
    """What placement reads of a cluster (cloud/cluster.py's ClusterSpec has it all)."""
    jobs: List[str]

    def num_tasks(self, job: str) -> int: ...

    def address(self, job: str, index: int) -> str: ...  # ValueError for a task the cluster lacks

    def tasks(self) -> Iterator[Tuple[Any, str]]: ...

PS_JOB = "ps"
WORKER_JOB = "worker"


def task_device(job: str, index: int) -> str:
    return f"/job:{job}/task:{index}/device:CPU:0"


def cluster_devices(cluster: ClusterSpec) -> List[str]:
    return [task_device(t.job, t.index) for t, _ in cluster.tasks()]


def default_worker(cluster: ClusterSpec) -> str:
    job = WORKER_JOB if WORKER_JOB in cluster.jobs else cluster.jobs[0]
    return task_device(job, 0)


def resolve_pin(pin: str, cluster: ClusterSpec, default: str, what: str) -> str:
    """The cluster device a (possibly partial) pin names."""
    try:
        spec = DeviceSpec.parse(pin).merged_onto(DeviceSpec.parse(default))
    except ValueError as e:
        raise PlacementError(f"{what}: {e}") from None
    if spec.job != DeviceSpec.parse(default).job and pin and DeviceSpec.parse(pin).task is None:
        spec = DeviceSpec(spec.job, 0, spec.kind, spec.index)  # /job:ps -> /job:ps/task:0
    try:
        cluster.address(spec.job, spec.task)
    except ValueError as e:  # cloud/cluster.py's ClusterSpecError
        raise PlacementError(f"{what} is pinned to '{pin}': {e}") from None
    if (spec.kind or "CPU") != "CPU" or (spec.index or 0) != 0:
        raise PlacementError(f"{what} is pinned to '{pin}': tasks of this cluster have one device, CPU:0")
    return task_device(spec.job, spec.task)


def variable_devices(graph: Graph, cluster: ClusterSpec) -> Dict[str, str]:
    """Variable name -> the task device place_on_cluster gives it (ps tasks, balanced by bytes)."""
    placement = place_on_cluster(graph, cluster)
    return {n.name: placement[n.name] for n in graph.nodes if n.op == "Variable"}


def pin_replica(graph: Graph, worker: str, variables: Mapping[str, str]) -> None:
    """Pin a replica's graph in place (as TF's replica_device_setter): each variable, with the
    ops that update it, to its device in `variables` (the same in every replica's graph, so
    that all replicas share one copy on the ps tasks), and every other node the user did not
    pin to the replica's own `worker` task. A variable missing from `variables` (and not
    pinned in the graph) is an error:
    two replicas placing it on their own would train different copies."""
    unpinned_before = {n.name for n in graph.nodes if n.device}
    for root, group in colocation_groups(graph.nodes).items():
        devs = {variables.get(n.name) or n.device for n in group if n.op == "Variable"}
        missing = [n.name for n in group if n.op == "Variable" and not (variables.get(n.name) or n.device)]
        if missing:
            raise PlacementError(f"variable '{missing[0]}' has no device in the replicas' variable placement "
                                 f"(every replica must build the same variables)")
        if len(devs) > 1:
            raise PlacementError(f"variables {', '.join(sorted(n.name for n in group if n.op == 'Variable'))} "
                                 f"share updates but are placed on {', '.join(sorted(devs))}")
        dev = next(iter(devs)) if devs else worker
        for n in group:
            if not n.device or devs:
                n.device = dev
    device_of = {n: n.device for n in graph.nodes}
    for n, dev in colocate_sources(graph, device_of, [n for n in graph.nodes if n.name not in unpinned_before]).items():
        n.device = dev


def place_on_cluster(graph: Graph, cluster: ClusterSpec, default: Optional[str] = None,
                     previous: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Node name -> device for every node of the graph.

    The whole graph is placed at once, so that every step of a session agrees (a variable
    placed for its initializer stays where its training updates run); `previous` keeps the
    devices of an earlier placement when the graph has grown since.
    """
    default = default or default_worker(cluster)
    previous = previous or {}
    members = colocation_groups(graph.nodes)
    ps = [task_device(PS_JOB, i) for i in range(cluster.num_tasks(PS_JOB))]
    load = {d: 0 for d in ps}
    placement: Dict[str, str] = {}
    for root in sorted(members, key=lambda r: r.index):
        group = members[root]
        pins = {}
        for n in group:
            if n.device:
                pins.setdefault(resolve_pin(n.device, cluster, default, f"node '{n.name}' ({n.op})"), n)
        if len(pins) > 1:
            names = ", ".join(f"'{n.name}' on {d}" for d, n in pins.items())
            raise PlacementError(f"nodes that must share a device (a variable and its updates, or an opaque "
                                 f"value) are pinned apart: {names}")
        variables = [n for n in group if n.op == "Variable"]
        before = {previous[n.name] for n in group if n.name in previous}
        if len(before) > 1 or (before and pins and before != set(pins)):
            raise PlacementError(f"nodes {', '.join(repr(n.name) for n in group[:6])} must share a device, "
                                 f"but earlier steps placed them on {', '.join(sorted(before | set(pins)))}")
        if before:
            dev = next(iter(before))
        elif pins:
            dev = next(iter(pins))
        elif variables and ps:
            dev = min(ps, key=lambda d: (load[d], ps.index(d)))
        else:
            dev = default
        if dev in load:
            load[dev] += sum(_nbytes(v) for v in variables)
        for n in group:
            placement[n.name] = dev
    device_of = {n: placement[n.name] for n in graph.nodes}
    fixed = [n for n in graph.nodes if n.device or n.name in previous]
    for n, dev in colocate_sources(graph, device_of, fixed).items():
        placement[n.name] = dev
    return placement


def colocate_sources(graph: Graph, device_of: Mapping[Node, str], fixed: Sequence[Node]) -> Dict[Node, str]:
    """Moves that spare transfers: a Const goes where all of its consumers run (an optimizer's
    learning rate, a variable's initial value: to the ps task, not sent there every step), and
    a NoOp fed only by control edges runs where the fewest of them must travel (a training
    step's `group` of the ps updates runs on the ps: the gradients' control edges go there
    anyway, for the updates). Nodes in `fixed` (pinned, or placed by an earlier step) stay."""
    keep = set(fixed)
    users = graph.consumers()
    moved: Dict[Node, str] = {}
    dev = dict(device_of)
    for n in graph.nodes:
        if n in keep or n.op != "Const" or not users[n]:
            continue
        targets = {dev[u] for u in users[n]}
        if len(targets) == 1 and dev[n] not in targets:
            moved[n] = dev[n] = next(iter(targets))
    for n in graph.nodes:  # topological: a NoOp's inputs have their final devices
        if n in keep or n.op != "NoOp" or n.inputs or not n.control_inputs:
            continue

        def new_edges(d: str) -> int:  # control edges into d that no other consumer on d brings
            return sum(1 for c in n.control_inputs
                       if dev[c] != d and not any(u is not n and dev[u] == d for u in users[c]))
        best = min(sorted({dev[c] for c in n.control_inputs}), key=new_edges)
        if new_edges(best) < new_edges(dev[n]):
            moved[n] = dev[n] = best
    return moved


def _nbytes(var: Node) -> int:
    t = var.outputs[0]
    n = 1
    for s in t.shape:
        n *= s if s is not None and s >= 0 else 1
    return n * np.dtype(t.dtype).itemsize
