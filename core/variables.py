"""Variable: a Tensor (the variable's current value) that also knows how to update itself."""
from __future__ import annotations

from typing import List, Optional

from .graph import Graph, Node, Tensor, get_default_graph
from .ops.base import convert, group, make
from .shapes import as_shape

GLOBAL_VARIABLES = "variables"
TRAINABLE_VARIABLES = "trainable_variables"


class Variable(Tensor):
    """Output 0 of a `Variable` node. Reading it gives the current value; `assign*` update it.

    `initial_value` is a Tensor, an array, or a callable returning either (called under the
    variable's name scope, as initializers are).
    """
    __slots__ = ("initializer", "initial_value", "trainable")

    def __new__(cls, initial_value=None, dtype=None, shape=None, name: Optional[str] = None,
                trainable: bool = True, graph: Optional[Graph] = None):
        g = graph or (initial_value.graph if isinstance(initial_value, Tensor) else get_default_graph())
        vname = g.unique_name(name or "Variable")
        with g.as_default(), g.name_scope(vname + "/"):
            init = initial_value() if callable(initial_value) else initial_value
            if init is None:
                raise ValueError(f"variable '{vname}' needs an initial_value")
            init_t = convert(init, dtype=dtype)
        var_shape = as_shape(shape) if shape is not None else init_t.shape
        vnode = g.add_node("Variable", (), {"dtype": init_t.dtype, "shape": var_shape,
                                            "trainable": bool(trainable)}, name=vname, exact_name=True)
        # swap the plain output Tensor for this Variable before anyone else sees it
        self = Tensor.__new__(cls)
        Tensor.__init__(self, vnode, 0, vnode.outputs[0].dtype, vnode.outputs[0].shape)
        vnode.outputs = (self,)
        self.initial_value = init_t
        self.trainable = bool(trainable)
        self.initializer = g.add_node("Assign", (self, init_t), name=vname + "/Assign", exact_name=True)
        g.add_to_collection(GLOBAL_VARIABLES, self)
        if trainable:
            g.add_to_collection(TRAINABLE_VARIABLES, self)
        return self

    def __init__(self, *args, **kwargs):  # all work happens in __new__
        pass

    def __repr__(self) -> str:
        return f"<Variable '{self.node.name}' {self.dtype.name}{list(self.shape)}>"

    def value(self) -> Tensor:
        return self

    def assign(self, value, name=None) -> Tensor:
        return make("Assign", (self, convert(value, self.dtype)), name=name).outputs[0]

    def assign_add(self, delta, name=None) -> Tensor:
        return make("AssignAdd", (self, convert(delta, self.dtype)), name=name).outputs[0]

    def assign_sub(self, delta, name=None) -> Tensor:
        return make("AssignSub", (self, convert(delta, self.dtype)), name=name).outputs[0]

    def scatter_add(self, indices, updates, scale: float = 1.0, name=None) -> Tensor:
        return make("ScatterAdd", (self, convert(indices), convert(updates, self.dtype)),
                    {"scale": float(scale)}, name=name).outputs[0]

    def load(self, value, session) -> None:
        session.set_variable_value(self, value)


def global_variables(graph: Optional[Graph] = None) -> List[Variable]:
    return (graph or get_default_graph()).get_collection(GLOBAL_VARIABLES)


def trainable_variables(graph: Optional[Graph] = None) -> List[Variable]:
    return (graph or get_default_graph()).get_collection(TRAINABLE_VARIABLES)


def variables_initializer(variables, name: str = "init") -> Node:
    variables = list(variables)
    if not variables:
        return get_default_graph().add_node("NoOp", (), name=name)
    return group(*[v.initializer for v in variables], name=name)


def global_variables_initializer(graph: Optional[Graph] = None) -> Node:
    g = graph or get_default_graph()
    with g.as_default():
        return variables_initializer(global_variables(g))
