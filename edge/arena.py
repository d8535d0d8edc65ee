"""One memory arena for all activations: greedy by size over tensor lifetimes (TFLite's planner)."""
from __future__ import annotations

from typing import List, Tuple

ALIGN = 64


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class ArenaPlanner:
    """add(size, first, last) for each buffer (alive from op `first` through op `last`), then plan()."""

    def __init__(self):
        self.buffers: List[Tuple[int, int, int]] = []

    def add(self, size: int, first: int, last: int) -> int:
        self.buffers.append((_up(max(int(size), 1)), first, last))
        return len(self.buffers) - 1

    def plan(self) -> Tuple[List[int], int]:
        """Offsets per buffer and the arena's size. Largest first; each at the lowest offset that
        does not overlap a placed buffer whose lifetime intersects its own."""
        order = sorted(range(len(self.buffers)), key=lambda i: -self.buffers[i][0])
        offsets = [0] * len(self.buffers)
        placed: List[int] = []
        peak = 0
        for i in order:
            size, first, last = self.buffers[i]
            live = sorted((offsets[j], offsets[j] + self.buffers[j][0]) for j in placed
                          if not (self.buffers[j][2] < first or last < self.buffers[j][1]))
            at = 0
            for lo, hi in live:
                if at + size <= lo:
                    break
                at = max(at, hi)
            offsets[i] = at
            placed.append(i)
            peak = max(peak, at + size)
        return offsets, peak

    def lower_bound(self) -> int:
        """Max over time of the bytes alive together: no arena can be smaller."""
        if not self.buffers:
            return 0
        end = max(last for _, _, last in self.buffers)
        start = min(first for _, first, _ in self.buffers)
        return max(sum(s for s, f, l in self.buffers if f <= t <= l) for t in range(start, end + 1))
