"""Random DAGs for the property tests: a recipe (plain data hypothesis can shrink) and its graph."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np
from hypothesis import strategies as st

import isthmus as ism

N = 4  # every value is an N x N float32 matrix, so any op can read any earlier node
UNARY = ("relu", "tanh", "sigmoid", "neg", "exp_tanh", "transpose", "reshape_twice", "add_noise")
BINARY = ("add", "mul", "sub", "matmul", "maximum", "concat_split")
OPS = ("const_matmul",) + UNARY + BINARY


@dataclass(frozen=True)
class Recipe:
    n_inputs: int
    steps: Tuple[Tuple[str, Tuple[int, ...], Tuple[int, ...]], ...]  # (op, inputs, control inputs)
    seed: int


@st.composite
def recipes(draw, max_nodes: int = 10, controls: bool = True) -> Recipe:
    n_in = draw(st.integers(1, 2))
    n = draw(st.integers(1, max_nodes - n_in))
    steps = []
    for i in range(n):
        avail = n_in + i
        op = draw(st.sampled_from(OPS))
        arity = 2 if op in BINARY else 1
        ins = tuple(draw(st.integers(0, avail - 1)) for _ in range(arity))
        ctrl = ()
        if controls and avail > 1 and draw(st.integers(0, 5)) == 0:
            ctrl = (draw(st.integers(0, avail - 1)),)
        steps.append((op, ins, ctrl))
    return Recipe(n_in, tuple(steps), draw(st.integers(0, 2**16)))


def build(r: Recipe):
    """(graph, placeholders, value tensors in order: inputs then one per step)."""
    rng = np.random.default_rng(r.seed)
    g = ism.Graph(seed=0)
    vals: List[ism.Tensor] = []
    with g.as_default():
        phs = [ism.placeholder("float32", (N, N), name=f"in{i}") for i in range(r.n_inputs)]
        vals.extend(phs)
        for k, (op, ins, ctrl) in enumerate(r.steps):
            xs = [vals[i] for i in ins]
            with ism.control_dependencies([vals[c].node for c in ctrl]):
                vals.append(_op(op, xs, rng, f"n{k}"))
    return g, phs, vals


def _op(op: str, xs, rng, name: str):
    if op == "const_matmul":
        w = (rng.uniform(-1, 1, (N, N)) / N).astype(np.float32)
        return ism.matmul(xs[0], ism.constant(w), name=name)
    if op == "exp_tanh":
        return ism.exp(ism.tanh(xs[0]), name=name)
    if op == "matmul":
        return ism.tanh(ism.matmul(xs[0], xs[1]), name=name)  # keep values bounded
    if op == "transpose":
        return ism.transpose(xs[0], name=name)
    if op == "reshape_twice":
        return ism.reshape(ism.reshape(xs[0], (N * N,)), (N, N), name=name)
    if op == "add_noise":  # a random op: seeded by graph seed and node name, so parts draw the same
        return ism.add(xs[0], ism.random_normal((N, N)), name=name)
    if op == "concat_split":
        return ism.split(ism.concat([xs[0], xs[1]], axis=0), 2, axis=0)[1]
    if op == "mul":
        return ism.tanh(ism.mul(xs[0], xs[1]), name=name)
    return getattr(ism, op)(*xs, name=name)


def feeds(phs, seed: int = 0):
    rng = np.random.default_rng(seed)
    return {p: rng.standard_normal((N, N)).astype(np.float32) for p in phs}
