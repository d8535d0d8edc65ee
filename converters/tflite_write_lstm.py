"""isthmus's LSTMSequence as TFLite's UNIDIRECTIONAL_SEQUENCE_LSTM (fp32, forward, zero initial state).

LSTMSequence holds W [4H, I], R [4H, H] and the summed bias [4H] in ONNX's gate order (i, o, f, c);
TFLite takes one [H, I] / [H, H] / [H] tensor per gate, ordered input, forget, cell, output, and
keeps h and c in variable tensors. Only y [T, B, H] is an output: a graph that reads h_T or c_T,
runs in reverse, has per-example lengths or an initial state is refused.

LiteRT keeps variable tensors across invokes: a caller that wants each invoke to start from zeros
(isthmus's semantics) resets them (`Interpreter.reset_all_variables()`) between invokes.
"""
from __future__ import annotations

import numpy as np

from .tflite_write_layout import Translator
from .tflite_write_ops import handles

GATES = {"i": 0, "o": 1, "f": 2, "c": 3}         # ONNX order in W, R, b
TFLITE_ORDER = ("i", "f", "c", "o")


@handles("LSTMSequence")
def lstm_sequence(tr: Translator, op) -> None:
    x, w_e, r_e, b_e = op.inputs[:4]
    y = op.outputs[0]
    if any(tr.used(e) for e in op.outputs[1:]):
        raise tr.fail("h_T or c_T is read: TFLite's sequence LSTM outputs y only (read y's last step)")
    if tr.is_int8(x):
        raise tr.fail("an int8 LSTM has no TFLite form here")
    w, r, b = (tr.const(e) for e in (w_e, r_e, b_e))
    if w is None or r is None or b is None:
        raise tr.fail("LSTM weights computed at run time have no TFLite form (constant W, R, b only)")
    t, batch, _ = tr.shape(x)
    hid = tr.shape(r_e)[1]
    name = tr.m.tensors[y].name
    w, r, b = (np.asarray(v, np.float32).reshape(tr.shape(e)) for v, e in ((w, w_e), (r, r_e), (b, b_e)))

    def gate(v, g):
        k = GATES[g]
        return tr.b.const(f"{name}/{g}", np.ascontiguousarray(v[k * hid:(k + 1) * hid]))
    ins = [tr.get(x)]
    ins += [gate(w, g) for g in TFLITE_ORDER] + [gate(r, g) for g in TFLITE_ORDER]
    ins += [-1, -1, -1]                                       # no peepholes
    ins += [gate(b, g) for g in TFLITE_ORDER]
    ins += [-1, -1]                                           # no projection
    ins += [tr.b.tensor(f"{name}/{s}", np.float32, (batch, hid), is_variable=True) for s in ("h", "c")]
    ins += [-1, -1, -1, -1]                                   # no layer norm
    tr.b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ins, [tr.new(y)], "UnidirectionalSequenceLSTMOptions",
            FusedActivationFunction=4, CellClip=0.0, ProjClip=0.0, TimeMajor=True)
