"""The tables of edge kernels by op name, fp32 and int8, and the decorators that fill them: the
kernel families (kernels_*.py, int8_*.py) register here, so none imports the module that loads them all."""
from __future__ import annotations

from typing import Callable, Dict

KERNELS: Dict[str, Callable] = {}
INT8_KERNELS: Dict[str, Callable] = {}


def kernel(*names):
    """Registers an fp32 kernel factory under each of `names`."""
    def deco(f):
        for n in names:
            KERNELS[n] = f
        return f
    return deco


def int8_kernel(*names):
    """Registers an int8 kernel factory under each of `names`."""
    def deco(f):
        for n in names:
            INT8_KERNELS[n] = f
        return f
    return deco
