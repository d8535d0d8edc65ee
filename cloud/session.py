"""DistributedSession: `run(fetches, feed_dict)` as core's Session, on a cluster.

    sess = DistributedSession(graph, "grpc://127.0.0.1:2222")   # a task acting as master
    sess.run(train_op, {x: xb, y: yb})

The graph goes to the master once (again, whole, when it has grown since); each run sends
the feeds and the names of the fetched tensors and nodes, and gets the values back. The
same graph gives the same results as a local Session; a failing op raises the same
error class, naming the node (and the task it ran on).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np

from ..core.graph import Graph, Node, Tensor, get_default_graph
from ..core.ops.base import make, placeholder
from ..core.shapes import compatible, fmt
from ..core.errors import FeedError
from ..core.fetches import feed_check, flatten, resolve_feed, resolve_fetch  # as core's Session: the same results
from ..core.trace import RunMetadata
from .master import Master
from .master_rpc import MasterClient

class DistributedSession:
    """`master`: a Master object (in process) instead of a target address."""

    def __init__(self, graph: Optional[Graph] = None, target: Optional[str] = None,
                 master: Optional[Union[Master, Any]] = None, timeout: Optional[float] = None,
                 rpc_timeout: float = 30.0):
        self.graph = graph if graph is not None else get_default_graph()
        if master is None:
            if not target:
                raise ValueError("DistributedSession needs a target ('grpc://host:port') or a master")
            if not target.startswith("grpc://"):
                raise ValueError(f"target {target!r}: expected 'grpc://host:port'")
            master = MasterClient(target, timeout=rpc_timeout)
            self._own_master = True
        else:
            self._own_master = False
        self.target = target
        self.master = master
        self.timeout = timeout
        self._version = self.graph.version
        self._graph_version = 1
        self.handle = master.create_session(self.graph)
        self._checks: Dict[Tensor, Callable] = {}
        self._closed = False
        self._assigns: Dict[str, tuple] = {}
        self.last_step_id: Optional[int] = None

    def run(self, fetches, feed_dict: Optional[Dict] = None, options=None, run_metadata=None):
        """As core's Session.run. With options=RunOptions(trace=True) every task's node events,
        Sends and Recvs go to `run_metadata` on one timeline (RunMetadata.to_chrome_trace)."""
        if self._closed:
            raise RuntimeError("this DistributedSession is closed")
        if self.graph.version != self._version:
            self._version = self.graph.version
            self._graph_version = self.master.extend_session(self.handle, self.graph, self._graph_version)
        flat: List[Union[Tensor, Node]] = []
        unflatten = flatten(fetches, flat, self._resolve)
        feeds = {}
        for k, v in (feed_dict or {}).items():
            t = self._resolve_feed(k)
            check = self._checks.get(t)
            if check is None:
                check = self._checks[t] = feed_check(t)
            feeds[t.name] = check(v)
        tensors = [f.name for f in flat if isinstance(f, Tensor)]
        targets = [f.name for f in flat if isinstance(f, Node)]
        traced = ()
        if options is not None and options.trace:
            traced = (run_metadata if run_metadata is not None else RunMetadata(),)
        values, self.last_step_id = self.master.run_step(self.handle, feeds, list(dict.fromkeys(tensors)),
                                                         list(dict.fromkeys(targets)), self.timeout, *traced)
        got = dict(zip(dict.fromkeys(tensors), values))
        return unflatten([got[f.name] if isinstance(f, Tensor) else None for f in flat])

    def _resolve(self, f):
        return resolve_fetch(self.graph, f)

    def _resolve_feed(self, k) -> Tensor:
        return resolve_feed(self.graph, k)

    # ---- variable access (core's Saver uses these, as with a local Session) ----------------------
    def variable_value(self, var) -> np.ndarray:
        node = var.node if isinstance(var, Tensor) else var
        return np.array(self.run(node.outputs[0]), copy=True)

    def set_variable_value(self, var, value) -> None:
        """Assign a value to a variable on the task that holds it (a step of a small Assign
        fed from a placeholder; the graph grows once, by one such pair per variable)."""
        node = var.node if isinstance(var, Tensor) else var
        t = node.outputs[0]
        arr = np.asarray(value)
        if arr.dtype != t.dtype or not compatible(arr.shape, t.shape) or len(arr.shape) != len(t.shape):
            raise FeedError(f"variable '{node.name}' is {t.dtype.name}{fmt(t.shape)}; "
                            f"value is {arr.dtype.name}{fmt(arr.shape)}")
        if node.name not in self._assigns:
            self._build_assigns()
        ph, op = self._assigns[node.name]
        self.run(op, {ph: arr})

    def _build_assigns(self) -> None:
        g = self.graph
        with g.as_default(), g.name_scope("set_variable_value/"):
            for n in g.nodes:
                if n.op == "Variable" and n.name not in self._assigns:
                    v = n.outputs[0]
                    ph = placeholder(v.dtype, v.shape, name=n.name.replace("/", "_"))
                    self._assigns[n.name] = (ph, make("Assign", (v, ph)))

    def list_devices(self) -> List[Dict[str, str]]:
        return self.master.list_devices()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.master.close_session(self.handle)
        finally:
            if self._own_master:
                self.master.close()

    def __enter__(self) -> "DistributedSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
