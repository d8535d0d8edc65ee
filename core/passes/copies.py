"""Device placement inside one task, and the copy nodes where a tensor changes device.

Every node gets a local device (`/device:CPU:0` or `/device:GPU:k`): its pin, else the session's
default, except ops that only the host runs (feeds, host random generators, control flow, Send/Recv)
and ops that update a variable, which follow the variable. Where a value is consumed on another
device than it was made on, one DeviceCopy node per tensor per destination moves it (a constant is
re-made on the destination instead: nothing moves at run time). Feeds land on the host; every
fetched tensor comes back to the host once. A copy that uploads the labels of a GPU cross-entropy
checks their range on the host (the GPU kernel would need a sync to, and gives NaN instead).
"""
from __future__ import annotations

import weakref
from typing import Callable, Dict, Optional, Sequence, Tuple

from ..device_runtime import HOST, local_name
from ..devices import DeviceSpec
from ..graph import Graph, Node, Tensor
from .simplify import Rewrite

# ops whose kernels only the host runs: feeds, numpy random generators, host-side control flow
# and the cross-task transfers
HOST_OPS = frozenset({"Placeholder", "RandomNormal", "RandomUniform", "RandomUniformInt", "TruncatedNormal",
                      "Dropout", "Send", "Recv", "If", "While", "WhileGrad", "Shape", "Range", "NoOp",
                      "Resize", "ResizeGrad",
                      # sequential, data-sized outputs: the host runs them (as TensorFlow's CPU-only kernels)
                      "NonMaxSuppression", "Unique"})
# inputs that hold sizes, axes or indices the kernel turns into Python ints: kept in host memory
# even when the node runs on a GPU (TensorFlow's HostMemory)
_HOST_INPUTS_FROM = {"Fill": 0, "ReshapeTo": 1, "ExpandDynamic": 1, "ReduceDynamic": 1, "SqueezeDynamic": 1,
                     "SliceDynamic": 2, "SliceDynamicGrad": 2, "SplitSizes": 1, "DFT": 1}
# the scalar hyperparameters of the optimizer updates: the kernels read them as Python floats; STFT's sizes
_HOST_INPUTS = {"ApplyGradientDescent": {1}, "ApplyMomentum": {2}, "ApplyAdagrad": {2},
                "ApplyAdam": {3, 4, 5, 6, 7}, "SparseApplyGradientDescent": {1}, "SparseApplyMomentum": {2},
                "SparseApplyAdagrad": {2}, "SparseApplyAdam": {3, 4, 5, 6, 7},
                "STFT": {1, 3}}  # the frame step and length (its window is data)
# inputs of which the kernel reads only the shape: no copy, whatever device they are on
_SHAPE_ONLY: Dict[str, Tuple[int, ...]] = {"Shape": (0,)}
# inputs whose values a GPU kernel cannot check without a host sync (class ids): when they come
# up from the host, the copy checks them there, before the upload, on the consumer's behalf
_LABEL_INPUTS = {"SparseSoftmaxCrossEntropy": (0, 1)}  # op -> (labels input, logits input)


def input_device(node: Node, i: int, device: str) -> Optional[str]:
    """Where input `i` of `node` (placed on `device`) must be: a device name, or None when only
    its shape is read."""
    if i in _SHAPE_ONLY.get(node.op, ()):
        return None
    if node.op == "DeviceCopy":
        return node.attrs["src"]
    first = _HOST_INPUTS_FROM.get(node.op)
    if (first is not None and i >= first) or i in _HOST_INPUTS.get(node.op, ()):
        return HOST
    return device


def _updated_in_bodies(nodes: Sequence[Node]) -> set:
    """Variables that an update inside a cond/while body names: host control flow runs its bodies
    on the host, so those variables live there."""
    found, seen = set(), set()
    stack = [n for n in nodes if n.op in HOST_OPS]
    while stack:
        n = stack.pop()
        for v in n.attrs.values():
            g = getattr(v, "graph", None)
            if g is None or not hasattr(v, "outputs") or id(g) in seen:
                continue
            seen.add(id(g))
            for m in g.nodes:
                for i in m.opdef.ref_inputs:
                    found.add(m.inputs[i].node)
                stack.append(m)
    return found


def host_variables(graph: Graph) -> frozenset:
    """Names of the variables of `graph` that live on the host whatever the plan: those updated
    inside cond/while bodies. (A property of the whole graph, so every plan agrees.)"""
    key = len(graph.nodes)
    hit = _HOST_VARS.get(graph)
    if hit is not None and hit[0] == key:
        return hit[1]
    names = frozenset(v.name for v in _updated_in_bodies(graph.nodes))
    _HOST_VARS[graph] = (key, names)
    return names


_HOST_VARS: "weakref.WeakKeyDictionary[Graph, tuple]" = weakref.WeakKeyDictionary()


def assign_devices(nodes: Sequence[Node], default: str, host_vars: frozenset = frozenset(),
                   gpu_pins: bool = True) -> Dict[Node, str]:
    """node -> local device name (`host_vars`: names of variables kept on the host; `gpu_pins`
    False: no GPU here, so nodes pinned to one run on the host, as TensorFlow's soft placement)."""
    out: Dict[Node, str] = {v: HOST for v in _updated_in_bodies(nodes)}
    for n in nodes:
        if n.op == "Variable" and n.name in host_vars:
            out[n] = HOST

    def place(n: Node) -> str:
        d = out.get(n)
        if d is not None:
            return d
        if n.op in HOST_OPS or (n.op == "Variable" and n.name in host_vars):
            d = HOST
        elif n.opdef.ref_inputs:
            d = place(n.inputs[n.opdef.ref_inputs[0]].node)  # updates run where the variable lives
        elif n.device:
            spec = DeviceSpec.parse(n.device)
            d = local_name(spec) if spec.kind is not None else default
            if d != HOST and not gpu_pins:
                d = HOST
        else:
            d = default
        out[n] = d
        return d
    for n in nodes:
        place(n)
    return out


def needs_devices(nodes: Sequence[Node], default: str, gpu_pins: bool = True) -> bool:
    """Whether any node would run off the host (otherwise the pass is skipped: nothing changes)."""
    if default != HOST:
        return True
    return gpu_pins and any(n.device and DeviceSpec.parse(n.device).kind == "GPU" for n in nodes)


class _CopyBuilder:
    def __init__(self, src: Graph):
        self.g = Graph(seed=src.seed)
        self.map: Dict[Tensor, Tensor] = {}
        self.node_map: Dict[Node, Node] = {}
        self.loc: Dict[Tensor, str] = {}  # new tensor -> the device its value is on
        self.copies: Dict[Tuple[Tensor, str], Tensor] = {}
        self.stats = {"copies": 0, "consts_remade": 0}

    def on(self, t: Tensor, dst: str) -> Tensor:
        """The new tensor `t` as a value on `dst`: itself, or a copy (made once per destination)."""
        src = self.loc[t]
        if src == dst:
            return t
        key = (t, dst)
        hit = self.copies.get(key)
        if hit is not None:
            return hit
        tag = dst.rsplit("/device:", 1)[-1].replace(":", "")
        if t.node.op == "Const":  # its control inputs too: what it waits for (a Recv's token) still runs
            n = self.g.add_node("Const", (), {"value": t.node.attrs["value"]}, name=f"{t.node.name}/on_{tag}",
                                device=dst, control_inputs=list(t.node.control_inputs))
            self.stats["consts_remade"] += 1
        else:
            n = self.g.add_node("DeviceCopy", (t,), {"src": src, "dst": dst}, name=f"{t.node.name}/to_{tag}",
                                device=dst)
            self.stats["copies"] += 1
        out = self.copies[key] = n.outputs[0]
        self.loc[out] = dst
        return out

    def check_labels_on_host(self, t: Tensor, consumer: Node, classes: Optional[int]) -> None:
        """If `t` is a host -> device copy, make it check the class ids it uploads for `consumer`."""
        n = t.node
        if n.op == "DeviceCopy" and n.attrs["src"] == HOST:
            n.attrs["label_checks"] = n.attrs["label_checks"] + ((consumer.name, classes),)


def insert_copies(graph: Graph, nodes: Sequence[Node], fetches: Sequence, feeds: Sequence[Tensor],
                  default: str, stats: Optional[dict] = None, host_vars: frozenset = frozenset(),
                  gpu_pins: bool = True) -> Rewrite:
    """Copy `nodes` (pruned, in order) into a new graph whose nodes carry local devices, with
    DeviceCopy nodes where values change device. Feeds are on the host; fetches return to it."""
    fed = set(feeds)
    dev = assign_devices(nodes, HOST if default is None else default, host_vars, gpu_pins)
    b = _CopyBuilder(graph)

    def copy_node(n: Node) -> Node:
        ins = []
        for i, t in enumerate(n.inputs):
            if i in n.opdef.ref_inputs:  # names the variable: its slot, not a value
                if t not in b.map:
                    dev.setdefault(t.node, dev.get(n, default))
                    copy_node(t.node)
                ins.append(b.map[t])
                continue
            where = input_device(n, i, dev[n])
            ins.append(b.map[t] if where is None else b.on(b.map[t], where))
        lab = _LABEL_INPUTS.get(n.op)
        if lab is not None:
            b.check_labels_on_host(ins[lab[0]], n, n.inputs[lab[1]].shape[-1])
        ctrls = [b.node_map[c] for c in n.control_inputs if c in b.node_map]
        new = b.g.add_node(n.op, ins, dict(n.attrs), name=n.name, device=dev[n], control_inputs=ctrls)
        for t, u in zip(n.outputs, new.outputs):
            b.map[t] = u
            b.loc[u] = HOST if t in fed else dev[n]
        b.node_map[n] = new
        return new

    in_nodes = set(nodes)
    for t in feeds:  # a fed tensor whose producer was pruned: a placeholder in the new graph
        if t.node not in in_nodes and t not in b.map:
            ph = b.g.add_node("Placeholder", (), {"dtype": t.dtype, "shape": t.shape}, name=t.node.name, device=HOST)
            b.map[t] = ph.outputs[0]
            b.loc[ph.outputs[0]] = HOST
    for n in nodes:
        if n not in b.node_map:
            copy_node(n)
    new_fetches = [b.on(b.map[f], HOST) if isinstance(f, Tensor) else b.node_map[f] for f in fetches]
    out_stats = dict(stats or {})
    out_stats.update(b.stats)
    return Rewrite(b.g, new_fetches, [b.map[t] for t in feeds], out_stats)


def copies_of(graph: Graph) -> Dict[Tuple[str, str], int]:
    """(src, dst) -> number of DeviceCopy nodes; what tests and the cost report count."""
    out: Dict[Tuple[str, str], int] = {}
    for n in graph.nodes:
        if n.op == "DeviceCopy":
            k = (n.attrs["src"], n.attrs["dst"])
            out[k] = out.get(k, 0) + 1
    return out


DeviceOf = Callable[[Node], str]
