"""Server-side bounds on waiting calls: how long one may wait, and how many may wait at once.

A RecvTensor call holds one of the server's threads while it waits for its tensor. Without
bounds a caller could ask for an endless wait, or fill every thread with waits for tensors
that never come, and stall everyone else's steps. `WaitLimits` caps the wait the caller
asks for, and admits at most `per_peer` waiting calls per caller and `total` in all (fewer
than the server's threads, so other calls always find one); a call past either bound ends at
once with RESOURCE_EXHAUSTED, naming the bound.

The caller is `caller_identity(context)`: the peer's host, never its port. gRPC's
`context.peer()` names one connection ("ipv4:127.0.0.1:PORT"), so a per-connection bound
would let one client with many channels hold every waiting slot; the host it cannot vary
by opening channels. A call a client token authenticated (wire/security.py) counts apart
from cluster-token calls from the same host. The identity never comes from unverified
metadata: a server without tokens ignores the authorization header, so a caller could
otherwise rename itself on every call.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional
from urllib.parse import unquote

from ..wire.security import CLIENT, caller_role
from .errors import TooManyWaiting

DEFAULT_MAX_WAIT_S = 60.0       # longest wait a caller may ask of a RecvTensor (the server's cap)
MAX_STEP_TIMEOUT_S = 600.0      # longest step timeout a caller may ask of RunStep/RunGraph
DEFAULT_PER_PEER = 32           # waiting calls one caller (host) may hold
DEFAULT_RESERVED_THREADS = 16   # server threads a flood of waits can never take


def peer_host(peer: str) -> str:
    """The host part of a gRPC peer string: "ipv4:1.2.3.4:5" -> "1.2.3.4", "ipv6:[::1]:5" (or
    its %5B..%5D form) -> "::1"; a unix socket or an unknown form is kept whole."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6") or not rest:
        return peer
    rest = unquote(rest)
    host = rest.rpartition(":")[0] if rest.rpartition(":")[2].isdigit() else rest
    return host.strip("[]") or peer


def caller_identity(context: Any) -> str:
    """Whom a call's waiting slots count against: the peer's host, tagged when a client token
    (verified by the server's interceptor) made the call."""
    host = peer_host(context.peer() or "")
    return f"client token@{host}" if caller_role() == CLIENT else host


class WaitLimits:
    def __init__(self, max_wait_s: float = DEFAULT_MAX_WAIT_S, per_peer: int = DEFAULT_PER_PEER,
                 total: Optional[int] = None, threads: int = 64):
        self.max_wait_s = float(max_wait_s)
        self.per_peer = int(per_peer)
        self.total = int(total) if total is not None else max(1, threads - min(DEFAULT_RESERVED_THREADS, threads // 4))
        self._by_peer: Dict[str, int] = {}
        self._waiting = 0
        self._lock = threading.Lock()
        self.refused = 0   # calls ended RESOURCE_EXHAUSTED so far

    def cap(self, asked: Optional[float], default: Optional[float] = None) -> float:
        """The wait to allow for a call that asked for `asked` seconds (None or <= 0: `default`,
        else the cap), never more than the cap."""
        if not asked or asked <= 0:
            asked = default or self.max_wait_s
        return min(float(asked), self.max_wait_s)

    @contextmanager
    def waiting(self, peer: str, what: str) -> Iterator[None]:
        with self._lock:
            n = self._by_peer.get(peer, 0)
            if n >= self.per_peer or self._waiting >= self.total:
                self.refused += 1
                bound = (f"{self.per_peer} waiting calls from {peer}" if n >= self.per_peer
                         else f"{self.total} waiting calls in all")
                raise TooManyWaiting(f"{what}: refused, this task already holds {bound}; retry later")
            self._by_peer[peer] = n + 1
            self._waiting += 1
        try:
            yield
        finally:
            with self._lock:
                self._waiting -= 1
                left = self._by_peer[peer] - 1
                if left:
                    self._by_peer[peer] = left
                else:
                    del self._by_peer[peer]

    def status(self) -> Dict[str, int]:
        with self._lock:
            return {"waiting": self._waiting, "peers": len(self._by_peer), "refused": self.refused}
