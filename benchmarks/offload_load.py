"""Load on the offload service: many concurrent edge clients against one `isthmus serve`, batched vs not.

    python benchmarks/offload_load.py                                # a quick smoke run (16 x 20)
    python benchmarks/offload_load.py --clients 64 --requests 200    # issue #8's load benchmark

The cloud part is the tail of an MLP (784-H-H-H-10, H = --hidden, cut after the first layer: the edge
sends an H-float hidden row, the cloud runs three dense layers and a softmax), or with
--model mobilenet the MobileNetV2-style network's tail after block 5 (res 64). The service
runs in a subprocess (`isthmus serve`), so the RSS read from /proc is the server's alone.
Each client is a coroutine (grpc.aio) with its own gRPC connection sending one-row requests back
to back (closed loop), each with a deadline. The same requests run against two servers started side by
side: one batching up to --max-batch rows (waiting at most --max-delay-ms), and one with max
batch 1 (no batching: the peer); the two take turns in --rounds rounds, so load from other work
on the machine drifting during the run hits both alike. Reported per mode: errors, throughput, client-side p50/p99
latency, the batching factor (mean rows per batch, from the server's Stats), the server's CPU time
per request (from /proc: meaningful even when other work loads the machine) and the clients' (the
throughput the two would reach on otherwise idle cores follows from them), server RSS at start,
after a concurrent warm-up (--warmup requests per client: every connection open, every server
thread started, batches at their working size), after each round and at the end (growth from
warm-up to end should stay within 10%; the per-round values tell a plateau from a leak;
--compare-serve-flags adds a third, batched server with other `isthmus serve` flags, such as its
malloc settings, interleaved with the others), and
whether every checked answer equals a local Session run of its own row (to float32 rounding:
another request's row would be off by the values' whole scale). JSON on stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from typing import Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import ServerProcess, process_cpu_s  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
def widths(hidden: int):
    return (784, hidden, hidden, hidden, 10)


def build(path: str, hidden: int):
    """The cloud part file; returns a reference function hidden rows -> probabilities."""
    import isthmus as ism
    WIDTHS = widths(hidden)
    from isthmus.cloud.offload_model import cloud_part, save_cloud_parts
    rng = np.random.default_rng(0)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, WIDTHS[0]), name="x")
        h = x
        for i, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:])):
            w = ism.constant((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), name=f"w{i}")
            h = ism.matmul(h, w, name=f"dense{i}")
            if i < len(WIDTHS) - 2:
                h = ism.relu(h, name=f"act{i}")
        y = ism.softmax(h, name="probs")
    part = cloud_part(g, ["act0:0"], [y], "tail")
    save_cloud_parts(path, [part], model="mlp-tail")
    sess = ism.Session(g)
    return lambda hv: sess.run(y, {g.tensor("act0:0"): hv})


def build_mobilenet(path: str, res: int = 64):
    """The MobileNetV2-style network's tail after block 5 (benchmarks/models.py): the edge sends
    block5's 32 x res/8 x res/8 activation; returns (reference function, input row shape)."""
    sys.path.insert(0, HERE)
    import isthmus as ism
    from isthmus.cloud.offload_model import cloud_part, save_cloud_parts
    from models import mobilenet_v2
    g, x, logits = mobilenet_v2(batch=1, res=res)
    sess = ism.Session(g)
    sess.run(ism.global_variables_initializer(g))
    cut = g.tensor("block5/Add:0")
    part = cloud_part(sess, [cut], [logits], "tail")
    save_cloud_parts(path, [part], model="mobilenet-tail")
    ref = ism.Session(part.graph)
    return (lambda hv: ref.run(part.outputs[0].tensor, {part.inputs[0].tensor: hv})), tuple(part.inputs[0].shape[1:])


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


class Server(ServerProcess):
    def __init__(self, path: str, max_batch: int, max_delay_ms: float, max_queue: int, blas_threads: int,
                 malloc_arenas: int = 0, serve_flags: Sequence[str] = ()):
        env = dict(os.environ)
        if malloc_arenas:  # glibc: fewer per-thread heaps, less memory held back by a server with many threads
            env["MALLOC_ARENA_MAX"] = str(malloc_arenas)
        if blas_threads:
            env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(blas_threads)
        env["PYTHONPATH"] = os.path.dirname(os.path.dirname(HERE)) + os.pathsep + env.get("PYTHONPATH", "")
        super().__init__(
            [sys.executable, "-m", "isthmus", "serve", path, "--port", "0", "--max-batch", str(max_batch),
             "--max-delay-ms", str(max_delay_ms), "--max-queue", str(max_queue), "--log-every", "0"]
            + list(serve_flags),
            "ISTHMUS_OFFLOAD", env)


class Mode:
    """One server (batched or not) and its clients' connections, run in rounds. The clients are
    coroutines on one asyncio loop (grpc.aio), each with its own connection: 64 OS threads fighting
    over the GIL cost the client process several ms of CPU per request, more than the server uses."""

    def __init__(self, loop, name: str, path: str, input_name: str, inputs: np.ndarray, clients: int,
                 max_batch: int, max_delay_ms: float, blas_threads: int, malloc_arenas: int = 0,
                 serve_flags: Sequence[str] = ()):
        from isthmus.wire import tensor_codec
        from isthmus.proto import offload_pb2
        self.loop, self.name, self.clients = loop, name, clients
        self.max_batch, self.max_delay_ms = max_batch, max_delay_ms
        self.serve_flags = list(serve_flags)
        self.srv = Server(path, max_batch, max_delay_ms, max_queue=4 * clients, blas_threads=blas_threads,
                          malloc_arenas=malloc_arenas, serve_flags=serve_flags)
        self.rss_start = rss_kib(self.srv.proc.pid)
        self.reqs = []
        for k in range(len(inputs)):
            r = offload_pb2.InferRequest(part="tail", request_id=str(k))
            tensor_codec.encode(inputs[k:k + 1], out=r.inputs.add(name=input_name).tensor)
            self.reqs.append(r.SerializeToString())
        self.chans, self.raw = self.loop.run_until_complete(self._connect())
        self.lat: list = []
        self.errors: list = []
        self.checked = self.wrong = 0
        self.max_err = 0.0
        self.rss_rounds: list = []
        self.wall = self.cpu = self.client_cpu = 0.0
        self.round_rps: list = []

    async def _connect(self):
        import grpc
        opts = [("grpc.use_local_subchannel_pool", 1)]  # one connection per client, as separate devices have
        chans = [grpc.aio.insecure_channel(self.srv.address, options=opts) for _ in range(self.clients)]
        # requests go out as pre-serialized bytes and answers come back as bytes (parsed only when checked)
        raw = [c.unary_unary("/isthmus.Offload/Infer", request_serializer=None, response_deserializer=None)
               for c in chans]
        return chans, raw

    def warm(self, warm: int) -> None:
        """Every connection open, the plan compiled, every server thread started; then the baseline."""
        async def one(c: int):  # enough concurrent requests that batches reach their working size
            for i in range(warm):
                await self.raw[c](self.reqs[(c + i) % len(self.reqs)], timeout=30)

        async def all_clients():
            await asyncio.gather(*(one(c) for c in range(self.clients)))
        self.loop.run_until_complete(all_clients())
        time.sleep(0.3)
        self.rss_before = rss_kib(self.srv.proc.pid)
        self.base = self.stats()

    def stats(self):
        import grpc
        from isthmus.proto import offload_pb2, offload_pb2_grpc
        with grpc.insecure_channel(self.srv.address) as ch:
            return offload_pb2_grpc.OffloadStub(ch).Stats(offload_pb2.StatsRequest(), timeout=10)

    def round(self, offset: int, requests: int, reference, inputs, deadline_s: float, check_every: int) -> None:
        import grpc
        from isthmus.wire import tensor_codec
        from isthmus.proto import offload_pb2
        lat = []

        async def client(c: int):
            call = self.raw[c]
            for i in range(requests):
                n = offset + c * requests + i
                k = n % len(self.reqs)
                t0 = time.perf_counter()
                try:
                    data = await call(self.reqs[k], timeout=deadline_s)
                except grpc.RpcError as e:
                    self.errors.append(f"{e.code().name}: {e.details()}")
                    continue
                lat.append(time.perf_counter() - t0)
                if n % check_every == 0:
                    got = tensor_codec.decode(offload_pb2.InferResponse.FromString(data).outputs[0].tensor)
                    want = reference(inputs[k:k + 1])
                    err = float(np.abs(got - want).max())
                    self.checked += 1
                    self.max_err = max(self.max_err, err)
                    # float32 sums grouped differently in a batch differ by ~1e-6 of the values' scale;
                    # another request's row would differ by the scale itself
                    self.wrong += err > 1e-4 * max(1.0, float(np.abs(want).max()))

        async def all_clients():
            await asyncio.gather(*(client(c) for c in range(self.clients)))
        cpu0, mine0, t0 = process_cpu_s(self.srv.proc.pid), time.process_time(), time.perf_counter()
        self.loop.run_until_complete(all_clients())
        wall = time.perf_counter() - t0
        self.cpu += process_cpu_s(self.srv.proc.pid) - cpu0
        self.client_cpu += time.process_time() - mine0
        self.wall += wall
        self.round_rps.append(len(lat) / wall)
        self.rss_rounds.append(round(rss_kib(self.srv.proc.pid) / 1024, 1))
        self.lat.extend(lat)

    def finish(self) -> dict:
        st = self.stats()
        rss_after = rss_kib(self.srv.proc.pid)
        self.close()
        lat = np.array(self.lat) * 1e3
        batches = st.batches - self.base.batches
        rows = st.mean_batch_rows * st.batches - self.base.mean_batch_rows * self.base.batches
        return {"max_batch_size": self.max_batch, "max_queue_delay_ms": self.max_delay_ms,
                "serve_flags": " ".join(self.serve_flags),
                "ok": int(lat.size), "errors": len(self.errors), "error_examples": sorted(set(self.errors))[:3],
                "wall_s": round(self.wall, 3), "throughput_rps": round(lat.size / self.wall, 1),
                "round_throughputs_rps": [round(r, 1) for r in self.round_rps],
                "p50_ms": round(float(np.percentile(lat, 50)), 3) if lat.size else None,
                "p99_ms": round(float(np.percentile(lat, 99)), 3) if lat.size else None,
                "batching_factor": round(rows / batches, 2) if batches else None, "batches": int(batches),
                "server_cpu_ms_per_request": round(1e3 * self.cpu / max(lat.size, 1), 3),
                "client_cpu_ms_per_request": round(1e3 * self.client_cpu / max(lat.size, 1), 3),
                "server_p50_ms": round(st.p50_latency_ms, 3), "server_p99_ms": round(st.p99_latency_ms, 3),
                "rss_at_start_mib": round(self.rss_start / 1024, 1),
                "rss_before_mib": round(self.rss_before / 1024, 1), "rss_after_mib": round(rss_after / 1024, 1),
                "rss_growth_pct": round(100.0 * (rss_after - self.rss_before) / self.rss_before, 2),
                "rss_after_each_round_mib": self.rss_rounds,
                "rss_growth_after_first_round_pct": round(100.0 * (rss_after / 1024 - self.rss_rounds[0])
                                                          / self.rss_rounds[0], 2) if self.rss_rounds else None,
                "answers_checked": self.checked, "answers_wrong": int(self.wrong),
                "max_abs_error_checked": self.max_err}

    def close(self) -> None:
        async def close_all():
            for c in self.chans:
                await c.close()
        if self.chans:
            self.loop.run_until_complete(close_all())
            self.chans = []
        self.srv.stop()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=20, help="requests per client")
    p.add_argument("--model", choices=("mlp", "mobilenet"), default="mlp")
    p.add_argument("--hidden", type=int, default=1024, help="mlp: width of the dense layers (default %(default)s)")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--blas-threads", type=int, default=1,
                   help="the server's BLAS threads (0: BLAS's default). Multithreaded BLAS spins against the "
                        "gRPC threads and the clients on this 2-core machine")
    p.add_argument("--max-delay-ms", type=float, default=2.0)
    p.add_argument("--deadline-s", type=float, default=30.0)
    p.add_argument("--malloc-arenas", type=int, default=0,
                   help="MALLOC_ARENA_MAX for the server (0: glibc's default, 8 per core)")
    p.add_argument("--serve-flags", default="", help="more `isthmus serve` flags for both servers, e.g. '--warm-up'")
    p.add_argument("--compare-serve-flags", default="",
                   help="add a third mode: batched, with these `isthmus serve` flags instead")
    p.add_argument("--compare-malloc", action="store_true",
                   help="= --compare-serve-flags '--malloc-mmap-threshold-kb 256' (RSS flat, more CPU)")
    p.add_argument("--warmup", type=int, default=20, help="requests per client before RSS is first read")
    p.add_argument("--rounds", type=int, default=4,
                   help="the modes take turns in this many rounds (default %(default)s)")
    p.add_argument("--check-every", type=int, default=25, help="compare every n-th answer with a local run")
    p.add_argument("--out", default=None, help="also write the JSON here")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mlp-tail.cloud")
        if a.model == "mlp":
            reference, row, input_name, model = build(path, a.hidden), (a.hidden,), "act0:0", \
                f"MLP tail {a.hidden}-{a.hidden}-{a.hidden}-10 + softmax"
        else:
            (reference, row), input_name = build_mobilenet(path), "block5/Add:0"
            model = "MobileNetV2-style tail after block 5 (res 64)"
        inputs = np.maximum(np.random.default_rng(1).standard_normal((1024,) + row), 0).astype(np.float32)
        loop = asyncio.new_event_loop()
        modes = {}
        try:
            flags = a.serve_flags.split()
            compare = (a.compare_serve_flags or ("--malloc-mmap-threshold-kb 256" if a.compare_malloc else "")).split()
            plan = [("batched", a.max_batch, flags), ("unbatched", 1, flags)]
            if compare:
                plan.append(("batched_compare", a.max_batch, compare))
            for name, mb, fl in plan:
                modes[name] = Mode(loop, name, path, input_name, inputs, a.clients, mb, a.max_delay_ms,
                                   a.blas_threads, a.malloc_arenas, fl)
            for m in modes.values():
                m.warm(a.warmup)
            rounds = max(1, min(a.rounds, a.requests))
            per = [a.requests // rounds + (r < a.requests % rounds) for r in range(rounds)]
            offset = 0
            for r, n in enumerate(per):  # alternate the modes, so drifting load on the machine hits all alike
                order = list(modes.values())[r % len(modes):] + list(modes.values())[:r % len(modes)]
                order = order if r % 2 == 0 else order[::-1]
                for m in order:
                    m.round(offset, n, reference, inputs, a.deadline_s, a.check_every)
                offset += n * a.clients
            modes = {name: m.finish() for name, m in modes.items()}
        finally:
            for m in modes.values():
                if isinstance(m, Mode):
                    m.close()
            loop.close()
    b, u = modes["batched"], modes["unbatched"]
    result = {"benchmark": "offload_load", "model": model + ", 1 row per request",
              "clients": a.clients, "requests_per_client": a.requests, "cpus": os.cpu_count(),
              "server_blas_threads": a.blas_threads or "default",
              "server_malloc_arena_max": a.malloc_arenas or "default",
              "load_avg_1m": round(os.getloadavg()[0], 2),
              "rss_before_definition": f"server RSS after the model loaded, every client connected and a concurrent "
                                       f"warm-up of {a.warmup} requests per client ({a.clients} at once: batches of "
                                       f"up to {min(a.clients, a.max_batch)} rows could form); rss_after: after "
                                       "all rounds",
              "target": "zero errors; server RSS after the run within 10% of rss_before (every mode)",
              "modes": modes,
              "throughput_ratio_batched_over_unbatched": round(b["throughput_rps"] / u["throughput_rps"], 2)
              if u["throughput_rps"] else None,
              "median_round_throughput_ratio": round(float(np.median(np.array(b["round_throughputs_rps"])
                                                                    / np.array(u["round_throughputs_rps"]))), 2),
              "server_cpu_ratio_batched_over_unbatched": round(b["server_cpu_ms_per_request"]
                                                                / u["server_cpu_ms_per_request"], 2),
              # what throughput would be on a machine whose cores only serve these two processes: CPU-bound
              # closed loop, so requests/s ~ cores / (server + client CPU per request)
              "cpu_bound_throughput_rps": {n: round(os.cpu_count() * 1e3 / (m["server_cpu_ms_per_request"]
                                                                            + m["client_cpu_ms_per_request"]), 1)
                                           for n, m in modes.items()},
              "p99_ratio_batched_over_unbatched": round(b["p99_ms"] / u["p99_ms"], 2) if u["p99_ms"] else None,
              "zero_errors": b["errors"] == 0 and u["errors"] == 0,
              "all_checked_answers_equal": b["answers_wrong"] == 0 and u["answers_wrong"] == 0,
              "rss_growth_within_10pct": all(m["rss_growth_pct"] <= 10 for n, m in modes.items()
                                             if n in ("batched", "unbatched"))}
    if "batched_compare" in modes:
        g = modes["batched_compare"]
        result["compare_rss_growth_pct"] = g["rss_growth_pct"]
        result["compare_rss_after_over_batched"] = round(g["rss_after_mib"] / b["rss_after_mib"], 3)
        result["server_cpu_ratio_compare_over_batched"] = round(g["server_cpu_ms_per_request"]
                                                                / b["server_cpu_ms_per_request"], 3)
        result["throughput_ratio_compare_over_batched"] = round(float(np.median(
            np.array(g["round_throughputs_rps"]) / np.array(b["round_throughputs_rps"]))), 3)
    result["met"] = result["zero_errors"] and result["all_checked_answers_equal"] and result["rss_growth_within_10pct"]
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0 if result["zero_errors"] and result["all_checked_answers_equal"] else 1


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
