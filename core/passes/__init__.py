"""Graph passes: each takes the nodes a plan needs and returns a rewritten graph.

`optimize` is what a Session runs when it compiles a plan (unless built with
optimize=False). Passes never change a stateful node, and every fetched or fed tensor
keeps a counterpart carrying the same value.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple, Union

from ..graph import Graph, Node, Tensor
from .concat import split_channel_concat
from .fusion import fold_batch_norm, fuse_bias_activation, prune_dead
from .gelu import fuse_gelu
from .freeze import freeze
from .simplify import Rewrite, copy_simplified

Fetch = Union[Tensor, Node]
DEFAULT_PASSES = ("simplify", "fold_batch_norm", "fuse")
# what a Session's executor runs: also the residual Add (+ Relu) fused into its convolution
# (FusedConv2DAdd), which the edge runtime, the partitioner's edge table and the exporters do not know,
# and two-part channel Concats read by pools and 1x1 convolutions left unmade (passes/concat.py), and
# the exact GELU written out as five nodes run as one Gelu (passes/gelu.py)
SESSION_PASSES = DEFAULT_PASSES + ("fuse_residual", "split_concat", "fuse_gelu")


def optimize(graph: Graph, nodes: Sequence[Node], fetches: Sequence[Fetch], feeds: Sequence[Tensor],
             passes: Sequence[str] = DEFAULT_PASSES) -> Rewrite:
    """Rewrite `nodes` (a pruned, ordered subgraph of `graph`) into a fresh graph.

    Returns a Rewrite with the new graph and the mapping from old fetches/feeds to new ones.
    """
    rw = copy_simplified(graph, nodes, fetches, feeds, fold="simplify" in passes)
    if "fold_batch_norm" in passes:
        rw = fold_batch_norm(rw)
    if "fuse" in passes:
        rw = fuse_bias_activation(rw, residual="fuse_residual" in passes)
    if "split_concat" in passes and "fuse" in passes:
        rw = split_channel_concat(prune_dead(rw))
    if "fuse_gelu" in passes:
        rw = fuse_gelu(prune_dead(rw))
    return prune_dead(rw)


__all__ = ["optimize", "DEFAULT_PASSES", "SESSION_PASSES", "freeze", "Rewrite", "copy_simplified", "fold_batch_norm",
           "fuse_bias_activation", "fuse_gelu", "prune_dead", "split_channel_concat"]
