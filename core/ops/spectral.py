"""Discrete Fourier transforms in ONNX's layout (a last axis of 1 for real, 2 for real/imaginary): DFT
along one axis (inverse normalised by 1/n; onesided keeps n // 2 + 1 bins, or for the inverse reads
them and returns a real signal) and STFT (frames of a signal, windowed, transformed). FFT kernels
of the device's array module (numpy.fft, cupy.fft), no gradient."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import fmt
from .base import convert, make

__all__ = ["dft", "stft"]


def _scalar(v) -> int:
    return int(np.asarray(v).reshape(-1)[0])  # a size or an axis: host memory (passes/copies.py)


def _complex(xp, x):
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0].astype(xp.complex128)


def _as_pairs(xp, z, dtype):
    return xp.stack([z.real, z.imag], -1).astype(dtype)


def _infer_dft(node):
    x = node.inputs[0]
    if len(x.shape) < 2 or x.shape[-1] not in (1, 2, None) or x.dtype.kind != "f":
        raise ShapeError(f"DFT needs a float input [..., 1 or 2], got {x.dtype.name}{fmt(x.shape)}")
    a = node.attrs
    rank = len(x.shape)
    static = len(node.inputs) == 1 and a["axis"] is not None
    shape = [None] * rank
    if static:
        axis = a["axis"] + rank if a["axis"] < 0 else a["axis"]
        if not 0 <= axis < rank - 1:
            raise ShapeError(f"DFT axis {a['axis']} is not a signal axis of {fmt(x.shape)}")
        shape = list(x.shape)
        n = x.shape[axis]
        if a["onesided"] and not a["inverse"] and n is not None:
            shape[axis] = n // 2 + 1
        elif a["onesided"] and a["inverse"] and n is not None:
            shape[axis] = 2 * (n - 1)
    shape[-1] = 1 if a["onesided"] and a["inverse"] else 2
    return [(x.dtype, tuple(shape))]


def _kernel_dft(node, ctx):
    a, xp = node.attrs, ctx.xp

    def run(x, length=None, axis_t=None):
        x = xp.asarray(x)
        axis = _scalar(axis_t) if axis_t is not None else a["axis"]
        axis = axis + x.ndim if axis < 0 else axis  # counted over every axis, the real/imaginary one included
        if not 0 <= axis < x.ndim - 1:
            raise ValueError(f"DFT axis {axis} is not a signal axis of an input of rank {x.ndim}")
        n = _scalar(length) if length is not None and np.asarray(length).size else None
        z = _complex(xp, x)
        if a["inverse"] and a["onesided"]:
            y = xp.fft.irfft(z, n=n, axis=axis)
            return y[..., None].astype(x.dtype)
        y = xp.fft.ifft(z, n=n, axis=axis) if a["inverse"] else xp.fft.fft(z, n=n, axis=axis)
        if a["onesided"]:
            y = y[(slice(None),) * axis + (slice(0, y.shape[axis] // 2 + 1),)]
        return _as_pairs(xp, y, x.dtype)
    return run


register(OpDef("DFT", inputs=("x", "*length_axis"), attrs={"axis": 1, "inverse": False, "onesided": False},
               infer=_infer_dft, kernel=_kernel_dft, cost=lambda node: Cost(0, 0, 0),
               doc="ONNX DFT: inputs x [..., 1|2] and optionally dft_length and a run-time axis."))


def dft(x, dft_length=None, axis=1, inverse: bool = False, onesided: bool = False,
        name: Optional[str] = None) -> Tensor:
    """`axis` an int or a scalar integer Tensor read at run time (then dft_length may be None)."""
    ins = [convert(x)]
    if isinstance(axis, Tensor):
        ins += [convert(dft_length) if dft_length is not None else convert(np.zeros(0, np.int64)), axis]
    elif dft_length is not None:
        ins.append(convert(dft_length))
    return make("DFT", ins, {"axis": None if isinstance(axis, Tensor) else int(axis), "inverse": bool(inverse),
                             "onesided": bool(onesided)}, name=name).outputs[0]


def _infer_stft(node):
    x = node.inputs[0]
    if len(x.shape) != 3 or x.dtype.kind != "f":
        raise ShapeError(f"STFT needs a float signal [batch, length, 1 or 2], got {x.dtype.name}{fmt(x.shape)}")
    return [(x.dtype, (x.shape[0], None, None, 2))]


def _kernel_stft(node, ctx):
    onesided, xp = node.attrs["onesided"], ctx.xp

    def run(signal, step, window=None, length=None):
        x = xp.asarray(signal)
        step = _scalar(step)
        win = None if window is None or window.size == 0 else xp.asarray(window)
        n = _scalar(length) if length is not None and np.asarray(length).size else (len(win) if win is not None else None)
        if n is None or step < 1 or n < 1:
            raise ValueError(f"STFT needs a frame length (window or frame_length) and a positive step, got {n}, {step}")
        frames = (x.shape[1] - n) // step + 1
        idx = xp.arange(frames)[:, None] * step + xp.arange(n)[None, :]
        z = _complex(xp, x)[:, idx]  # [batch, frames, n]
        if win is not None:
            z = z * win
        y = xp.fft.fft(z, axis=-1)
        if onesided:
            y = y[..., :n // 2 + 1]
        return _as_pairs(xp, y, x.dtype)
    return run


register(OpDef("STFT", inputs=("signal", "frame_step", "*window_length"), attrs={"onesided": True},
               infer=_infer_stft, kernel=_kernel_stft, cost=lambda node: Cost(0, 0, 0),
               doc="ONNX STFT: [batch, frames, bins, 2] of the windowed frames' DFTs."))


def stft(signal, frame_step, window=None, frame_length=None, onesided: bool = True,
         name: Optional[str] = None) -> Tensor:
    ins = [convert(signal), convert(frame_step)]
    if window is not None or frame_length is not None:
        ins.append(convert(window) if window is not None else convert(np.zeros(0, np.float32)))
    if frame_length is not None:
        ins.append(convert(frame_length))
    return make("STFT", ins, {"onesided": bool(onesided)}, name=name).outputs[0]
