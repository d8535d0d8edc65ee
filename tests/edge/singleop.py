"""Run one edge op through the writer, the loader and the interpreter (no core graph involved)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from isthmus.edge.interpreter import Interpreter
from isthmus.edge.writer import ModelWriter


@dataclass
class Arg:
    value: np.ndarray
    const: bool = False
    scale: Optional[Sequence[float]] = None
    zero_point: Optional[Sequence[int]] = None
    axis: int = -1


@dataclass
class Out:
    dtype: str
    scale: Optional[Sequence[float]] = None
    zero_point: Optional[Sequence[int]] = None
    axis: int = -1
    shape: Optional[Sequence[int]] = None  # None: all dims checked against the reference's


def q(value, scale, zp, const=False, axis=-1) -> Arg:
    s = [float(v) for v in np.atleast_1d(scale)]
    z = [int(v) for v in np.atleast_1d(zp)]
    return Arg(np.asarray(value), const, s, z, axis)


def model(op: str, args: List[Arg], out: Out, shape, attrs: Optional[Dict] = None) -> bytes:
    w = ModelWriter()
    ids = []
    for k, a in enumerate(args):
        v = np.asarray(a.value)
        quant = {} if a.scale is None else dict(scale=a.scale, zero_point=a.zero_point, axis=a.axis)
        if a.const:
            ids.append(w.add_constant(f"c{k}", v, **quant))
        else:
            ids.append(w.add_tensor(f"in{k}", v.dtype, v.shape, **quant))
            w.inputs.append(ids[-1])
    quant = {} if out.scale is None else dict(scale=out.scale, zero_point=out.zero_point, axis=out.axis)
    y = w.add_tensor("y", out.dtype, shape if out.shape is None else out.shape, **quant)
    w.add_operator(op, ids, [y], attrs or {})
    w.mark_output(y)
    return w.to_bytes()


def run(op: str, args: List[Arg], out: Out, shape, attrs: Optional[Dict] = None) -> np.ndarray:
    interp = Interpreter(model(op, args, out, shape, attrs))
    feeds = [a.value for a in args if not a.const]
    got = interp.invoke(*feeds)[0]
    again = interp.invoke(*feeds)[0]  # the arena and scratch are reused: same answer
    np.testing.assert_array_equal(got, again)
    return got
