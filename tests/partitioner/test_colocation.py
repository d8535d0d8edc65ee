"""One colocation rule (partitioner/colocation.py) for the partitioner and the cluster placement: a
variable and every op that updates it share a device, also when the update sits inside a cond or
while body, and so do the producer and readers of an opaque value."""
from dataclasses import replace

import numpy as np
import pytest

import isthmus as ism
from isthmus.partitioner.colocation import colocation_groups
from isthmus.partitioner.costmodel import CostModel
from isthmus.core.registry import registered
from isthmus.partitioner.devices import CLOUD, EDGE, EDGE_DEVICE
from isthmus.partitioner.partition import partition
from isthmus.partitioner.placement import (cloud_only, place_exhaustive, place_greedy, place_layer_split,
                                           place_mincut)
from isthmus.partitioner.problem import PlacementError, Problem
from isthmus.wire.link import LinkModel


def _anything_edge():
    """The default edge profile, 1000x slower, running every op (If, While and Variable included,
    which the edge's own kernel table does not)."""
    return replace(EDGE, supported_ops=None, kernel_table=CLOUD.kernel_table).scaled(1000)


def _graph(kind: str):
    """x -> a cond/while whose body updates the edge-pinned variable v; y reads its result.
    The edge is 1000x slower and the link free, so every free node wants the cloud."""
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (4, 4), name="x")
        with ism.device("/job:edge"):
            v = ism.Variable(np.zeros((4, 4), np.float32), name="v")
        h = ism.tanh(ism.matmul(x, x), name="h")
        if kind == "cond":
            r = ism.cond(ism.reduce_sum(h) > -1.0, lambda: v.assign_add(h) * 2.0, lambda: h, name="step")
        else:
            _, r = ism.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, a + v.assign_add(a)),
                                  [ism.constant(0), h], name="step")
        y = ism.tanh(ism.matmul(r, r), name="y")
    return g, v, y


@pytest.mark.parametrize("kind", ["cond", "while"])
def test_a_body_that_updates_a_variable_keeps_its_node_with_the_variable(kind):
    g, v, y = _graph(kind)
    step = next(n for n in g.nodes if n.op in ("If", "While"))
    groups = colocation_groups(g.nodes)
    assert any(step in members and v.node in members for members in groups.values())
    cost = CostModel.edge_cloud(LinkModel(1e12, 1e12, 0.0), edge=_anything_edge())
    p = Problem(g, cost, [y])
    assert p.group[p.index[step]] == p.group[p.index[v.node]]
    for place in (place_mincut, place_exhaustive, place_greedy, place_layer_split, cloud_only):
        pl = place(g, cost, [y])
        assert pl[v.node.name] == EDGE_DEVICE, place.__name__
        assert pl[step.name] == pl[v.node.name], place.__name__   # the body's update runs where v lives
    parts = partition(g, place_mincut(g, cost, [y]), [y]).parts
    assert {n.name for n in parts[EDGE_DEVICE].graph.nodes} >= {"v", step.name}


def test_the_rule_reads_only_the_nodes_it_is_given():
    g, v, y = _graph("cond")
    step = next(n for n in g.nodes if n.op == "If")
    sub = [n for n in g.nodes if n is not v.node]
    groups = colocation_groups(sub)
    assert all(v.node not in m for m in groups.values())
    assert [step] in list(groups.values())


def test_an_edge_that_cannot_run_the_body_node_is_an_error_not_a_split():
    # the variable is pinned to the edge; an edge without If cannot hold the cond that updates it
    g, v, y = _graph("cond")
    edge = replace(_anything_edge(), supported_ops=frozenset(registered()) - {"If"})
    with pytest.raises(PlacementError, match="'v', 'step' must share a device"):
        Problem(g, CostModel.edge_cloud(LinkModel(1e12, 1e12, 0.0), edge=edge), [y])
