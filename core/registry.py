"""The op registry: one record per op type.

A record holds everything isthmus knows about an op: its inputs and attribute schema,
shape/dtype inference (run when a node is built), the kernel factory (run once when a
plan is compiled), the gradient builder and the cost function used by the partitioner.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .errors import GraphError, OpNotFoundError
from .shapes import num_elements_est

REQUIRED = object()  # marks an attribute that has no default


@dataclass(frozen=True)
class Cost:
    flops: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.bytes_read + other.bytes_read,
                    self.bytes_written + other.bytes_written)


@dataclass
class OpDef:
    """One op type. See core/ops/math.py for the pattern to follow.

    infer(node) -> [(dtype, shape), ...]      one entry per output
    kernel(node, ctx) -> fn(*input_values)    a bound kernel; returns one value, or a
                                              tuple when the op has several outputs
    grad(node, dys) -> [Tensor | None, ...]   one entry per input; dys has one entry
                                              (Tensor or None) per output
    cost(node) -> Cost
    """
    name: str
    inputs: Sequence[str]
    infer: Callable
    kernel: Callable
    attrs: Dict[str, Any] = field(default_factory=dict)
    grad: Optional[Callable] = None
    cost: Optional[Callable] = None
    stateful: bool = False          # reads or writes state, or is random: never folded/deduplicated
    ref_inputs: Tuple[int, ...] = ()  # inputs that name a Variable rather than carry its value
    doc: str = ""

    @property
    def variadic(self) -> bool:
        return bool(self.inputs) and self.inputs[-1].startswith("*")

    def check_arity(self, n: int, node_name: str) -> None:
        fixed = len(self.inputs) - (1 if self.variadic else 0)
        if (self.variadic and n < fixed) or (not self.variadic and n != fixed):
            want = f"at least {fixed}" if self.variadic else str(fixed)
            raise GraphError(f"node '{node_name}' ({self.name}): takes {want} inputs "
                             f"({', '.join(self.inputs)}), got {n}")

    def fill_attrs(self, given: Dict[str, Any], node_name: str) -> Dict[str, Any]:
        unknown = set(given) - set(self.attrs)
        if unknown:
            raise GraphError(f"node '{node_name}' ({self.name}): unknown attribute(s) "
                             f"{sorted(unknown)}; known: {sorted(self.attrs)}")
        out = {}
        for k, default in self.attrs.items():
            if k in given:
                out[k] = given[k]
            elif default is REQUIRED:
                raise GraphError(f"node '{node_name}' ({self.name}): attribute '{k}' is required")
            else:
                out[k] = default
        return out


_REGISTRY: Dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in _REGISTRY:
        raise GraphError(f"op '{opdef.name}' is registered twice")
    _REGISTRY[opdef.name] = opdef
    return opdef


def get(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise OpNotFoundError(f"unknown op '{name}'; known ops: {', '.join(sorted(_REGISTRY))}") from None


def registered() -> List[str]:
    return sorted(_REGISTRY)


def elementwise_cost(flops_per_element: float = 1.0) -> Callable:
    """Cost of an op that touches every element of its output once per input."""
    def cost(node) -> Cost:
        out = node.outputs[0]
        n = num_elements_est(out.shape)
        read = sum(num_elements_est(t.shape) * t.dtype.itemsize for t in node.inputs)
        return Cost(flops_per_element * n, read, n * out.dtype.itemsize)
    return cost


def default_cost(node) -> Cost:
    read = sum(num_elements_est(t.shape) * t.dtype.itemsize for t in node.inputs)
    written = sum(num_elements_est(t.shape) * t.dtype.itemsize for t in node.outputs)
    return Cost(0.0, read, written)
