"""Runs the onnx package's own node test cases (models + data sets, built in memory by
onnx.backend.test.case.node) through from_onnx and the isthmus Session, one case at a time."""
from __future__ import annotations

import re
import warnings
from functools import lru_cache
from typing import Dict, List

import numpy as np

import isthmus as ism
from isthmus.converters import from_onnx


@lru_cache(maxsize=1)
def _all_cases() -> Dict[str, object]:
    from onnx.backend.test.case import node
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return {c.name: c for c in node.collect_testcases(None)}


def case_names(pattern: str, exclude: str = r"$^") -> List[str]:
    """Names of the cases whose name matches `pattern` (re.match) and not `exclude` (re.search)."""
    return sorted(n for n in _all_cases() if re.match(pattern, n) and not re.search(exclude, n))


def _array(v) -> np.ndarray:
    """Data sets hold arrays, or TensorProtos for dtypes numpy spells differently."""
    from onnx import TensorProto, numpy_helper
    return numpy_helper.to_array(v) if isinstance(v, TensorProto) else np.asarray(v)


def run_case(name: str) -> None:
    """Import the case's model, run every data set, compare outputs (dtype, shape, values)."""
    case = _all_cases()[name]
    g, ins, outs = from_onnx(case.model)
    sess = ism.Session(g)
    names = [i.name for i in case.model.graph.input if i.name in ins]
    for inputs, expected in case.data_sets:
        inputs, expected = [_array(v) for v in inputs], [_array(v) for v in expected]
        feed = {ins[n]: v for n, v in zip(names, inputs)}
        got = sess.run(outs, feed)
        assert len(got) == len(expected), f"{name}: {len(got)} outputs, expected {len(expected)}"
        for k, (gv, ev) in enumerate(zip(got, expected)):
            gv, ev = np.asarray(gv), np.asarray(ev)
            assert gv.dtype == ev.dtype, f"{name} output {k}: dtype {gv.dtype}, expected {ev.dtype}"
            assert gv.shape == ev.shape, f"{name} output {k}: shape {gv.shape}, expected {ev.shape}"
            if ev.dtype.kind in "fc":
                np.testing.assert_allclose(gv, ev, rtol=case.rtol, atol=case.atol, err_msg=f"{name} output {k}")
            else:
                np.testing.assert_array_equal(gv, ev, err_msg=f"{name} output {k}")
