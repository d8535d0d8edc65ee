"""Error types. Every message names the node (and its op) at fault."""
from __future__ import annotations


class IsthmusError(Exception):
    """Base of all isthmus errors."""


class GraphError(IsthmusError, ValueError):
    """The graph is malformed: bad names, dangling references, wrong arity."""


class ShapeError(IsthmusError, ValueError):
    """Shapes or dtypes do not fit the op; raised when the node is built."""


class OpNotFoundError(IsthmusError, KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class FeedError(IsthmusError, ValueError):
    """A feed is missing, or does not match its placeholder's dtype or shape."""


class ExecutionError(IsthmusError, RuntimeError):
    """A kernel failed while running; carries the node that failed."""

    def __init__(self, message: str, node_name: str | None = None, op: str | None = None):
        super().__init__(message)
        self.node_name = node_name
        self.op = op


class CheckpointError(IsthmusError, ValueError):
    """A checkpoint is missing, corrupt, or does not fit the graph."""
