"""Kernels for GPU devices, written against the device's array module (cupy, or the CI stand-in).

Where a core kernel's fast path is numba or numpy-only (strided views from numpy, compiled
loops), the GPU gets its own kernel here: convolution as im2col + one GEMM, depthwise
convolution tap by tap, pooling. `install()` puts a dispatcher in front of the op's kernel
factory: a context whose array module is numpy keeps the CPU kernel, any other gets these.
"""
from __future__ import annotations

import threading

import numpy as np

from .. import registry

_installed = False
_install_lock = threading.Lock()  # data-parallel replicas bind their sessions in threads of their own


def _dispatch(cpu_factory, gpu_factory):
    def factory(node, ctx):
        if ctx.xp is np:
            return cpu_factory(node, ctx)
        return gpu_factory(node, ctx)
    factory.cpu = cpu_factory
    factory.gpu = gpu_factory
    return factory


def generic_factory(op: str):
    """The op's own (array-module generic) kernel factory, whether or not install() ran."""
    k = registry.get(op).kernel
    return getattr(k, "cpu", k)


def install() -> None:
    """Route the ops below to their GPU kernels on GPU devices (once per process)."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if not _installed:
            _install()


def _install() -> None:
    global _installed
    # cycle: core.gpu_kernels <-> core.gpu_kernels.batchnorm
    from . import batchnorm, conv, elementwise, gemm, pool, state
    table = {**conv.KERNELS, **pool.KERNELS, **gemm.KERNELS, **elementwise.KERNELS, **state.KERNELS,
             **batchnorm.KERNELS}
    for op, gpu_factory in table.items():
        d = registry.get(op)
        d.kernel = _dispatch(d.kernel, gpu_factory)
    _installed = True
