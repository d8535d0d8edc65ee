"""The CUDA GPU: the ONE place that imports cupy (lazily).

Availability, the array module per device kind, the memory-pool cap, and CudaDevice: the
runtime a Session binds GPU nodes to (host<->device copies staged through pinned memory when
large, the pool's peak sampled after each GPU node, out-of-memory recognised). Without cupy or
a GPU, GPU devices are absent and `require_gpu` raises a clear error naming the node pinned to one.
"""
from __future__ import annotations

import os
import threading
from typing import Optional, Union

import numpy as np

_cupy = None          # the cupy module once imported
_probe_done = False
_probe_error: Optional[str] = None

DEFAULT_POOL_FRACTION = 0.8   # never all of the device by default


def _probe():
    global _cupy, _probe_done, _probe_error
    if _probe_done:
        return _cupy
    _probe_done = True
    try:
        # deferred: cupy is optional (its ImportError is handled)
        import cupy  # noqa: the only cupy import in the package
    except Exception as e:  # ImportError, or a broken CUDA install
        _probe_error = f"cupy is not importable ({type(e).__name__}: {e}); install the 'gpu' extra"
        return None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        _probe_error = f"cupy is installed but no CUDA device is usable ({type(e).__name__}: {e})"
        return None
    if n < 1:
        _probe_error = "cupy is installed but reports 0 CUDA devices"
        return None
    _cupy = cupy
    return cupy


def gpu_available() -> bool:
    return _probe() is not None


def unavailable_reason() -> Optional[str]:
    _probe()
    return _probe_error


def require_gpu(node_name: str, device: str):
    """Return cupy, or raise naming the node that was pinned to a GPU."""
    cp = _probe()
    if cp is None:
        raise RuntimeError(f"node {node_name!r} is placed on {device!r} but no GPU is available: "
                           f"{_probe_error}")
    return cp


def device_count() -> int:
    """CUDA devices this process sees (0 without cupy or a GPU)."""
    cp = _probe()
    return int(cp.cuda.runtime.getDeviceCount()) if cp is not None else 0


def nccl_module():
    """`cupy.cuda.nccl`, or a RuntimeError naming why not (NCCL is a library of its own, which a
    cupy install may lack)."""
    cp = _probe()
    if cp is None:
        raise RuntimeError(f"NCCL needs a GPU: {_probe_error}")
    try:
        from cupy.cuda import nccl  # deferred: optional, as cupy itself
    except Exception as e:
        raise RuntimeError(f"cupy.cuda.nccl is not importable ({type(e).__name__}: {e}); install NCCL "
                           "(e.g. the nvidia-nccl wheel matching the CUDA of cupy)") from None
    if not getattr(nccl, "available", True):
        raise RuntimeError("cupy was built without NCCL (cupy.cuda.nccl.available is False)")
    return nccl


def nccl_unavailable_reason() -> Optional[str]:
    try:
        nccl_module()
    except RuntimeError as e:
        return str(e)
    return None


def new_stream(index: int):
    """A stream of its own on GPU `index` (made with that GPU current)."""
    cp = array_module("GPU")
    with cp.cuda.Device(index):
        return cp.cuda.Stream(non_blocking=True)


def enter_device(index: int, stream=None) -> None:
    """Make GPU `index` (and `stream`, one of its streams) current in the calling thread."""
    cp = array_module("GPU")
    cp.cuda.Device(index).use()
    if stream is not None:
        stream.use()


def array_module(kind: str):
    """numpy for CPU, cupy for GPU (error when absent)."""
    if kind == "CPU":
        return np
    if kind == "GPU":
        return require_gpu("<array_module>", "GPU")
    raise ValueError(f"unknown device kind {kind!r}; expected 'CPU' or 'GPU'")


def parse_pool_limit(limit: Union[None, int, float, str], total_bytes: int) -> int:
    """A cap in bytes from a fraction in (0, 1], a byte count, or a string
    like '0.5', '8GiB', '512MiB'. None -> DEFAULT_POOL_FRACTION of the device."""
    if total_bytes <= 0:
        raise ValueError(f"device total memory must be positive, got {total_bytes}")
    if limit is None:
        return int(total_bytes * DEFAULT_POOL_FRACTION)
    if isinstance(limit, str):
        s = limit.strip()
        units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "B": 1}
        for u, mul in units.items():
            if s.endswith(u):
                try:
                    v = float(s[:-len(u)])
                except ValueError:
                    raise ValueError(f"gpu memory limit {limit!r}: malformed number") from None
                return _check_bytes(int(v * mul), total_bytes, limit)
        try:
            limit = float(s)
        except ValueError:
            raise ValueError(f"gpu memory limit {limit!r}: expected a fraction, bytes, or N[KiB|MiB|GiB]") from None
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        raise ValueError(f"gpu memory limit must be a fraction or bytes, got {limit!r}")
    if isinstance(limit, float) and limit <= 1.0:
        if not 0.0 < limit:
            raise ValueError(f"gpu memory fraction must be in (0, 1], got {limit}")
        return int(total_bytes * limit)
    return _check_bytes(int(limit), total_bytes, limit)


def _check_bytes(n: int, total: int, orig) -> int:
    if n <= 0:
        raise ValueError(f"gpu memory limit {orig!r} must be positive")
    if n > total:
        raise ValueError(f"gpu memory limit {orig!r} ({n} bytes) exceeds the device's {total} bytes")
    return n


def configure_memory_pool(limit=None) -> int:
    """Cap cupy's default memory pool for this process; returns the cap in bytes."""
    cp = array_module("GPU")
    _free, total = cp.cuda.runtime.memGetInfo()
    cap = parse_pool_limit(limit, int(total))
    pool = cp.get_default_memory_pool()
    pool.set_limit(size=cap)
    if pool.total_bytes() > cap:
        # blocks an earlier session left cached in the pool would be reused past the new cap
        pool.free_all_blocks()
    return cap


class PeakMeter:
    """Peak device bytes over a run. `sample(used)` is fed the pool's used
    bytes (cupy: get_default_memory_pool().used_bytes()); tests feed it
    a pseudo-device's counter."""
    def __init__(self):
        self.start = None
        self.peak = 0

    def sample(self, used: int) -> None:
        if self.start is None:
            self.start = used
        if used > self.peak:
            self.peak = used


STAGE_MIN_BYTES = 1 << 20     # copies at least this large go through pinned memory
_CHUNK_BYTES = 4 << 20        # pageable host data is staged in chunks of this size
# Threads that fill the pinned chunks: one thread's copy into pinned memory ran at 10 GB/s on the
# H100 machine (16 cores), so staging by one thread capped pageable uploads at 6.3 GB/s; eight
# threads, 4 MiB chunks, waves of eight DMAs in flight: 26 GB/s (host copy alone 27 GB/s).
STAGE_THREADS = min(8, max(1, (os.cpu_count() or 2) // 2))
_stage_pool = None
_stage_pool_lock = threading.Lock()


def _staging_pool():
    global _stage_pool
    with _stage_pool_lock:
        if _stage_pool is None:
            from concurrent.futures import ThreadPoolExecutor  # deferred: only for staged uploads
            _stage_pool = ThreadPoolExecutor(STAGE_THREADS, thread_name_prefix="isthmus-stage")
        return _stage_pool


def staged_copy(src: np.ndarray, slots, alloc, dma, pool=None, start: int = 0) -> int:
    """Copy the bytes `src` (1-D uint8) out through pinned chunks, in waves: each wave's chunks
    are filled (by `pool`'s threads when given) and then handed to `dma(buffer, offset, nbytes)`,
    which starts the transfer and returns an event; a chunk is refilled only after its event.
    `slots`: a ring of [buffer or None, event or None] pairs, two waves' worth (buffers made by
    `alloc()` on first use, so a small copy pins one chunk), used from `start` on; returns where
    the next copy starts. Consecutive copies take consecutive slots, so a step's small feeds wait
    only for transfers a ring's length back, never for the step before's (which queue behind its
    kernels)."""
    width = max(1, len(slots) // 2)
    chunk = _CHUNK_BYTES
    offs = range(0, src.size, chunk)
    for w0 in range(0, len(offs), width):
        wave = [(slots[(start + w0 + j) % len(slots)], offs[w0 + j]) for j in range(min(width, len(offs) - w0))]
        for slot, _ in wave:
            if slot[0] is None:
                slot[0] = alloc()
            if slot[1] is not None:
                slot[1].synchronize()  # the DMA out of this buffer is done
                slot[1] = None

        def fill(item):
            slot, off = item
            m = min(chunk, src.size - off)
            np.copyto(slot[0][:m], src[off:off + m])
        if pool is None or len(wave) == 1:
            for item in wave:
                fill(item)
        else:
            list(pool.map(fill, wave))
        for slot, off in wave:
            slot[1] = dma(slot[0], off, min(chunk, src.size - off))
    return (start + len(offs)) % len(slots)


def pinned_empty(shape, dtype) -> np.ndarray:
    """A host array in page-locked memory (from cupy's pinned pool): feeds allocated this way
    reach the GPU at full DMA speed, with no staging copy."""
    cp = array_module("GPU")
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    mem = cp.cuda.alloc_pinned_memory(max(count * dtype.itemsize, 1))
    return np.frombuffer(mem, dtype, count).reshape(shape)


class CudaDevice:
    """A CUDA GPU seen through cupy: kernels get `cupy` as their array module."""
    kind = "GPU"
    simulated = False

    def __init__(self, index: int = 0, memory=None):
        cp = require_gpu("<session>", f"/device:GPU:{index}")
        if index >= cp.cuda.runtime.getDeviceCount():
            raise RuntimeError(f"/device:GPU:{index}: this machine has {cp.cuda.runtime.getDeviceCount()} GPU(s)")
        # the calling thread's current GPU (CUDA's is per thread): a process uses one GPU, except
        # data-parallel replicas (core/data_parallel.py), each of which runs in a thread of its own
        cp.cuda.Device(index).use()
        self.cp = self.xp = cp
        self.index = index
        self.name = f"/device:GPU:{index}"
        self.pool = cp.get_default_memory_pool()
        self.cap_bytes = configure_memory_pool(memory if memory is not None else os.environ.get("ISTHMUS_GPU_MEMORY"))
        self.peak = 0
        self._lock = threading.Lock()
        self._staging = [[None, None] for _ in range(max(4, 2 * STAGE_THREADS))]  # pinned chunks, made on first use
        self._stage_next = 0  # the ring slot the next staged copy starts at

    # ---- copies ---------------------------------------------------------------------------------
    def to_device(self, x):
        cp = self.cp
        x = np.asarray(x)
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)  # (never on 0-d arrays: it would make them 1-d)
        if x.nbytes < STAGE_MIN_BYTES:
            return cp.asarray(x)
        out = cp.empty(x.shape, x.dtype)
        if _is_pinned(cp, x):
            out.data.copy_from_host(x.ctypes.data, x.nbytes)
        else:
            self._staged_to_device(x, out)
        return out

    def _staged_to_device(self, x: np.ndarray, out) -> None:
        """Pageable host data: copied chunk by chunk into pinned buffers (by several threads),
        each chunk DMA'd while the next ones are being copied."""
        cp = self.cp
        src = x.reshape(-1).view(np.uint8)
        with self._lock:
            stream = cp.cuda.get_current_stream()
            dst = out.data.ptr

            def dma(buf, off, m):
                cp.cuda.runtime.memcpyAsync(dst + off, buf.ctypes.data, m, 1, stream.ptr)  # 1: host to device
                return stream.record()
            self._stage_next = staged_copy(
                src, self._staging, lambda: pinned_empty((_CHUNK_BYTES,), np.uint8), dma,
                _staging_pool() if STAGE_THREADS > 1 and src.size > _CHUNK_BYTES else None, self._stage_next)

    def to_host(self, x) -> np.ndarray:
        if x.nbytes < STAGE_MIN_BYTES:
            return x.get()
        x = self.cp.ascontiguousarray(x)
        out = pinned_empty(x.shape, x.dtype)
        x.get(out=out)
        return out

    def is_device_array(self, x) -> bool:
        return isinstance(x, self.cp.ndarray)

    # ---- memory ---------------------------------------------------------------------------------
    def is_out_of_memory(self, e: BaseException) -> bool:
        return isinstance(e, (self.cp.cuda.memory.OutOfMemoryError, MemoryError))

    def used_bytes(self) -> int:
        return int(self.pool.used_bytes())

    def sample(self) -> None:
        u = self.pool.used_bytes()
        if u > self.peak:
            self.peak = u

    def reset_peak(self) -> None:
        self.peak = int(self.pool.used_bytes())

    def release_cached(self) -> None:
        """Free the blocks cupy's pool keeps for reuse (a captured plan allocates from a pool of
        its own: what the eager runs left cached would sit beside it)."""
        self.pool.free_all_blocks()

    def peak_bytes(self) -> int:
        return int(self.peak)

    def synchronize(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()


def _is_pinned(cp, x: np.ndarray) -> bool:
    try:
        return cp.cuda.runtime.pointerGetAttributes(x.ctypes.data).type == 1  # cudaMemoryTypeHost
    except Exception:
        return False
