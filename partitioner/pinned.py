"""Given placements as the cuts of one split file: a planner for export_split in which each plan is
the best in a bandwidth slot of its own, so every placement becomes one cut that a client can pin.

    pinned = PinnedPlans([plan_a, plan_b])          # SplitPlans (placement, link, cost)
    split = export_split(graph, [y], pinned)        # cut j runs plan j
    OffloadClient(path, addr, adapt=False, initial_bandwidth_bps=pinned.bandwidth(1))   # runs plan_b

Measurement needs this, not planning: the accuracy benchmark (benchmarks/split_accuracy.py) times
every mode of a model (min cut, edge-only, cloud-only, layer split) through one file and one
service, and `isthmus profile --parts` times edge parts of several sizes. The slots' bandwidths
are labels, not links: each cut's range in the file is its slot, whatever the link.
"""
from __future__ import annotations

from typing import List, Sequence

SLOT0 = 1e3  # plan j holds uplinks [SLOT0 * 10**j, SLOT0 * 10**(j+1)) bit/s


class _Pinned:
    """A SplitPlan whose prediction is 0 in its own slot and 1 elsewhere (export_split ranks by it)."""

    def __init__(self, plan, j: int):
        self.plan, self.j = plan, j

    def __getattr__(self, name):
        return getattr(self.plan, name)

    def predict(self, link) -> float:
        return 0.0 if SLOT0 * 10 ** self.j <= link.up_bandwidth_bps < SLOT0 * 10 ** (self.j + 1) else 1.0


class PinnedPlans:
    """What export_split reads of an AdaptivePlanner (plans, bandwidths, distinct()), one slot per plan."""

    def __init__(self, plans: Sequence):
        if not plans:
            raise ValueError("PinnedPlans needs at least one plan")
        self.plans: List[_Pinned] = [_Pinned(p, j) for j, p in enumerate(plans)]
        self.bandwidths: List[float] = [self.bandwidth(j) for j in range(len(plans))]

    @staticmethod
    def bandwidth(j: int) -> float:
        """An uplink (bit/s) inside plan j's slot: a client starting there runs cut j."""
        return SLOT0 * 10 ** (j + 0.5)

    def distinct(self) -> List[_Pinned]:
        return list(self.plans)


__all__ = ["PinnedPlans"]
