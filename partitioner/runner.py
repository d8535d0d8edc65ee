"""Running the parts of a partition together, in one process.

One Session per part, each step on its own thread, all sharing one rendezvous. The parts'
sessions run serial plans: a serial plan follows the part graph's order, which the
partitioner built along one topological order of the whole graph, so no part can wait on
a Recv whose Send sits behind another Recv (no deadlock). Every wait is bounded.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional

from ..core.graph import Tensor
from ..core.rendezvous import InProcessRendezvous, RendezvousAborted
from ..core.session import Session
from ..core.trace import RunMetadata, RunOptions


class SplitSession:
    """`SplitSession(partition).run(feed_dict)` -> the outputs, in the partition's order.

    Feeds are keyed by the original placeholders (names or Tensors of the unsplit graph).
    Steps run one at a time (Send/Recv pair the n-th send with the n-th receive of a key).
    """

    def __init__(self, partition, rendezvous=None, timeout: float = 60.0, optimize: bool = True):
        self.partition = partition
        self.rendezvous = rendezvous if rendezvous is not None else InProcessRendezvous(timeout)
        self.timeout = float(timeout)
        self.sessions: Dict[str, Session] = {
            d: Session(p.graph, parallel=False, rendezvous=self.rendezvous, optimize=optimize)
            for d, p in partition.parts.items()}
        self._feed_part = {name: d for d, p in partition.parts.items() for name in p.feeds}
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.sessions)), thread_name_prefix="isthmus-part")
        self._lock = threading.Lock()
        self._broken: Optional[BaseException] = None

    def run(self, feed_dict: Optional[Mapping] = None, options=None, run_metadata=None) -> list:
        """With options=RunOptions(trace=True) every part's events go to `run_metadata`, each part
        on its device's track, Sends and Recvs paired into transfers (RunMetadata.transfers)."""
        traced = options is not None and options.trace
        with self._lock:
            if self._broken is not None:
                raise RuntimeError(f"this SplitSession failed earlier ({self._broken}); make a new one")
            feeds = self._split_feeds(feed_dict or {})
            mds = {d: RunMetadata() for d in self.sessions} if traced else {}
            futures = {d: self._pool.submit(self._run_part, d, feeds[d], mds.get(d)) for d in self.sessions}
            results, errors = {}, []
            for d, fut in futures.items():
                try:
                    results[d] = fut.result(timeout=self.timeout * 2 + 5)
                except FutureTimeout:  # a kernel hung outside any rendezvous wait
                    e = TimeoutError(f"part {d} did not finish within {self.timeout * 2 + 5:g} s")
                    self.rendezvous.abort(e)
                    errors.append(e)
                except Exception as e:  # noqa: BLE001  (re-raised below)
                    errors.append(e)
            if errors:  # report the failure itself, not the other parts giving up because of it
                self._broken = next((e for e in errors if not _caused_by_abort(e)), errors[0])
                raise self._broken
            if traced:
                md = run_metadata if run_metadata is not None else RunMetadata()
                for d, part_md in mds.items():
                    md.merge(part_md, device=d)
            return self._gather(results)

    def _run_part(self, d: str, feeds: dict, md: Optional[RunMetadata] = None):
        part = self.partition.parts[d]
        try:
            if md is not None:
                return self.sessions[d].run(part.fetches, feeds, options=RunOptions(trace=True), run_metadata=md)
            return self.sessions[d].run(part.fetches, feeds)
        except BaseException as e:
            self.rendezvous.abort(e)  # wake the other parts now, not at their timeouts
            raise

    def _split_feeds(self, feed_dict: Mapping) -> Dict[str, dict]:
        out: Dict[str, dict] = {d: {} for d in self.sessions}
        for k, v in feed_dict.items():
            name = k.node.name if isinstance(k, Tensor) else str(k).split(":")[0]
            d = self._feed_part.get(name)
            src = self.partition.source
            if d is None and src is not None and name in src and src.node(name).op == "Placeholder":
                continue  # a placeholder of the graph that no output needs, as Session allows
            if d is None:
                raise KeyError(f"feed '{name}' is not a placeholder of any part (a split graph is fed "
                               f"through its placeholders only); placeholders: "
                               f"{sorted(self._feed_part)}")
            out[d][name] = v
        return out

    def _gather(self, results: Dict[str, list]) -> list:
        by_name = {}
        for d, vals in results.items():
            part = self.partition.parts[d]
            for (orig, _), v in zip(part.outputs.items(), vals):
                by_name[orig] = v
        return [by_name[name] for name in self.partition.outputs]

    # ---- variables live in the part that holds them -------------------------------------------
    def _holder(self, name: str) -> Session:
        for sess in self.sessions.values():
            if name in sess.graph and sess.graph.node(name).op == "Variable":
                return sess
        raise KeyError(f"no part holds a variable named '{name}'")

    def variable_value(self, name: str):
        sess = self._holder(name)
        return sess.variable_value(sess.graph.node(name))

    def set_variable_value(self, name: str, value) -> None:
        """Load a variable's value (from a checkpoint, or an unsplit session) into its part."""
        sess = self._holder(name)
        sess.set_variable_value(sess.graph.node(name), value)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for s in self.sessions.values():
            s.close()

    def __enter__(self) -> "SplitSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def emulated_link(link, edge: str) -> Callable[[Hashable, Any], float]:
    """A rendezvous delay that makes each transfer take as long as it would over `link`:
    bytes / bandwidth + half the round trip, uploads from `edge`, downloads to it (keys are
    the partitioner's "src;dst;tensor")."""
    def delay(key, value) -> float:
        name = key[0] if isinstance(key, tuple) else key
        src, dst, _ = str(name).split(";", 2)
        nbytes = getattr(value, "nbytes", 0)
        if src == edge:
            return link.upload_time(nbytes)
        if dst == edge:
            return link.download_time(nbytes)
        return 0.0
    return delay


def _caused_by_abort(e: Optional[BaseException]) -> bool:
    """True for an error raised only because another part aborted the rendezvous."""
    while e is not None:
        if isinstance(e, RendezvousAborted):
            return True
        e = e.__cause__
    return False


def run_parts(partition, feed_dict: Optional[Mapping] = None, timeout: float = 60.0) -> List:
    with SplitSession(partition, timeout=timeout) as s:
        return s.run(feed_dict)
