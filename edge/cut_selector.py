"""Which cut of a split model the next request runs, from the link as the client measures it.

The round trip is the least of the recent pings and of the recent calls' times on the wire (delays
on a loaded machine only ever add to a round trip, and a call's time holds one whole round trip:
one slow ping must not hide every transfer until the next). Each remote call gives a bandwidth sample, bits / (its time on the wire less the round
trip): delays only add, so each sample is a lower bound, and the estimate is the largest of the last
`window` samples. When the estimate leaves the current cut's range by more than `hysteresis`, the
selector moves to the cut whose range holds it. A drop is believed from the one call that shows it:
a transfer that took more than twice what the estimate predicts, and longer by more than
`drop_min_s` and twice the worst excess of the recent calls (the jitter seen on this link and
machine), cannot be jitter on a fast link, so the window forgets the older (faster) samples and
the next request runs on the new cut (with the window alone a drop took `window` requests to
show). It takes 3 calls to know the jitter first, and a drop schedules a probe of the cut above 3
requests later: a stall taken for a drop (a busy machine) is undone then, not after `probe_every`
requests. Small transfers cannot show that a link got faster, so every `probe_every` requests one
runs on the next cut up (a probe). No I/O and no clock here: the client feeds it measurements, so it is tested without gRPC (tests/edge/test_cut_selector.py).
"""
from __future__ import annotations

import collections
import math
from typing import Dict, Optional, Sequence

from .split_model import Cut, cut_for


class CutSelector:
    """The current cut and the link estimate behind it. `counts` (a dict, shared with the client's
    stats) gets "switches" and "probes"."""

    def __init__(self, cuts: Sequence[Cut], window: int = 3, hysteresis: float = 0.15, probe_every: int = 16,
                 adapt: bool = True, initial_bandwidth_bps: Optional[float] = None, resolution_s: float = 0.5e-3,
                 counts: Optional[Dict[str, int]] = None, drop_min_s: float = 0.010):
        if not cuts:
            raise ValueError("a cut selector needs at least one cut")
        self.cuts = list(cuts)
        self.hysteresis, self.adapt = float(hysteresis), bool(adapt)
        self.probe_every, self.resolution_s = int(probe_every), float(resolution_s)
        self.counts = counts if counts is not None else {}
        self.counts.setdefault("switches", 0)
        self.counts.setdefault("probes", 0)
        self.counts.setdefault("drops", 0)
        self.drop_min_s = float(drop_min_s)
        self._excess: collections.deque = collections.deque(maxlen=8)  # recent calls' time over the estimate's
        self.bandwidth_bps: Optional[float] = initial_bandwidth_bps
        self.rtt_s: Optional[float] = None
        self._rtts: collections.deque = collections.deque(maxlen=8)
        self._call_rtts: collections.deque = collections.deque(maxlen=8)  # calls' times: round trip + bytes
        self._samples: collections.deque = collections.deque(maxlen=max(1, int(window)))
        self.cut = cut_for(self.cuts, initial_bandwidth_bps) if initial_bandwidth_bps else len(self.cuts) - 1
        self._since_probe = 0

    def choose(self, cloud_down: bool = False) -> int:
        """The cut the next request runs: the current one, or every `probe_every` requests the next
        cut up that has a cloud part (a probe; from an edge-only cut this is the only traffic)."""
        self._since_probe += 1
        up = next((j for j in range(self.cut + 1, len(self.cuts)) if self.cuts[j].cloud_part), None)
        if self.adapt and up is not None and not cloud_down and self._since_probe >= self.probe_every:
            self._since_probe = 0
            self.counts["probes"] += 1
            return up
        return self.cut

    def add_rtt(self, seconds: float) -> float:
        """A ping's round trip; returns the estimate (the least of the last 8)."""
        self._rtts.append(float(seconds))
        self.rtt_s = min(min(self._rtts), min(self._call_rtts, default=math.inf))
        return self.rtt_s

    def measure(self, net_s: float, nbytes: int) -> float:
        """A call's time on the wire (its total less the server's time) is rtt + bits / bandwidth +
        delays. A transfer shorter than `resolution_s` cannot be told from jitter: it shows only
        that the bandwidth is at least bits / resolution_s. Returns the new estimate (bit/s) and
        moves the cut when it left the current cut's range."""
        self._call_rtts.append(float(net_s))
        if self.rtt_s is not None and net_s < self.rtt_s:
            self.rtt_s = float(net_s)  # this call took less than the round trip believed: it bounds it
        transfer = max(net_s - (self.rtt_s or 0.0), self.resolution_s)
        if self.bandwidth_bps and self._is_drop(transfer, nbytes):
            self._samples.clear()  # the link got slower: the faster samples before describe another link
            self._excess.clear()
            self.counts["drops"] += 1
            self._since_probe = max(self._since_probe, self.probe_every - 3)  # confirm it soon from above
        elif self.bandwidth_bps:
            self._excess.append(max(transfer - nbytes * 8.0 / self.bandwidth_bps, 0.0))
        self._samples.append(nbytes * 8.0 / transfer)
        self.bandwidth_bps = max(self._samples)
        if self.adapt:
            c = self.cuts[self.cut]
            if (self.bandwidth_bps < c.min_bandwidth_bps / (1 + self.hysteresis)
                    or self.bandwidth_bps >= c.max_bandwidth_bps * (1 + self.hysteresis)):
                self.switch(cut_for(self.cuts, self.bandwidth_bps))
        return self.bandwidth_bps

    def _is_drop(self, transfer_s: float, nbytes: int) -> bool:
        """The transfer took over twice what the estimate predicts, and more than `drop_min_s` and
        twice the recent calls' worst excess beyond it: delays on a busy machine add milliseconds,
        not a transfer's whole time again."""
        expected = max(nbytes * 8.0 / self.bandwidth_bps, self.resolution_s)
        if len(self._excess) < 3:  # the jitter is not known yet: the window alone decides
            return False
        margin = max(self.drop_min_s, 2.0 * max(self._excess))
        return transfer_s > 2.0 * expected and transfer_s - expected >= margin

    def switch(self, k: int) -> None:
        if k != self.cut:
            self.cut = k
            self.counts["switches"] += 1


__all__ = ["CutSelector", "cut_for"]
