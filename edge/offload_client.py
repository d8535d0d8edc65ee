"""The offload client: run a split edge model, sending each cut's tensors to the offload service.

    client = OffloadClient("model.isth", "cloud:7000", security=ClientSecurity(...), deadline_ms=500)
    probs, = client.invoke(x)
    client.stats()   # cloud / fallback counts, link estimate, current cut, backoff

The file (converters/split_export.py; read by edge/split_model.py) holds one subgraph per candidate
cut, the whole model for local fallback, and the uplink range where each cut is best. Per request
the client runs the current cut's edge part; at its RemotePart the interpreter hands the boundary
tensors here, and they go to the service as one Infer call (wire/tensor_codec.py) with the
request's remaining deadline.

Every cut (and the full model) is prepared at start and run once on zeros, in the background by
default (edge/cut_warmer.py): a switch or a fallback then pays no kernel's first use, and a request
waits only for the warm-up of the cut it runs.

The link is measured as it goes: a Describe call every `ping_every` calls times the round trip,
each Infer gives a bandwidth sample, and edge/cut_selector.py turns them into the cut to run (with
hysteresis, and a probe on the next cut up every `ping_every` requests). When the cloud is
unreachable, refuses, or misses the deadline, the request runs locally on the full model (fallback)
and the cloud is retried after an exponential backoff, on a fresh channel. `stats()` counts all of
it; `last` says how the latest request went. `link=EmulatedLink(...)` (edge/link_emulation.py)
adds bytes / bandwidth + RTT / 2 to every transfer, for demos and benchmarks on loopback.

Tracing (`trace=True`; edge/offload_trace.py): each Infer asks the service for its spans, decoded
strictly and placed on the request's wall-clock timeline with the client's own; `last["trace"]`
holds them, `chrome_trace()` / `write_chrome_trace(path)` export them.

grpc is imported when a connection is first needed, never by `import isthmus.edge`.
"""
from __future__ import annotations

import threading
import time
import uuid
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..wire import tensor_codec
from ..wire.security import make_channel
from .cut_selector import CutSelector
from .cut_warmer import CutWarmer
from .format import EdgeModelError
from .interpreter import Interpreter
from .link_emulation import EmulatedLink
from .loader import RemoteInfo
from .offload_trace import LINK_TRACK, RequestTracing, TraceSpan
from .split_model import load_split

try:  # the request's first-touch count (pages its thread touched for the first time); Unix only
    import resource as _resource

    def _minor_faults() -> Optional[int]:
        return _resource.getrusage(_resource.RUSAGE_THREAD).ru_minflt
except (ImportError, AttributeError):  # no resource module, or no per-thread usage (macOS)
    def _minor_faults() -> Optional[int]:
        return None

MAX_MESSAGE_BYTES = 256 << 20


# ---- tensors on the wire (wire/tensor_codec.py) ------------------------------------------------------
def _encode(out, a: np.ndarray) -> None:
    """Fill a NamedTensor's TensorProto (`out`) with an array: dtype, shape, raw little-endian bytes."""
    try:
        tensor_codec.encode(a, out.tensor)
    except tensor_codec.TensorCodecError as e:
        raise EdgeModelError(f"tensor '{out.name}': {e}") from None


def _decode(nt, want_name: str, want_dtype: np.dtype, want_shape: tuple) -> np.ndarray:
    """A response tensor, checked against what the edge model expects before its bytes are read."""
    if nt.name != want_name:
        raise CloudError(f"the service answered tensor '{nt.name}' where '{want_name}' was expected")
    try:
        return tensor_codec.decode_as(nt.tensor, want_dtype, want_shape, f"tensor '{want_name}' from the service")
    except tensor_codec.TensorCodecError as e:
        raise CloudError(str(e)) from None


class CloudError(RuntimeError):
    """The cloud did not answer this request usefully (the client falls back when it can)."""


class _Miss(Exception):
    """The request's deadline passed on the (emulated) link."""


# ---- the client --------------------------------------------------------------------------------------
class OffloadClient(RequestTracing):
    """Runs a split model (see the module docstring). Thread-compatible, not thread-safe: one
    request at a time per client (a lock serialises invoke)."""

    def __init__(self, model_path: str, address: str, security=None, deadline_ms: float = 1000.0,
                 link: Optional[EmulatedLink] = None, window: int = 3, hysteresis: float = 0.15,
                 backoff_s: Tuple[float, float] = (0.05, 5.0), ping_every: int = 16, adapt: bool = True,
                 initial_bandwidth_bps: Optional[float] = None, edge_slowdown: float = 1.0, resolution_s: float = 0.5e-3,
                 edge_clock: str = "cpu", trace: bool = False, warm: str = "background",
                 drop_min_s: float = 0.010):
        """`edge_slowdown` > 1 emulates an edge device that many times slower than this machine
        (demos, benchmarks): after each request the client sleeps until the request's local compute
        has taken edge_slowdown x what it took here, so a request takes what it would on that device.
        `edge_clock` says what "took here" counts: "cpu", the CPU time of the invoking thread (other
        processes sharing the machine do not stretch it, so the emulated edge is as steady as the
        device it stands for; true when BLAS runs on one thread, as on a phone's interpreter), or
        "wall", the wall time (on a loaded machine, waits for a core are multiplied too).
        `trace` asks the service for its spans on every Infer and records the request's timeline
        (the module docstring, "Tracing").
        `warm` says when every cut and the full model run once on zeros (edge/cut_warmer.py), so that
        no request pays a kernel's first use: "background" (default; a request waits only for the
        warm-up of the cut it runs), "now" (before the constructor returns) or "off".
        `drop_min_s`: a call whose transfer took twice the estimate's time and this much more shows
        a bandwidth drop at once (edge/cut_selector.py)."""
        if not edge_slowdown >= 1.0:
            raise ValueError(f"edge_slowdown must be >= 1, got {edge_slowdown!r}")
        if edge_clock not in ("cpu", "wall"):
            raise ValueError(f"edge_clock must be 'cpu' or 'wall', got {edge_clock!r}")
        self.edge_slowdown = float(edge_slowdown)
        self.edge_clock = edge_clock
        self.split = load_split(model_path)
        self.address, self.security = address, security
        self.deadline_s = float(deadline_ms) / 1e3
        if not self.deadline_s > 0:
            raise ValueError(f"deadline_ms must be positive, got {deadline_ms!r}")
        self.link, self.adapt = link, adapt
        self.backoff_min, self.backoff_max = backoff_s
        self.ping_every = int(ping_every)
        self._interp: Dict[int, Interpreter] = {}
        self._full: Optional[Interpreter] = None
        self._channel = self._stub = self._pb = None
        self._stale = False
        self._connected = False
        self._lock = threading.Lock()
        self._backoff = 0.0
        self._retry_at = 0.0
        self._since_ping = 0
        self._deadline_at = 0.0
        self.counts = dict(requests=0, cloud=0, fallback=0, local=0, unavailable=0, deadline=0, errors=0,
                           switches=0, probes=0, connects=0, pings=0, trace_errors=0)
        # which cut runs: the link estimate and the switching rule (cut_selector.py, no I/O)
        self.selector = CutSelector(self.split.cuts, window, hysteresis, ping_every, adapt, initial_bandwidth_bps,
                                    resolution_s, self.counts, drop_min_s)
        self.trace = bool(trace)
        self._spans: Optional[List["TraceSpan"]] = None   # the request's spans (wall-clock seconds) when tracing
        self._busy: List[Tuple[float, float]] = []        # its remote calls and local runs (wall clock)
        self.last_trace_error: Optional[str] = None
        self.latencies: List[float] = []
        self.last_error: Optional[str] = None
        # the latest request: mode, total_s, local_s (time in the full model), cut, edge_s (emulated edge compute),
        # remote_s (in remote calls; remote_cpu_s: this thread's CPU in them, which the emulated edge does not
        # slow), server_s (the service's queue + compute), server_compute_s, bytes each way
        # and client_s: the client's own work here (encode, decode, glue, bookkeeping: the request less the
        # edge interpreters' invokes, the stub calls and the link), with edge_part and calls, which is what
        # partitioner/client_cost.py's ClientCost.fit prices every plan with; faults: minor page faults of
        # the request's thread (memory it touched for the first time: a switch to a cold cut shows them)
        self.last: Dict[str, object] = {}
        self._local_s = 0.0
        if self.split.full is not None:  # prepared now, so that a fallback costs only its compute
            self._full = Interpreter(self.split.full)
        for k, c in enumerate(self.split.cuts):  # and every cut, so that a switch costs nothing either
            if c.cloud_part:
                self._interp_for(k)
        # and each of them run once (kernels loaded, arena touched): the cut requests run now first,
        # then its neighbours outwards, the full model (the fallback) last
        order = sorted(self._interp, key=lambda k: (abs(k - self.cut), k))
        self.warmer = CutWarmer([(k, self._interp[k]) for k in order]
                                + ([("full", self._full)] if self._full is not None else []), warm)
        if any(c.cloud_part for c in self.split.cuts):
            self._connect()  # imports grpc and makes the channel (no I/O yet): no request pays for that

    # ---- public -------------------------------------------------------------------------------------
    @property
    def cut(self) -> int:
        """The index of the cut requests run now."""
        return self.selector.cut

    @property
    def bandwidth_bps(self) -> Optional[float]:
        """The uplink estimate (bit/s); None before the first remote call without an initial one."""
        return self.selector.bandwidth_bps

    @property
    def rtt_s(self) -> Optional[float]:
        return self.selector.rtt_s

    def invoke(self, *inputs: np.ndarray) -> List[np.ndarray]:
        with self._lock:
            t0, c0, f0 = time.perf_counter(), time.thread_time(), _minor_faults()
            self._deadline_at = t0 + self.deadline_s
            self.counts["requests"] += 1
            before, self._local_s, cut = dict(self.counts), 0.0, self.split.cuts[self.cut].name
            self._remote_s = self._server_s = self._compute_s = self._remote_cpu_s = 0.0
            self._invoke_s = self._stub_s = self._link_s = 0.0
            self._up_bytes = self._down_bytes = self._calls = 0
            self._edge_part = False
            w0 = time.time()
            if self.trace:
                self._spans, self._busy, self._trace_w0, self._trace_shift_s = [], [], w0, 0.0
            self.warmer.request_started()
            try:
                return self._invoke(inputs)
            finally:
                self.warmer.request_finished()
                w_done = time.time()
                here_s = time.perf_counter() - t0
                edge_s = self._emulate_edge(t0, c0)
                total = time.perf_counter() - t0
                mode = next((k for k in ("cloud", "fallback", "local") if self.counts[k] > before[k]), "error")
                # where the time went: computing on the (emulated) edge, in remote calls (link + service)
                # and, of that, the service's queue + compute; the bytes each way
                self.last = dict(mode=mode, total_s=total, local_s=self._local_s, cut=cut,
                                 edge_s=edge_s, remote_s=self._remote_s, remote_cpu_s=self._remote_cpu_s,
                                 server_s=self._server_s, server_compute_s=self._compute_s,
                                 up_bytes=self._up_bytes, down_bytes=self._down_bytes,
                                 client_s=max(here_s - self._invoke_s - self._stub_s - self._link_s, 0.0),
                                 edge_part=self._edge_part, calls=self._calls,
                                 faults=None if f0 is None else _minor_faults() - f0)
                if self._spans is not None:
                    self._finish_trace(cut, w0, w_done, time.time())
                self.latencies.append(total)
                if len(self.latencies) > 10000:
                    del self.latencies[:5000]

    def _emulate_edge(self, t0: float, c0: float) -> float:
        """Seconds the request computed on the (emulated) edge, remote calls left out; with a
        slowdown, sleeps until that much time has passed in computing plus sleeping."""
        wall = max(time.perf_counter() - t0 - self._remote_s, 0.0)  # computing here, not waiting
        if self.edge_slowdown <= 1.0:
            return wall
        if self.edge_clock == "cpu":
            edge = self.edge_slowdown * max(time.thread_time() - c0 - self._remote_cpu_s, 0.0)
            time.sleep(max(edge - wall, 0.0))
            return max(edge, wall)
        time.sleep((self.edge_slowdown - 1.0) * wall)
        return self.edge_slowdown * wall

    def stats(self) -> Dict[str, object]:
        lat = sorted(self.latencies)
        pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3 if lat else None)
        c = self.split.cuts[self.cut]
        return dict(self.counts, cut=c.name, cloud_part=c.cloud_part or None, bandwidth_bps=self.bandwidth_bps, rtt_ms=
                    None if self.rtt_s is None else self.rtt_s * 1e3, backoff_s=self._backoff,
                    cloud_down=time.monotonic() < self._retry_at, p50_ms=pct(0.5), p99_ms=pct(0.99),
                    last_error=self.last_error, warm=self.warmer.done, warm_cpu_ms=
                    {str(k): s * 1e3 for k, s in self.warmer.seconds.items()}, warm_errors={str(k): e for k, e in self.warmer.errors.items()})

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = self._stub = None

    def __enter__(self) -> "OffloadClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- one request -----------------------------------------------------------------------------------
    def _invoke(self, inputs) -> List[np.ndarray]:
        down = time.monotonic() < self._retry_at
        k = self.selector.choose(down)  # the current cut, or now and then the next one up (a probe)
        if not self.split.cuts[k].cloud_part:  # the planner keeps everything on the edge at this bandwidth
            self.counts["local"] += 1
            return self._local(inputs)
        if down:
            if self.split.full is None:
                raise CloudError(f"the cloud is backing off after: {self.last_error}; the model carries no full copy")
            self.counts["local"] += 1
            return self._local(inputs)
        self.warmer.ensure(k)  # a cut still warming: wait for its warm-up (or do it here), no other
        it = self._interp_for(k)
        try:
            outs = self._timed_invoke(it, inputs)
        except (_Miss, CloudError) as e:
            return self._fall_back(inputs, e)
        self._backoff = 0.0
        self.counts["cloud"] += 1
        return outs

    def _fall_back(self, inputs, e: Exception) -> List[np.ndarray]:
        if isinstance(e, _Miss):
            self.counts["deadline"] += 1
        self.last_error = str(e) or type(e).__name__
        self._backoff = min(self.backoff_max, max(self.backoff_min, self._backoff * 2))
        self._retry_at = time.monotonic() + self._backoff
        if self.split.full is None:
            raise CloudError(f"cloud failed ({self.last_error}) and the model carries no full copy "
                             "to fall back on") from e
        self.counts["fallback"] += 1
        return self._local(inputs)

    def _local(self, inputs) -> List[np.ndarray]:
        if self._full is None:
            if self.split.full is None:
                raise CloudError("the model carries no full copy to run locally")
            self._full = Interpreter(self.split.full)
        t, w = time.perf_counter(), time.time()
        self.warmer.ensure("full")
        try:
            return self._timed_invoke(self._full, inputs)
        finally:
            self._local_s += time.perf_counter() - t
            if self._spans is not None:
                w_end = time.time()
                self._busy.append((w, w_end, "local"))
                self._span("local (full model)", "EdgeLocal", w, w_end)

    def _timed_invoke(self, it: Interpreter, inputs) -> List[np.ndarray]:
        """it.invoke, its time less its remote calls' counted in _invoke_s: what `last["client_s"]`
        leaves out as the edge part's own (kernels and interpreter)."""
        self._edge_part = self._edge_part or any(kind == "op" for kind, _ in it.steps_info)
        t, r = time.perf_counter(), self._remote_s
        try:
            return it.invoke(*inputs)
        finally:
            self._invoke_s += time.perf_counter() - t - (self._remote_s - r)

    def _interp_for(self, k: int) -> Interpreter:
        it = self._interp.get(k)
        if it is None:
            it = self._interp[k] = Interpreter(self.split.cuts[k].model, remote=self._remote(k))
        return it

    def _remote(self, k: int):
        """The interpreter's callback for cut k's RemotePart: one Infer call over the (emulated) link."""
        def call(part: RemoteInfo, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
            t_call, c_call, w_call = time.perf_counter(), time.thread_time(), time.time()
            ok = False
            try:
                outs = self._call_part(k, part, arrays)
                ok = True
                return outs
            finally:
                self._remote_s += time.perf_counter() - t_call
                self._remote_cpu_s += time.thread_time() - c_call
                if self._spans is not None:
                    w_end = time.time()
                    self._busy.append((w_call, w_end, "call"))
                    if not ok:
                        self._span(f"call to {part.name} failed", "OffloadFailed", w_call, w_end)
        return call

    def _call_part(self, k: int, part: RemoteInfo, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        """One Infer call for cut k's RemotePart over the (emulated) link."""
        cut = self.split.cuts[k]
        self._connect()
        pb = self._pb
        if self.rtt_s is None or self._since_ping >= self.ping_every:
            self._ping()
        self._since_ping += 1
        nbytes_up = sum(a.nbytes for a in arrays)
        tracing = self._spans is not None
        w_enc = time.time() if tracing else 0.0
        req = pb.InferRequest(part=cut.cloud_part, request_id=uuid.uuid4().hex[:16], trace=tracing)
        for n, a in zip(cut.inputs, arrays):
            _encode(req.inputs.add(name=n), a)
        t0 = time.perf_counter()
        w_up = time.time() if tracing else 0.0
        self._sleep_link(nbytes_up)
        t_send = time.time() if tracing else 0.0
        resp = self._call("Infer", req)
        if tracing:
            self._trace_call(cut.cloud_part, resp, w_enc, w_up, t_send, time.time(), nbytes_up)
        self._server_s += (resp.queue_ms + resp.compute_ms) / 1e3
        self._compute_s += resp.compute_ms / 1e3
        if len(resp.outputs) != len(cut.outputs):
            raise CloudError(f"part '{cut.cloud_part}': the service returned {len(resp.outputs)} outputs, "
                             f"expected {len(cut.outputs)}")
        shapes = self._interp[k].remote_shapes
        outs = [_decode(nt, n, cut.model.tensors[i].dtype, shapes[i])
                for nt, n, i in zip(resp.outputs, cut.outputs, part.outputs)]
        nbytes_down = sum(o.nbytes for o in outs)
        self._up_bytes += nbytes_up
        self._down_bytes += nbytes_down
        w_down = time.time() if tracing else 0.0
        self._sleep_link(nbytes_down)
        if tracing:
            w_end = time.time()
            if self.link is not None:
                self._span(f"link down ({nbytes_down} bytes)", "LinkDown", w_down, w_end, LINK_TRACK, nbytes_down,
                           self._trace_call_i)
            self._span(f"receive {cut.cloud_part}", "OffloadRecv", self._t_recv, w_end, nbytes=nbytes_down,
                       call=self._trace_call_i)
        self.selector.measure(time.perf_counter() - t0 - (resp.queue_ms + resp.compute_ms) / 1e3, nbytes_up + nbytes_down)
        return outs

    # ---- the link and the estimate ------------------------------------------------------------------
    def _remaining(self) -> float:
        return self._deadline_at - time.perf_counter()

    def _sleep_link(self, nbytes: int) -> None:
        if self.link is None:
            return
        need = self.link.transfer_time(nbytes)
        left = self._remaining()
        t = time.perf_counter()
        try:
            if need > left:
                time.sleep(max(left, 0.0))
                raise _Miss(f"deadline of {self.deadline_s * 1e3:g} ms passed on the link ({nbytes} bytes at "
                            f"{self.link.bandwidth_bps / 1e6:g} Mbit/s)")
            time.sleep(need)
        finally:
            self._link_s += time.perf_counter() - t

    def _ping(self) -> None:
        """One small call (Describe): its time is the round trip. The estimate is the least of the
        last few pings: delays on a loaded machine only ever add to a round trip. On a fresh channel
        a first, untimed call connects: a connection's setup is no round trip, and an RTT estimate
        holding it (50 ms on loopback) hid every transfer until the next ping."""
        if not self._connected:
            self._call("Describe", self._pb.DescribeRequest())
            self._connected = True
        t0, w0 = time.perf_counter(), time.time()
        self._sleep_link(0)
        self._call("Describe", self._pb.DescribeRequest())
        self._sleep_link(0)
        self.selector.add_rtt(time.perf_counter() - t0)
        if self._spans is not None:
            self._span("ping (Describe)", "OffloadPing", w0, time.time())
        self.counts["pings"] += 1
        self._since_ping = 0

    # ---- gRPC --------------------------------------------------------------------------------------------
    def _connect(self) -> None:
        """A channel to the service. After UNAVAILABLE the channel is replaced when the client's
        backoff ends: a fresh one connects at once, where the old one would wait out gRPC's own
        reconnect backoff (up to a second) after the server came back."""
        if self._stub is not None and not self._stale:
            return
        if self._channel is not None:
            self._channel.close()
        self._stale = False
        self._connected = False  # no call made on this channel yet
        # deferred: grpc (and the generated stubs, which import it) is a heavy import that
        # `import isthmus.edge` must not pay; only a client that talks to the cloud needs it
        # deferred: grpc is a heavy or optional dependency
        import grpc  # noqa: F401
        from isthmus.proto import offload_pb2, offload_pb2_grpc  # deferred: proto.offload_pb2_grpc loads grpc
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                   ("grpc.max_reconnect_backoff_ms", 1000), ("grpc.enable_retries", 0),
                   ("grpc.use_local_subchannel_pool", 1)]  # a new channel must not inherit a failed connection
        self._pb = offload_pb2
        self._channel = make_channel(self.address, self.security, options)
        self._stub = offload_pb2_grpc.OffloadStub(self._channel)
        self.counts["connects"] += 1

    def _call(self, method: str, request):
        import grpc  # deferred: a heavy import (see _connect); loaded by then
        left = self._remaining()
        if left <= 0:
            raise _Miss(f"deadline of {self.deadline_s * 1e3:g} ms passed before the {method} call")
        t = time.perf_counter()
        if method == "Infer":
            self._calls += 1
        try:
            return getattr(self._stub, method)(request, timeout=left)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise _Miss(f"{method}: the service missed the {self.deadline_s * 1e3:g} ms deadline") from None
            if code == grpc.StatusCode.UNAVAILABLE:
                self.counts["unavailable"] += 1
                self._stale = True
            else:
                self.counts["errors"] += 1
            details = e.details() if hasattr(e, "details") else str(e)
            raise CloudError(f"{method} to {self.address}: {getattr(code, 'name', code)}: {details}") from None
        finally:
            self._stub_s += time.perf_counter() - t  # the RPC stack, the link and the service: not the client's own


__all__ = ["OffloadClient", "CloudError"]
