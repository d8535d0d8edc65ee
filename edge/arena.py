"""One memory arena for all activations and scratch: offsets planned over buffer lifetimes.

The planner sits behind TFLite Micro's small interface: add(size, first, last) per buffer (alive
from op `first` through op `last`), then plan() -> offsets and the arena size. Placing buffers is
a greedy pass over some order, each buffer going into a gap between the placed buffers whose
lifetimes meet its own. No single order wins everywhere (greedy by size, TFLite's default, loses
to a residual connection), so plan() tries a few (by size, by size x lifetime, by breadth: the
buffers of the busiest op first, in program order) with first fit and best fit, then seeded random
perturbations of the size order, and keeps the smallest arena; it stops at the lower bound.
"""
from __future__ import annotations

import random
from typing import Iterator, List, Tuple

import numpy as np

ALIGN = 64
WORK_BUDGET = 300_000  # pairs of buffers compared, summed over the plans tried


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def aligned_empty(nbytes: int) -> np.ndarray:
    """uint8 [nbytes] starting on an ALIGN-byte boundary. numpy's allocator guarantees 16 bytes: an
    arena at 48 mod 64 split the int8 GEMM's 32-byte loads across cache lines (W2 CNN conv2: 139 us
    with 64-aligned operands, 155-167 us at 16 or 32 past a boundary, one process, interleaved)."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes]


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of a on an ALIGN-byte boundary (packed weights the compiled kernels stream)."""
    out = aligned_empty(a.nbytes).view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


class ArenaPlanner:
    def __init__(self):
        self.buffers: List[Tuple[int, int, int]] = []  # (aligned size, first, last)

    def add(self, size: int, first: int, last: int) -> int:
        self.buffers.append((_up(max(int(size), 1)), first, last))
        return len(self.buffers) - 1

    def plan(self) -> Tuple[List[int], int]:
        """Offsets per buffer and the arena's size."""
        if not self.buffers:   # a model with nothing to compute (its outputs are its inputs or constants)
            return [], 0
        bound = self.lower_bound()
        best: Tuple[List[int], int] = ([], -1)
        for order, best_fit in self._orders():
            offsets, peak = self._place(order, best_fit)
            if best[1] < 0 or peak < best[1]:
                best = (offsets, peak)
            if peak <= bound:
                break
        return best

    def lower_bound(self) -> int:
        """Max over time of the bytes alive together: no arena can be smaller."""
        if not self.buffers:
            return 0
        return max(self._live_at(t) for t in self._times())

    # ---- internals -----------------------------------------------------------------------------
    def _times(self) -> range:
        return range(min(f for _, f, _ in self.buffers), max(l for _, _, l in self.buffers) + 1)

    def _live_at(self, t: int) -> int:
        return sum(s for s, f, l in self.buffers if f <= t <= l)

    def _orders(self) -> Iterator[Tuple[List[int], bool]]:
        b, idx = self.buffers, list(range(len(self.buffers)))
        by_size = sorted(idx, key=lambda i: (-b[i][0], b[i][1]))
        by_area = sorted(idx, key=lambda i: (-b[i][0] * (b[i][2] - b[i][1] + 1), b[i][1]))
        breadth, seen = [], set()
        for t in sorted(self._times(), key=lambda t: -self._live_at(t)):
            for i in sorted((i for i in idx if b[i][1] <= t <= b[i][2] and i not in seen), key=lambda i: -b[i][0]):
                seen.add(i)
                breadth.append(i)
        for order in (by_size, breadth, by_area):
            yield order, False
            yield order, True
        rng = random.Random(0)
        for _ in range(max(0, WORK_BUDGET // max(len(idx) ** 2, 1) - 6)):
            yield sorted(idx, key=lambda i: -b[i][0] * rng.uniform(0.5, 1.5)), rng.random() < 0.5

    def _place(self, order: List[int], best_fit: bool) -> Tuple[List[int], int]:
        b = self.buffers
        offsets = [0] * len(b)
        placed: List[int] = []
        peak = 0
        for i in order:
            size, first, last = b[i]
            live = sorted((offsets[j], offsets[j] + b[j][0]) for j in placed if not (b[j][2] < first or last < b[j][1]))
            at, chosen, gap_best = 0, None, None
            for lo, hi in live:
                gap = lo - at
                if gap >= size:
                    if not best_fit:
                        chosen = at
                        break
                    if gap_best is None or gap < gap_best:
                        chosen, gap_best = at, gap
                at = max(at, hi)
            offsets[i] = at if chosen is None else chosen
            placed.append(i)
            peak = max(peak, offsets[i] + size)
        return offsets, peak
