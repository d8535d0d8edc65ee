"""isthmus's LSTMSequence as TFLite's UNIDIRECTIONAL_SEQUENCE_LSTM (fp32, zero initial state).

LSTMSequence holds W [4H, I], R [4H, H] and the summed bias [4H] in ONNX's gate order (i, o, f, c);
TFLite takes one [H, I] / [H, H] / [H] tensor per gate, ordered input, forget, cell, output, and
keeps h and c in variable tensors. TFLite's op outputs y only and runs forward, so: h_T (what most
exported models read) is y's last step, a GATHER; a reverse direction (and so each half of an ONNX
bidirectional LSTM) runs forward on the time-reversed input between two REVERSE_V2 ops, its h_T
being the last step before the second reversal. An LSTM whose c_T is read or whose initial states are
inputs is written unrolled instead (tflite_write_unrolled.py); per-example lengths are refused by
edge/capabilities.py.

LiteRT keeps variable tensors across invokes: a caller that wants each invoke to start from zeros
(isthmus's semantics) resets them (`Interpreter.reset_all_variables()`) between invokes.
"""
from __future__ import annotations

import numpy as np

from .tflite_write_layout import Translator
from .tflite_write_ops import handles
from .tflite_write_unrolled import lstm_unrolled

GATES = {"i": 0, "o": 1, "f": 2, "c": 3}         # ONNX order in W, R, b
TFLITE_ORDER = ("i", "f", "c", "o")


@handles("LSTMSequence")
def lstm_sequence(tr: Translator, op) -> None:
    x, w_e, r_e, b_e = op.inputs[:4]
    y = op.outputs[0]
    if (len(op.outputs) > 2 and tr.used(op.outputs[2])) or any(e >= 0 for e in op.inputs[4:]):
        lstm_unrolled(tr, op)     # c_T read, or initial states: TFLite's sequence LSTM keeps both inside
        return
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
    reverse = bool(int(op.attrs.get("reverse", 0)))
    xi = tr.get(x)
    if reverse:
        xi = _reversed(tr, xi, f"{name}/x_reversed", tr.shape(x))
    ins = [xi]
    ins += [gate(w, g) for g in TFLITE_ORDER] + [gate(r, g) for g in TFLITE_ORDER]
    ins += [-1, -1, -1]                                       # no peepholes
    ins += [gate(b, g) for g in TFLITE_ORDER]
    ins += [-1, -1]                                           # no projection
    ins += [tr.b.tensor(f"{name}/{s}", np.float32, (batch, hid), is_variable=True) for s in ("h", "c")]
    ins += [-1, -1, -1, -1]                                   # no layer norm
    steps = tr.scratch(f"{name}/steps", np.float32, (t, batch, hid)) if reverse else tr.new(y)
    tr.b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ins, [steps], "UnidirectionalSequenceLSTMOptions",
            FusedActivationFunction=4, CellClip=0.0, ProjClip=0.0, TimeMajor=True)
    if reverse:
        _reversed(tr, steps, "", (t, batch, hid), out=tr.new(y))
    if len(op.outputs) > 1 and tr.used(op.outputs[1]):       # h_T: the last step the LSTM took
        last = tr.b.const(f"{name}/last_step", np.asarray(t - 1, np.int32))
        tr.b.op("GATHER", [steps, last], [tr.new(op.outputs[1])], "GatherOptions", Axis=0, BatchDims=0)


def _reversed(tr: Translator, src: int, name: str, shape, out: int = -1) -> int:
    """REVERSE_V2 of a [T, B, F] tensor along time; into `out`, else a new scratch tensor `name`."""
    if out < 0:
        out = tr.scratch(name, np.float32, shape)
    axis = tr.b.const(f"{tr.b.tensors[src].name}/time_axis", np.asarray([0], np.int32))
    tr.b.op("REVERSE_V2", [src, axis], [out], "ReverseV2Options")
    return out
