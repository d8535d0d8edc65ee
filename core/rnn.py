"""Recurrent cells and dynamic_rnn, built on while_loop: no unrolling, per-example lengths.

A cell is called as `cell(x_t, state) -> (output, new_state)`; it creates its variables on
its first call. dynamic_rnn masks each example past its length: its state stops changing
and its outputs are zero there.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from . import ops as _ops  # noqa: F401  (registers the ops used below)
from .graph import Tensor
from .ops.array import concat, expand_dims, split, transpose
from .ops.fill import shape, zeros
from .ops.base import constant, convert
from .ops.control import set_row, while_loop
from .ops.linalg import bias_add, matmul
from .ops.math import add, cast, less, mul, sigmoid, sub, tanh, where
from .ops.sparse import gather
from .variables import Variable


def _glorot(rng, shape) -> np.ndarray:
    lim = np.sqrt(6.0 / (shape[0] + shape[1]))
    return rng.uniform(-lim, lim, shape).astype(np.float32)


class _Cell:
    n_states = 1

    def __init__(self, units: int, name: str, seed: int = 0, dtype="float32"):
        self.units = units
        self.name = name
        self.seed = seed
        self.dtype = np.dtype(dtype)
        self.variables: List[Variable] = []

    def _weights(self, input_dim: int, gates: int):
        if self.variables:
            return self.variables
        rng = np.random.default_rng(self.seed)
        u = self.units
        d = self.dtype
        self.variables = [
            Variable(_glorot(rng, (input_dim, gates * u)).astype(d), name=f"{self.name}/kernel"),
            Variable(np.concatenate([np.linalg.qr(rng.standard_normal((u, u)))[0]
                                     for _ in range(gates)], axis=1).astype(d), name=f"{self.name}/recurrent_kernel"),
            Variable(np.zeros(gates * u, d), name=f"{self.name}/bias"),
        ]
        return self.variables

    def zero_state(self, batch: Tensor) -> List[Tensor]:
        return [zeros_state(batch, self.units, self.dtype) for _ in range(self.n_states)]


def zeros_state(batch, units: int, dtype="float32") -> Tensor:
    if isinstance(batch, Tensor):
        return zeros(concat([expand_dims(batch, 0), constant(np.array([units], np.int32))], axis=0), dtype)
    return constant(np.zeros((batch, units), dtype))


class RNNCell(_Cell):
    """h' = tanh(x Wx + h Wh + b)."""

    def __init__(self, units: int, name: str = "rnn_cell", seed: int = 0, dtype="float32"):
        super().__init__(units, name, seed, dtype)

    def __call__(self, x, state):
        wx, wh, b = self._weights(x.shape[-1], 1)
        h = tanh(bias_add(add(matmul(x, wx), matmul(state[0], wh)), b))
        return h, [h]


class LSTMCell(_Cell):
    """Gates i, f, g, o from one product each for x and h; forget bias 1 as is customary."""
    n_states = 2

    def __init__(self, units: int, name: str = "lstm_cell", forget_bias: float = 1.0, seed: int = 0, dtype="float32"):
        super().__init__(units, name, seed, dtype)
        self.forget_bias = forget_bias

    def __call__(self, x, state):
        c, h = state
        wx, wh, b = self._weights(x.shape[-1], 4)
        z = bias_add(add(matmul(x, wx), matmul(h, wh)), b)
        i, f, g, o = split(z, 4, axis=1)
        c2 = add(mul(sigmoid(add(f, self.forget_bias)), c), mul(sigmoid(i), tanh(g)))
        h2 = mul(sigmoid(o), tanh(c2))
        return h2, [c2, h2]


class GRUCell(_Cell):
    """z, r gates; candidate n = tanh(x Wn + r * (h Un) + bn); h' = (1 - z) n + z h."""

    def __init__(self, units: int, name: str = "gru_cell", seed: int = 0, dtype="float32"):
        super().__init__(units, name, seed, dtype)

    def __call__(self, x, state):
        h = state[0]
        wx, wh, b = self._weights(x.shape[-1], 3)
        xz, xr, xn = split(bias_add(matmul(x, wx), b), 3, axis=1)
        hz, hr, hn = split(matmul(h, wh), 3, axis=1)
        zg = sigmoid(add(xz, hz))
        rg = sigmoid(add(xr, hr))
        n = tanh(add(xn, mul(rg, hn)))
        h2 = add(mul(sub(1.0, zg), n), mul(zg, h))
        return h2, [h2]


def dynamic_rnn(cell, inputs, sequence_length=None, initial_state=None, time_major: bool = False,
                return_outputs: bool = True) -> Tuple[Optional[Tensor], List[Tensor]]:
    """Run `cell` over the time axis of `inputs` with a while_loop.

    inputs: [batch, time, features] (or [time, batch, features] when time_major).
    Returns (outputs [batch, time, units] or None, final state list).
    """
    x = convert(inputs)
    if not time_major:
        x = transpose(x, (1, 0, 2))
    steps = gather(shape(x), constant(0, "int32"))
    batch = gather(shape(x), constant(1, "int32"))
    state = list(initial_state) if initial_state is not None else cell.zero_state(batch)
    cell(gather(x, constant(0, "int32")), state)  # create the variables outside the loop body
    lengths = None if sequence_length is None else cast(convert(sequence_length), "int32")
    out_acc = zeros(concat([expand_dims(steps, 0), expand_dims(batch, 0),
                            constant(np.array([cell.units], np.int32))], axis=0), x.dtype)

    def body(t, *carry):
        st, acc = list(carry[:-1]), carry[-1]
        out, new = cell(gather(x, t), st)
        if lengths is not None:
            live = expand_dims(less(t, lengths), 1)
            new = [where(live, n_, o_) for n_, o_ in zip(new, st)]
            out = where(live, out, mul(out, 0.0))
        if return_outputs:
            acc = set_row(acc, t, out)
        return [t + 1] + list(new) + [acc]

    res = while_loop(lambda t, *c: less(t, steps), body, [constant(0, "int32")] + state + [out_acc],
                     shape_invariants=[()] + [(None, cell.units)] * len(state) + [(None, None, cell.units)])
    final = list(res[1:-1])
    outputs = None
    if return_outputs:
        outputs = res[-1] if time_major else transpose(res[-1], (1, 0, 2))
    return outputs, final
