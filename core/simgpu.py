"""SimulatedGPU: a stand-in GPU (numpy underneath) whose arrays refuse to mix with host arrays.

CI has no GPU, yet placement, copy insertion, memory caps and the executor's device binding must
be tested there. This device gives kernels an array module (`SimXP`) that behaves like cupy where
it matters: its arrays are `SimArray`s (an ndarray subclass), every function and ufunc refuses a
plain host ndarray among its operands (as cupy does), results come back as SimArrays, bytes are
counted against a cap (as cupy's memory pool is), and a peak is kept. A kernel that allocates with
`np.` instead of `xp.`, or a missing copy node, therefore fails on a CPU-only machine.

Several stand-in GPUs may live in one process (data-parallel replicas, core/data_parallel.py): each
index has its own array module, meter and cap, and every SimArray carries the index of its device,
so a value of GPU:1 read by a kernel of GPU:0 without a copy node or the communicator fails too.
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


_METERS: dict = {}          # device index -> its meter (cupy's pool is per device too)
_METERS_LOCK = threading.Lock()


def meter(index: int = 0) -> _Meter:
    m = _METERS.get(index)
    if m is None:
        with _METERS_LOCK:
            m = _METERS.setdefault(index, _Meter(1 << 62))
    return m


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class SimArray(np.ndarray):
    """An array that lives on a simulated GPU (`gpu_index`: which one)."""
    __array_priority__ = 1000
    gpu_index = None  # set on every instance: views and copies inherit their parent's

    def __array_finalize__(self, obj) -> None:
        dev = getattr(obj, "gpu_index", None)
        if dev is None:
            return  # a fresh view of a host buffer: _wrap sets the device and tracks it
        self.gpu_index = dev
        r = _root(self)
        if r is not self or self.base is None:
            meter(dev).track(r)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        what = ufunc.__name__
        dev = _one_device((inputs, kwargs), what)
        args = tuple(_unwrap(a, what) for a in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(o, what) for o in kwargs["out"])
        if "where" in kwargs:
            kwargs["where"] = _unwrap(kwargs["where"], what)
        return _wrap(getattr(ufunc, method)(*args, **kwargs), dev)

    def __array_function__(self, func, types_, args, kwargs):
        for t in types_:
            if not issubclass(t, SimArray):
                raise DeviceMixError(f"{func.__name__}: a host array ({t.__name__}) met a simulated-GPU array; "
                                     "a copy node must move it first")
        dev = _one_device((args, kwargs), func.__name__)
        return _wrap(func(*_unwrap_tree(args, func.__name__), **_unwrap_tree(kwargs, func.__name__)), dev)

    def __getitem__(self, key):
        r = super().__getitem__(key)
        return _wrap(r, self.gpu_index) if isinstance(r, np.generic) else r  # cupy indexing gives 0-d device arrays

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


def _device_arrays(v, found: list) -> None:
    if isinstance(v, SimArray):
        found.append(v)
    elif type(v) in (list, tuple):
        for x in v:
            _device_arrays(x, found)
    elif type(v) is dict:
        for x in v.values():
            _device_arrays(x, found)


def _one_device(tree, what: str, want: Optional[int] = None) -> int:
    """The one simulated device that the arrays in `tree` live on (`want`: the caller's); two
    devices met without a copy or the communicator between them raise DeviceMixError."""
    found: list = []
    _device_arrays(tree, found)
    devs = {a.gpu_index for a in found}
    if want is not None:
        devs.add(want)
    if len(devs) > 1:
        shown = ", ".join(f"/device:GPU:{d}" for d in sorted(devs))
        raise DeviceMixError(f"{what}: arrays of different simulated GPUs met ({shown}); a copy node or the "
                             "communicator (core/collective.py) must move them first")
    return devs.pop() if devs else 0


def _wrap(r, dev: int):
    if isinstance(r, SimArray):
        return r
    if isinstance(r, np.generic):  # cupy reductions give 0-d device arrays, never host scalars
        r = np.asarray(r)
    if isinstance(r, np.ndarray):
        out = r.view(SimArray)
        out.gpu_index = dev
        meter(dev).track(_root(out))
        return out
    if type(r) in (list, tuple):
        return type(r)(_wrap(x, dev) for x in r)
    return r


class _UFunc:
    """xp.add and friends: call, .at, .reduce, .accumulate, .outer, all on device arrays."""

    def __init__(self, uf: np.ufunc, dev: int):
        self._uf, self._dev = uf, dev
        self.__name__ = uf.__name__

    def __call__(self, *args, **kwargs):
        return _call(self._uf, args, kwargs, self._dev)

    def __getattr__(self, name):
        attr = getattr(self._uf, name)
        if callable(attr):
            return lambda *a, **k: _call(attr, a, k, self._dev)
        return attr


def _call(fn, args, kwargs, dev: int):
    name = getattr(fn, "__name__", "call")
    _one_device((args, kwargs), name, dev)
    return _wrap(fn(*_unwrap_tree(args, name), **_unwrap_tree(kwargs, name)), dev)


def _from_host(a, dev: int, dtype=None, copy=True, order="K"):
    """xp.asarray/xp.array: host data is copied onto the device (as cupy does); device data stays."""
    if isinstance(a, SimArray):
        _one_device(a, "asarray", dev)
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(dtype)
        return a.copy(order=order if order in "CFA" else "K") if copy is True else a
    host = np.array(a, dtype=dtype, copy=True, order=order if order in "CFAK" else "K")
    return _wrap(host, dev)


class SimXP(types.ModuleType):
    """The array module of one simulated GPU (what `cupy` is to a real one, with that GPU current)."""

    def __init__(self, base=np, name: str = "isthmus_simgpu", device: int = 0):
        super().__init__(name)
        self._base = base
        self.device = device

    def asarray(self, a, dtype=None, order=None):
        return _from_host(a, self.device, dtype, copy=False, order=order or "K")

    def array(self, a, dtype=None, copy=True, order="K", **_):
        return _from_host(a, self.device, dtype, copy=copy, order=order)

    def ascontiguousarray(self, a, dtype=None):
        if not isinstance(a, SimArray):
            _unwrap(a, "ascontiguousarray")
        return _call(np.ascontiguousarray, (a,), {"dtype": dtype} if dtype is not None else {}, self.device)

    def asnumpy(self, a):
        return a.get() if isinstance(a, SimArray) else np.asarray(a)

    def __getattr__(self, name):
        attr = getattr(self._base, name)
        if isinstance(attr, np.ufunc):
            out = _UFunc(attr, self.device)
        elif isinstance(attr, types.ModuleType):
            out = SimXP(attr, f"{self.__name__}.{name}", self.device)
        elif isinstance(attr, type) or not callable(attr):
            out = attr  # dtypes, np.inf, np.newaxis ...
        else:
            out = _bind(attr, self.device)
        setattr(self, name, out)  # cache: the next lookup is a plain attribute
        return out


def _bind(fn, dev: int):
    def call(*args, **kwargs):
        return _call(fn, args, kwargs, dev)
    call.__name__ = getattr(fn, "__name__", "call")
    return call


_XPS: dict = {}


def sim_xp(index: int = 0) -> SimXP:
    """The array module of simulated GPU `index`."""
    xp = _XPS.get(index)
    if xp is None:
        with _METERS_LOCK:
            xp = _XPS.setdefault(index, SimXP(np, "isthmus_simgpu" if index == 0 else f"isthmus_simgpu{index}", index))
    return xp


SIM_XP = sim_xp(0)


def is_device_array(x) -> bool:
    return isinstance(x, SimArray)


def to_device(x, out: Optional[SimArray] = None, index: int = 0) -> SimArray:
    """Host -> simulated device `index`: always a copy, as a DMA is."""
    if isinstance(x, SimArray):
        raise DeviceMixError(f"to_device: the value is already on simulated /device:GPU:{x.gpu_index}")
    if out is not None:
        np.copyto(out.view(np.ndarray), x)
        return out
    return _wrap(np.array(x, copy=True, order="C"), index)


def to_host(x) -> np.ndarray:
    """Simulated device -> host: a plain ndarray copy."""
    if not isinstance(x, SimArray):
        raise DeviceMixError(f"to_host: the value ({type(x).__name__}) is not on the simulated GPU")
    return np.array(x.view(np.ndarray), copy=True)
