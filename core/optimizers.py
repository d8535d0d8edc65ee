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
from .ops.base import constant, convert, group, identity
from .ops.control import cond
from .ops.numerics import all_finite
from .ops.math import cast
from .ops.sparse import IndexedSlices
from .ops.training import apply
from .variables import Variable, trainable_variables

UPDATE_OPS = "update_ops"


GLOBAL_STEP = "global_step"


def get_global_step(graph: Optional[Graph] = None) -> Optional[Variable]:
    found = (graph or get_default_graph()).get_collection(GLOBAL_STEP)
    return found[0] if found else None


def get_or_create_global_step(graph: Optional[Graph] = None) -> Variable:
    """The graph's step counter: a non-trainable int64 Variable (in checkpoints) that
    `minimize(..., global_step=)` increments once per step, after every update."""
    g = graph or get_default_graph()
    with g._lock:
        step = get_global_step(g)
        if step is None:
            with g.as_default():
                step = Variable(np.zeros((), np.int64), name="global_step", trainable=False)
            g.add_to_collection(GLOBAL_STEP, step)
        return step


class Optimizer:
    name = "Optimizer"
    skip_non_finite = False   # True: a step with NaN/Inf gradients is skipped (apply_gradients)
    skipped_steps: Optional[Variable] = None

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

    def apply_gradients(self, grads_and_vars, global_step: Optional[Variable] = None, name: Optional[str] = None,
                        skip_non_finite: Optional[bool] = None) -> Node:
        """The update of every variable. With `skip_non_finite` (default: the optimizer's
        attribute, False) a step whose gradients hold NaN or Inf changes nothing (no variable,
        slot, step counter or global step) and instead adds one to `skipped_steps`, with a
        NonFiniteWarning naming the first such gradient."""
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
        skip = self.skip_non_finite if skip_non_finite is None else skip_non_finite
        if skip:
            counter = self._skip_counter(g)
        with g.as_default(), g.name_scope(name or self.name), g.control_dependencies(grad_nodes):
            if not skip:
                return group(*self._updates(g, pairs, global_step), name="update")
            values = [grad.values if isinstance(grad, IndexedSlices) else convert(grad) for grad, _ in pairs]
            ok = all_finite(values, [f"the gradient of '{v.node.name}'" for _, v in pairs], name="grads_finite")

            def apply_all():
                with get_default_graph().control_dependencies(self._updates(get_default_graph(), pairs,
                                                                            global_step)):
                    return identity(counter.value())
            done = cond(ok, apply_all, lambda: counter.assign_add(np.ones((), np.int64)), name="apply_if_finite")
            return group(done.node, name="update")

    def _updates(self, g: Graph, pairs, global_step: Optional[Variable]) -> List[Node]:
        """The update nodes of one step, built in `g` (the outer graph, or a cond branch's)."""
        lr_by_dtype: Dict[np.dtype, Tensor] = {}
        updates = []
        for grad, var in pairs:
            with g.device(var.node.device):
                lr_v = lr_by_dtype.get(var.dtype)
                if lr_v is None:
                    lr_v = lr_by_dtype[var.dtype] = self._learning_rate(var.dtype)
                if isinstance(grad, IndexedSlices):
                    updates.append(self._apply(var, lr_v, grad.values, grad.indices))
                else:
                    updates.append(self._apply(var, lr_v, convert(grad), None))
        updates.extend(self._finish(g, updates))
        if global_step is not None:
            with g.control_dependencies(updates):
                updates.append(global_step.assign_add(np.ones((), global_step.dtype)).node)
        return updates

    def _skip_counter(self, g: Graph) -> Variable:
        """The count of steps skipped for non-finite gradients (a non-trainable int64 variable,
        in checkpoints): `sess.run(opt.skipped_steps.value())`."""
        if self.skipped_steps is None:
            with g.as_default(), g.name_scope(f"{self.name}/"):
                self.skipped_steps = Variable(np.zeros((), np.int64), name="skipped_steps", trainable=False, graph=g)
        return self.skipped_steps

    def minimize(self, loss, var_list=None, global_step: Optional[Variable] = None, name: Optional[str] = None,
                 skip_non_finite: Optional[bool] = None) -> Node:
        loss = convert(loss)
        extra = loss.graph.get_collection(UPDATE_OPS)  # e.g. batch-norm moving averages
        step = self.apply_gradients(self.compute_gradients(loss, var_list), global_step, name, skip_non_finite)
        if extra:
            return group(step, *extra, name="minimize")
        return step

    def get_slot(self, var: Variable, name: str) -> Variable:
        return self._slots[(var.node.name, name)]

    def variables(self) -> List[Variable]:
        """The optimizer's own state (slots, step counters), for checkpoints and initializers."""
        return list(self._slots.values()) + list(self._extra_variables())

    def _extra_variables(self) -> List[Variable]:
        return []

    def _learning_rate(self, dtype) -> Tensor:
        lr = self.learning_rate
        if isinstance(lr, Tensor) or hasattr(lr, "_as_tensor"):
            lr = convert(lr)
            if lr.shape != ():
                raise GraphError(f"learning rate '{lr.name}' must be a scalar, got shape {list(lr.shape)}")
            return lr if lr.dtype == dtype else cast(lr, dtype)
        return constant(np.asarray(lr, dtype), name="learning_rate")

    # ---- what each optimizer defines -------------------------------------------------------
    slot_names: Tuple[str, ...] = ()
    slot_init: Dict[str, float] = {}

    def _slot(self, var: Variable, slot: str) -> Variable:
        key = (var.node.name, slot)
        if key not in self._slots:
            if any(d is None for d in var.shape):
                raise GraphError(f"variable '{var.node.name}' has shape {list(var.shape)}; "
                                 f"{self.name} slots need a fully known shape")
            init = np.full(tuple(var.shape), self.slot_init.get(slot, 0.0), dtype=var.dtype)
            g = var.graph
            # an absolute scope: the slot is "<var>/<Optimizer>/<slot>" whatever scope minimize runs in
            with g.as_default(), g.name_scope(f"{var.node.name}/{self.name}/"):
                self._slots[key] = Variable(init, name=slot, trainable=False, graph=g)
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
            with g.name_scope(f"{self.name}/"):
                self._step = Variable(np.zeros((), np.float64), name="step", trainable=False, graph=g)

    def _extra_variables(self):
        return [self._step] if self._step is not None else []

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
           "get_or_create_global_step", "get_global_step", "UPDATE_OPS", "GLOBAL_STEP"]
