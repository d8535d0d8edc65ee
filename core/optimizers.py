"""Optimizers: `minimize(loss)` adds the gradients and in-place update ops to the graph.

Slots (momentum accumulators, Adam moments) are non-trainable Variables named
"<var>/<Optimizer>/<slot>", so checkpoints carry them. Row-sparse gradients (from gather)
update only the rows they name.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .autodiff import gradients
from .errors import GraphError
from .graph import Graph, Node, Tensor, get_default_graph, graph_of
from .ops.base import constant, convert, group
from .ops.sparse import IndexedSlices
from .ops.training import apply
from .variables import Variable, trainable_variables

UPDATE_OPS = "update_ops"


def get_or_create_global_step(graph: Optional[Graph] = None) -> Variable:
    g = graph or get_default_graph()
    for v in g.get_collection("variables"):
        if v.node.name == "global_step":
            return v
    with g.as_default():
        return Variable(np.zeros((), np.int64), name="global_step", trainable=False)


class Optimizer:
    name = "Optimizer"

    def __init__(self, learning_rate, name: Optional[str] = None):
        self.learning_rate = learning_rate
        if name:
            self.name = name
        self._slots: Dict[Tuple[str, str], Variable] = {}

    # ---- the public steps -------------------------------------------------------------------
    def compute_gradients(self, loss, var_list: Optional[Sequence[Variable]] = None) -> List[Tuple[object, Variable]]:
        loss = convert(loss)
        var_list = list(var_list) if var_list is not None else trainable_variables(loss.graph)
        if not var_list:
            raise GraphError("no trainable variables to optimize")
        grads = gradients(loss, var_list)
        return list(zip(grads, var_list))

    def apply_gradients(self, grads_and_vars, global_step: Optional[Variable] = None, name: Optional[str] = None) -> Node:
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            raise GraphError("no variable has a gradient; check that the loss depends on them")
        g = graph_of([v for _, v in pairs])
        with g.as_default():  # slots first, outside the scope: their names follow their variable's
            self._prepare(g, [v for _, v in pairs])
            for _, var in pairs:
                with g.device(var.node.device):
                    for slot in self.slot_names:
                        self._slot(var, slot)
        # every gradient is computed before any variable changes: a gradient may read a variable
        # another update writes in place (conv and matmul input gradients read the weights)
        grad_nodes = []
        for grad, _ in pairs:
            parts = (grad.values, grad.indices) if isinstance(grad, IndexedSlices) else (convert(grad),)
            grad_nodes.extend(t.node for t in parts)
        with g.as_default(), g.name_scope(name or self.name), g.control_dependencies(grad_nodes):
            lr = convert(self.learning_rate, pairs[0][1].dtype) if not isinstance(self.learning_rate, Tensor) \
                else self.learning_rate
            updates = []
            for grad, var in pairs:
                with g.device(var.node.device):
                    lr_v = lr if lr.dtype == var.dtype else constant(np.asarray(self.learning_rate, var.dtype))
                    if isinstance(grad, IndexedSlices):
                        updates.append(self._apply(var, lr_v, grad.values, grad.indices))
                    else:
                        updates.append(self._apply(var, lr_v, convert(grad), None))
            updates.extend(self._finish(g, updates))
            if global_step is not None:
                with g.control_dependencies(updates):
                    updates.append(global_step.assign_add(np.ones((), global_step.dtype)).node)
            return group(*updates, name="update")

    def minimize(self, loss, var_list=None, global_step: Optional[Variable] = None, name: Optional[str] = None) -> Node:
        loss = convert(loss)
        extra = loss.graph.get_collection(UPDATE_OPS)  # e.g. batch-norm moving averages
        step = self.apply_gradients(self.compute_gradients(loss, var_list), global_step, name)
        if extra:
            return group(step, *extra, name="minimize")
        return step

    def get_slot(self, var: Variable, name: str) -> Variable:
        return self._slots[(var.node.name, name)]

    # ---- what each optimizer defines -------------------------------------------------------
    slot_names: Tuple[str, ...] = ()
    slot_init: Dict[str, float] = {}

    def _slot(self, var: Variable, slot: str) -> Variable:
        key = (var.node.name, slot)
        if key not in self._slots:
            init = np.full(tuple(var.shape), self.slot_init.get(slot, 0.0), dtype=var.dtype)
            g = var.graph
            self._slots[key] = Variable(init, name=f"{var.node.name}/{self.name}/{slot}", trainable=False, graph=g)
        return self._slots[key]

    def _prepare(self, g: Graph, variables) -> None:
        pass

    def _finish(self, g: Graph, updates) -> List[Node]:
        return []

    def _apply(self, var, lr, grad, indices) -> Node:
        raise NotImplementedError


def _op(base: str, indices) -> str:
    return ("SparseApply" if indices is not None else "Apply") + base


class SGD(Optimizer):
    name = "SGD"

    def _apply(self, var, lr, grad, indices):
        return apply(_op("GradientDescent", indices), [var], [lr], grad, indices=indices)


GradientDescent = SGD


class Momentum(Optimizer):
    name = "Momentum"
    slot_names = ("momentum",)

    def __init__(self, learning_rate, momentum: float = 0.9, nesterov: bool = False, name: Optional[str] = None):
        super().__init__(learning_rate, name)
        self.momentum, self.nesterov = momentum, nesterov

    def _apply(self, var, lr, grad, indices):
        m = constant(np.asarray(self.momentum, var.dtype))
        return apply(_op("Momentum", indices), [var, self._slot(var, "momentum")], [lr, m], grad,
                     {"use_nesterov": bool(self.nesterov)}, indices=indices)


class Adam(Optimizer):
    """Adam with bias correction; the step counter is one non-trainable variable per optimizer,
    read by every update of a step and incremented once after all of them."""
    name = "Adam"
    slot_names = ("m", "v")

    def __init__(self, learning_rate=1e-3, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                 name: Optional[str] = None):
        super().__init__(learning_rate, name)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self._step: Optional[Variable] = None

    def _prepare(self, g, variables):
        if self._step is None:
            self._step = Variable(np.zeros((), np.float64), name=f"{self.name}/step", trainable=False, graph=g)

    def _apply(self, var, lr, grad, indices):
        d = var.dtype
        sc = [lr, constant(np.asarray(self.beta1, d)), constant(np.asarray(self.beta2, d)),
              constant(np.asarray(self.epsilon, d)), self._step]
        return apply(_op("Adam", indices), [var, self._slot(var, "m"), self._slot(var, "v")], sc, grad, indices=indices)

    def _finish(self, g, updates):
        with g.control_dependencies(updates):
            return [self._step.assign_add(np.float64(1.0)).node]


class AdaGrad(Optimizer):
    name = "Adagrad"
    slot_names = ("accumulator",)

    def __init__(self, learning_rate, initial_accumulator_value: float = 0.1, name: Optional[str] = None):
        super().__init__(learning_rate, name)
        self.slot_init = {"accumulator": initial_accumulator_value}

    def _apply(self, var, lr, grad, indices):
        return apply(_op("Adagrad", indices), [var, self._slot(var, "accumulator")], [lr], grad, indices=indices)


Adagrad = AdaGrad
__all__ = ["Optimizer", "SGD", "GradientDescent", "Momentum", "Adam", "AdaGrad", "Adagrad",
           "get_or_create_global_step", "UPDATE_OPS"]
