"""A small .tflite writer for the tests (there is no TensorFlow here): the flatbuffers Builder
driven through the `tflite` package's generated builder functions."""
from __future__ import annotations

import importlib
from typing import Dict, List, Optional, Sequence

import flatbuffers
import numpy as np
import tflite
from tflite.BuiltinOperator import BuiltinOperator
from tflite.BuiltinOptions import BuiltinOptions

TYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.int32): 2, np.dtype(np.uint8): 3,
         np.dtype(np.int64): 4, np.dtype(np.int8): 9, np.dtype(np.int16): 7}


class TFLiteWriter:
    def __init__(self):
        self.tensors: List[dict] = []
        self.buffers: List[bytes] = [b""]  # buffer 0: the empty buffer by convention
        self.ops: List[dict] = []
        self.codes: List[int] = []

    def tensor(self, name: str, shape: Sequence[int], dtype=np.float32, data: Optional[np.ndarray] = None,
               scale=None, zero_point=None, qdim: int = 0, signature: Optional[Sequence[int]] = None) -> int:
        buf = 0
        if data is not None:
            self.buffers.append(np.ascontiguousarray(np.asarray(data, dtype)).tobytes())
            buf = len(self.buffers) - 1
        self.tensors.append(dict(name=name, shape=list(shape), type=TYPES[np.dtype(dtype)], buffer=buf,
                                 scale=scale, zero_point=zero_point, qdim=qdim, signature=signature))
        return len(self.tensors) - 1

    def const(self, name: str, value: np.ndarray, **q) -> int:
        return self.tensor(name, value.shape, value.dtype, value, **q)

    def op(self, name: str, inputs: Sequence[int], outputs: Sequence[int], options: Optional[Dict] = None,
           options_class: Optional[str] = None) -> None:
        code = getattr(BuiltinOperator, name)
        if code not in self.codes:
            self.codes.append(code)
        self.ops.append(dict(code=self.codes.index(code), inputs=list(inputs), outputs=list(outputs),
                             options=options or {}, cls=options_class))

    def custom_op(self, code: str, inputs: Sequence[int], outputs: Sequence[int], options: bytes = b"") -> None:
        """A CUSTOM operator named `code` whose custom_options are the raw bytes given."""
        if code not in self.codes:
            self.codes.append(code)
        self.ops.append(dict(code=self.codes.index(code), inputs=list(inputs), outputs=list(outputs),
                             options={}, cls=None, custom=bytes(options)))

    # ---- serialization ----------------------------------------------------------------------------
    def finish(self, inputs: Sequence[int], outputs: Sequence[int]) -> bytes:
        b = flatbuffers.Builder(1024)
        buf_offs = []
        for data in self.buffers:
            vec = b.CreateNumpyVector(np.frombuffer(data, np.uint8)) if data else None
            tflite.BufferStart(b)
            if vec is not None:
                tflite.BufferAddData(b, vec)
            buf_offs.append(tflite.BufferEnd(b))
        t_offs = [self._tensor(b, t) for t in self.tensors]
        op_offs = [self._op(b, o) for o in self.ops]
        sub = self._subgraph(b, t_offs, op_offs, inputs, outputs)
        codes = []
        for c in self.codes:
            custom = b.CreateString(c) if isinstance(c, str) else None
            c = BuiltinOperator.CUSTOM if isinstance(c, str) else c
            tflite.OperatorCodeStart(b)
            tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(c, 127))
            tflite.OperatorCodeAddBuiltinCode(b, c)
            if custom is not None:
                tflite.OperatorCodeAddCustomCode(b, custom)
            tflite.OperatorCodeAddVersion(b, 1)
            codes.append(tflite.OperatorCodeEnd(b))
        codes_v = self._offsets(b, tflite.ModelStartOperatorCodesVector, codes)
        subs_v = self._offsets(b, tflite.ModelStartSubgraphsVector, [sub])
        bufs_v = self._offsets(b, tflite.ModelStartBuffersVector, buf_offs)
        desc = b.CreateString("isthmus test model")
        tflite.ModelStart(b)
        tflite.ModelAddVersion(b, 3)
        tflite.ModelAddOperatorCodes(b, codes_v)
        tflite.ModelAddSubgraphs(b, subs_v)
        tflite.ModelAddDescription(b, desc)
        tflite.ModelAddBuffers(b, bufs_v)
        b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    @staticmethod
    def _offsets(b, start, offs):
        start(b, len(offs))
        for o in reversed(offs):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()

    def _tensor(self, b, t):
        name = b.CreateString(t["name"])
        shape = b.CreateNumpyVector(np.asarray(t["shape"], np.int32))
        sig = b.CreateNumpyVector(np.asarray(t["signature"], np.int32)) if t["signature"] is not None else None
        q = None
        if t["scale"] is not None:
            sc = b.CreateNumpyVector(np.asarray(t["scale"], np.float32).reshape(-1))
            zp = b.CreateNumpyVector(np.asarray(t["zero_point"], np.int64).reshape(-1))
            tflite.QuantizationParametersStart(b)
            tflite.QuantizationParametersAddScale(b, sc)
            tflite.QuantizationParametersAddZeroPoint(b, zp)
            tflite.QuantizationParametersAddQuantizedDimension(b, t["qdim"])
            q = tflite.QuantizationParametersEnd(b)
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape)
        if sig is not None:
            tflite.TensorAddShapeSignature(b, sig)
        tflite.TensorAddType(b, t["type"])
        tflite.TensorAddBuffer(b, t["buffer"])
        tflite.TensorAddName(b, name)
        if q is not None:
            tflite.TensorAddQuantization(b, q)
        return tflite.TensorEnd(b)

    def _op(self, b, o):
        opts = None
        if o["cls"]:
            mod = importlib.import_module(f"tflite.{o['cls']}")
            vecs = {k: b.CreateNumpyVector(np.asarray(v, np.int32)) for k, v in o["options"].items()
                    if isinstance(v, (list, tuple))}
            getattr(mod, f"{o['cls']}Start")(b)
            for k, v in o["options"].items():
                getattr(mod, f"{o['cls']}Add{k}")(b, vecs.get(k, v))
            opts = getattr(mod, f"{o['cls']}End")(b)
        ins = b.CreateNumpyVector(np.asarray(o["inputs"], np.int32))
        outs = b.CreateNumpyVector(np.asarray(o["outputs"], np.int32))
        custom = b.CreateNumpyVector(np.frombuffer(o["custom"], np.uint8)) if o.get("custom") else None
        tflite.OperatorStart(b)
        if custom is not None:
            tflite.OperatorAddCustomOptions(b, custom)
        tflite.OperatorAddOpcodeIndex(b, o["code"])
        tflite.OperatorAddInputs(b, ins)
        tflite.OperatorAddOutputs(b, outs)
        if opts is not None:
            tflite.OperatorAddBuiltinOptionsType(b, getattr(BuiltinOptions, o["cls"]))
            tflite.OperatorAddBuiltinOptions(b, opts)
        return tflite.OperatorEnd(b)

    def _subgraph(self, b, t_offs, op_offs, inputs, outputs):
        tv = self._offsets(b, tflite.SubGraphStartTensorsVector, t_offs)
        ov = self._offsets(b, tflite.SubGraphStartOperatorsVector, op_offs)
        iv = b.CreateNumpyVector(np.asarray(inputs, np.int32))
        outv = b.CreateNumpyVector(np.asarray(outputs, np.int32))
        name = b.CreateString("main")
        tflite.SubGraphStart(b)
        tflite.SubGraphAddTensors(b, tv)
        tflite.SubGraphAddInputs(b, iv)
        tflite.SubGraphAddOutputs(b, outv)
        tflite.SubGraphAddOperators(b, ov)
        tflite.SubGraphAddName(b, name)
        return tflite.SubGraphEnd(b)
