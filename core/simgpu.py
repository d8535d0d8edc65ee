"""SimulatedGPU: a stand-in GPU (numpy underneath) whose arrays refuse to mix with host arrays.

CI has no GPU, yet placement, copy insertion, memory caps and the executor's device binding must
be tested there. This device gives kernels an array module (`SimXP`) that behaves like cupy where
it matters: its arrays are `SimArray`s (an ndarray subclass), every function and ufunc refuses a
plain host ndarray among its operands (as cupy does), results come back as SimArrays, bytes are
counted against a cap (as cupy's memory pool is), and a peak is kept. A kernel that allocates with
`np.` instead of `xp.`, or a missing copy node, therefore fails on a CPU-only machine.
"""
from __future__ import annotations

import threading
import types
import weakref
from typing import Optional

import numpy as np


class DeviceMixError(TypeError):
    """A host array met a (simulated) device array without a copy node between them."""


class SimulatedOutOfMemory(MemoryError):
    """The simulated device's memory cap was exceeded (cupy raises OutOfMemoryError)."""


class _Meter:
    """Live and peak bytes of one simulated device, with a cap."""

    def __init__(self, cap: int):
        self.cap, self.used, self.peak = cap, 0, 0
        self._lock = threading.Lock()
        self._owners: dict = {}  # id(root buffer) -> finalizer

    def track(self, root: np.ndarray) -> None:
        key = id(root)
        if key in self._owners:
            return
        n = root.nbytes
        with self._lock:
            if self.used + n > self.cap:
                raise SimulatedOutOfMemory(f"out of memory allocating {n} bytes ({self.used} in use, cap {self.cap})")
            self.used += n
            self.peak = max(self.peak, self.used)
        self._owners[key] = weakref.finalize(root, self._free, key, n)

    def _free(self, key: int, n: int) -> None:
        with self._lock:
            self.used -= n
        self._owners.pop(key, None)

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.used


_METER = _Meter(1 << 62)  # one simulated device per process (as cupy's default pool)


def meter() -> _Meter:
    return _METER


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class SimArray(np.ndarray):
    """An array that lives on the simulated GPU."""
    __array_priority__ = 1000

    def __array_finalize__(self, obj) -> None:
        r = _root(self)
        if r is not self or self.base is None:
            _METER.track(r)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        args = tuple(_unwrap(a, ufunc.__name__) for a in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(o, ufunc.__name__) for o in kwargs["out"])
        if "where" in kwargs:
            kwargs["where"] = _unwrap(kwargs["where"], ufunc.__name__)
        return _wrap(getattr(ufunc, method)(*args, **kwargs))

    def __array_function__(self, func, types_, args, kwargs):
        for t in types_:
            if not issubclass(t, SimArray):
                raise DeviceMixError(f"{func.__name__}: a host array ({t.__name__}) met a simulated-GPU array; "
                                     "a copy node must move it first")
        return _wrap(func(*_unwrap_tree(args, func.__name__), **_unwrap_tree(kwargs, func.__name__)))

    def __getitem__(self, key):
        r = super().__getitem__(key)
        return _wrap(r) if isinstance(r, np.generic) else r  # cupy indexing gives 0-d device arrays

    def get(self) -> np.ndarray:
        """A host copy (as cupy.ndarray.get)."""
        return np.array(self.view(np.ndarray), copy=True)

    def __reduce__(self):
        raise TypeError("a simulated-GPU array cannot be pickled; copy it to the host first")


def _unwrap(a, what: str):
    if isinstance(a, SimArray):
        return a.view(np.ndarray)
    if isinstance(a, np.ndarray):
        raise DeviceMixError(f"{what}: a host array ({a.dtype}{list(a.shape)}) met a simulated-GPU array; "
                             "a copy node must move it first")
    return a


def _unwrap_tree(v, what: str):
    if isinstance(v, (SimArray, np.ndarray)):
        return _unwrap(v, what)
    if type(v) in (list, tuple):
        return type(v)(_unwrap_tree(x, what) for x in v)
    if type(v) is dict:
        return {k: _unwrap_tree(x, what) for k, x in v.items()}
    return v


def _wrap(r):
    if isinstance(r, SimArray):
        return r
    if isinstance(r, np.ndarray):
        return r.view(SimArray)
    if isinstance(r, np.generic):  # cupy reductions give 0-d device arrays, never host scalars
        return np.asarray(r).view(SimArray)
    if type(r) in (list, tuple):
        return type(r)(_wrap(x) for x in r)
    return r


class _UFunc:
    """xp.add and friends: call, .at, .reduce, .accumulate, .outer, all on device arrays."""

    def __init__(self, uf: np.ufunc):
        self._uf = uf
        self.__name__ = uf.__name__

    def __call__(self, *args, **kwargs):
        return _call(self._uf, args, kwargs)

    def __getattr__(self, name):
        attr = getattr(self._uf, name)
        if callable(attr):
            return lambda *a, **k: _call(attr, a, k)
        return attr


def _call(fn, args, kwargs):
    name = getattr(fn, "__name__", "call")
    return _wrap(fn(*_unwrap_tree(args, name), **_unwrap_tree(kwargs, name)))


def _from_host(a, dtype=None, copy=True, order="K"):
    """xp.asarray/xp.array: host data is copied onto the device (as cupy does); device data stays."""
    if isinstance(a, SimArray):
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(dtype)
        return a.copy(order=order if order in "CFA" else "K") if copy is True else a
    host = np.array(a, dtype=dtype, copy=True, order=order if order in "CFAK" else "K")
    return host.view(SimArray)


class SimXP(types.ModuleType):
    """The array module of the simulated GPU (what `cupy` is to a real one)."""

    def __init__(self, base=np, name: str = "isthmus_simgpu"):
        super().__init__(name)
        self._base = base

    def asarray(self, a, dtype=None, order=None):
        return _from_host(a, dtype, copy=False, order=order or "K")

    def array(self, a, dtype=None, copy=True, order="K", **_):
        return _from_host(a, dtype, copy=copy, order=order)

    def ascontiguousarray(self, a, dtype=None):
        if not isinstance(a, SimArray):
            _unwrap(a, "ascontiguousarray")
        return _call(np.ascontiguousarray, (a,), {"dtype": dtype} if dtype is not None else {})

    def asnumpy(self, a):
        return a.get() if isinstance(a, SimArray) else np.asarray(a)

    def __getattr__(self, name):
        attr = getattr(self._base, name)
        if isinstance(attr, np.ufunc):
            out = _UFunc(attr)
        elif isinstance(attr, types.ModuleType):
            out = SimXP(attr, f"{self.__name__}.{name}")
        elif isinstance(attr, type) or not callable(attr):
            out = attr  # dtypes, np.inf, np.newaxis ...
        else:
            out = _bind(attr)
        setattr(self, name, out)  # cache: the next lookup is a plain attribute
        return out


def _bind(fn):
    def call(*args, **kwargs):
        return _call(fn, args, kwargs)
    call.__name__ = getattr(fn, "__name__", "call")
    return call


SIM_XP = SimXP()


def is_device_array(x) -> bool:
    return isinstance(x, SimArray)


def to_device(x, out: Optional[SimArray] = None) -> SimArray:
    """Host -> simulated device: always a copy, as a DMA is."""
    if isinstance(x, SimArray):
        raise DeviceMixError("to_device: the value is already on the simulated GPU")
    if out is not None:
        np.copyto(out.view(np.ndarray), x)
        return out
    return np.array(x, copy=True, order="C").view(SimArray)


def to_host(x) -> np.ndarray:
    """Simulated device -> host: a plain ndarray copy."""
    if not isinstance(x, SimArray):
        raise DeviceMixError(f"to_host: the value ({type(x).__name__}) is not on the simulated GPU")
    return np.array(x.view(np.ndarray), copy=True)
