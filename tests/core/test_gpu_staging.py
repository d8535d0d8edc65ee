"""Pageable uploads staged through pinned chunks (core/gpu.staged_copy), with a DMA that reads its
buffer only when its event is waited on: a chunk refilled before its transfer finished would put
the wrong bytes on the device, so the content check below fails if the wave order is wrong."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from isthmus.core import gpu


class _LazyDMA:
    """Transfers that happen late: a buffer is read when its event is synchronized."""
    def __init__(self, dst):
        self.dst, self.pending, self.allocs = dst, [], 0

    def alloc(self):
        self.allocs += 1
        return np.zeros(gpu._CHUNK_BYTES, np.uint8)

    def __call__(self, buf, off, m):
        dma = self

        class Event:
            done = False

            def synchronize(self):
                if not self.done:
                    dma.dst[off:off + m] = buf[:m]
                    self.done = True
        ev = Event()
        self.pending.append(ev)
        return ev

    def finish(self):
        for ev in self.pending:
            ev.synchronize()


@pytest.mark.parametrize("width", [1, 3, 8])
@pytest.mark.parametrize("nbytes", [100, 5 * (4 << 20) + 17, 23 * (4 << 20)])
def test_staged_copy_delivers_every_byte_in_order(width, nbytes, monkeypatch):
    monkeypatch.setattr(gpu, "_CHUNK_BYTES", 1 << 12)  # many waves from a small source
    src = np.random.default_rng(0).integers(0, 256, nbytes // 1024 + 5, dtype=np.uint8)
    dst = np.zeros_like(src)
    dma = _LazyDMA(dst)
    slots = [[None, None] for _ in range(2 * width)]
    with ThreadPoolExecutor(width) as pool:
        gpu.staged_copy(src, slots, dma.alloc, dma, pool if width > 1 else None)
    dma.finish()
    np.testing.assert_array_equal(dst, src)
    chunks = -(-src.size // gpu._CHUNK_BYTES)
    assert dma.allocs == min(chunks, 2 * width)  # a small copy pins one chunk, never more than the slots
    assert len(dma.pending) == chunks


def test_stage_threads_leave_half_the_cores():
    import os
    assert 1 <= gpu.STAGE_THREADS <= max(1, (os.cpu_count() or 2) // 2)


def test_consecutive_copies_take_the_next_slots_of_the_ring(monkeypatch):
    """A step's small feeds each take a fresh slot: the second copy neither waits for the first's
    transfer nor overwrites its buffer before that transfer has read it."""
    monkeypatch.setattr(gpu, "_CHUNK_BYTES", 1 << 10)
    rng = np.random.default_rng(1)
    slots = [[None, None] for _ in range(4)]
    srcs = [rng.integers(0, 256, n, dtype=np.uint8) for n in (300, 1000, 2500, 700, 90)]
    dsts = [np.zeros_like(s) for s in srcs]
    waited = []
    start, dmas = 0, []
    for src, dst in zip(srcs, dsts):
        dma = _LazyDMA(dst)
        for slot in slots:  # note which events this copy had to wait for
            if slot[1] is not None and not getattr(slot[1], "watched", False):
                slot[1].watched = True
                orig = slot[1].synchronize

                def sync(orig=orig):
                    waited.append(1)
                    orig()
                slot[1].synchronize = sync
        before = start
        start = gpu.staged_copy(src, slots, dma.alloc, dma, None, start)
        assert start == (before + -(-src.size // gpu._CHUNK_BYTES)) % len(slots)
        dmas.append(dma)
    waits_while_copying = len(waited)
    for dma in dmas:
        dma.finish()
    for src, dst in zip(srcs, dsts):
        np.testing.assert_array_equal(dst, src)
    assert sum(d.allocs for d in dmas) == 4  # the ring's four buffers, made once
    # 1 + 1 + 3 + 1 + 1 chunks through 4 slots: the first four chunks found their slots free,
    # each of the other three waited for the transfer a ring's length back
    assert waits_while_copying == 7 - 4
