"""Function: a body graph with its inputs (placeholders) and outputs, as cond and while_loop use.

The shape mirrors ONNX If/Loop bodies so that converters map them one to one.
"""
from __future__ import annotations

from typing import List, Sequence

from .graph import Graph, Tensor


class Function:
    __slots__ = ("graph", "inputs", "outputs", "name")

    def __init__(self, graph: Graph, inputs: Sequence[Tensor], outputs: Sequence[Tensor], name: str = "body"):
        self.graph = graph
        self.inputs: List[Tensor] = list(inputs)
        self.outputs: List[Tensor] = list(outputs)
        self.name = name

    def compile(self, ctx, fetch_indices=None):
        """A Plan computing the outputs (or those at `fetch_indices`) from the inputs."""
        # cycle: core.function <-> core.executor (via core.ops.numerics, core.ops, core.ops.control)
        from .executor import Plan
        outs = self.outputs if fetch_indices is None else [self.outputs[i] for i in fetch_indices]
        return Plan(outs, self.inputs, ctx, parallel=False)

    def __repr__(self) -> str:
        return f"<Function {self.name}: {len(self.inputs)} in, {len(self.outputs)} out, {len(self.graph.nodes)} nodes>"
