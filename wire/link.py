"""The link between the edge and the cloud: the one transfer formula, the LinkModel the partitioner
prices cuts with, and the parsers of its units.

Units, one name each: a bandwidth is `*_bandwidth_bps` (bit/s), a time `*_s` (seconds), a size in
bytes `nbytes`. A transfer takes nbytes * 8 / bandwidth + half the call's latency (the round trip
plus the call's fixed cost), so a call's request and answer together pay the whole latency once.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Optional


def transfer_seconds(nbytes: float, bandwidth_bps: float, latency_s: float) -> float:
    """Seconds for one direction of a call: bits / bandwidth + half the call's latency."""
    return nbytes * 8.0 / bandwidth_bps + latency_s / 2


@dataclass(frozen=True)
class LinkModel:
    """The edge's link to the cloud. Bandwidths in bit/s; rtt in seconds.

    `call_s` is the fixed cost of one remote call beyond the network's round trip: the RPC stack
    and the offload service's queue (measured with a small request, see bench/demo); like the RTT
    it is paid half on the way up and half on the way back."""
    up_bandwidth_bps: float = 20e6
    down_bandwidth_bps: float = 20e6
    rtt_s: float = 0.040
    call_s: float = 0.0

    def __post_init__(self):
        if not (self.up_bandwidth_bps > 0 and self.down_bandwidth_bps > 0 and self.rtt_s >= 0 and self.call_s >= 0):
            raise ValueError(f"link needs positive bandwidths and rtt, call_s >= 0, got {self!r}")

    @property
    def latency_s(self) -> float:
        """What one call costs beyond the bytes: the round trip and the call's fixed cost."""
        return self.rtt_s + self.call_s

    def upload_time(self, nbytes: float) -> float:
        return transfer_seconds(nbytes, self.up_bandwidth_bps, self.latency_s)

    def download_time(self, nbytes: float) -> float:
        return transfer_seconds(nbytes, self.down_bandwidth_bps, self.latency_s)

    def with_uplink(self, up_bandwidth_bps: float) -> "LinkModel":
        """This link at another uplink, the downlink keeping its ratio to it."""
        return replace(self, up_bandwidth_bps=up_bandwidth_bps,
                       down_bandwidth_bps=self.down_bandwidth_bps * up_bandwidth_bps / self.up_bandwidth_bps)

    def with_call_cost(self, call_s: float) -> "LinkModel":
        return replace(self, call_s=float(call_s))

    @classmethod
    def parse(cls, bandwidth: str, rtt: str = "40ms", downlink: Optional[str] = None) -> "LinkModel":
        """LinkModel.parse('5mbps', '40ms'); the downlink defaults to the uplink."""
        up = parse_bandwidth(bandwidth)
        return cls(up, parse_bandwidth(downlink) if downlink else up, parse_duration(rtt))

    def __str__(self) -> str:
        call = f", call {self.call_s * 1e3:g} ms" if self.call_s else ""
        return (f"up {self.up_bandwidth_bps / 1e6:g} Mbit/s, down {self.down_bandwidth_bps / 1e6:g} Mbit/s, "
                f"rtt {self.rtt_s * 1e3:g} ms{call}")


_BW_UNITS = {"bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "kbit/s": 1e3, "mbit/s": 1e6, "gbit/s": 1e9}
_T_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def parse_bandwidth(text: str) -> float:
    """'5mbps', '0.1 Mbit/s', '1gbps' -> bit/s."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?\d+)?)\s*([a-z/]+)\s*", str(text).lower())
    if not m or m.group(2) not in _BW_UNITS:
        raise ValueError(f"bandwidth {text!r}: expected a number and one of {sorted(_BW_UNITS)}")
    return float(m.group(1)) * _BW_UNITS[m.group(2)]


def parse_duration(text: str) -> float:
    """'40ms', '0.5 s', '200us' -> seconds."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?\d+)?)\s*(s|ms|us)\s*", str(text).lower())
    if not m:
        raise ValueError(f"duration {text!r}: expected a number and s, ms or us")
    return float(m.group(1)) * _T_UNITS[m.group(2)]


__all__ = ["LinkModel", "transfer_seconds", "parse_bandwidth", "parse_duration"]
