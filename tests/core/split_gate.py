"""The split gates pinned, for tests whose kernels must split across two threads whatever the machine
(core/ops/par_gate.split_rows, threads.par_threads)."""
import pytest

from isthmus.core import idle, threads


def pin_split_gate(monkeypatch, route: str = "prange", min_chunk_flops: int = 1000, intra=2) -> None:
    """Small work splits two ways: prange's hand-off pinned at 3 us (route "prange"), or prange off
    (route "pool": the intra-op pool's hand-off pinned at 1 us); an idle machine; nothing measured or
    read again; MIN_CHUNK_FLOPS `min_chunk_flops`; intra_threads() `intra` (None: the session's own).
    Skips without two cores, and for prange without a threading layer that takes concurrent calls."""
    from isthmus.jit import par
    if threads.cores() < 2 or (route == "prange" and not par.layer_ok()):
        pytest.skip("needs two cores and a threading layer that takes concurrent parallel calls")
    monkeypatch.setattr(threads, "MIN_CHUNK_FLOPS", min_chunk_flops)
    monkeypatch.setattr(threads, "_prange", [3e-6 if route == "prange" else False])
    monkeypatch.setattr(threads, "_prange_at", [0.0])  # pinned: never measured again
    monkeypatch.setattr(threads, "_handoff", [1e-6])
    monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
    if intra is not None:
        monkeypatch.setattr(threads, "intra_threads", lambda: intra)
