"""Fault-injection scenarios on loopback (the reliability issue, part 2), each checking what must hold.

    python benchmarks/faults.py [--only NAME ...]      # prints one JSON line per scenario

Scenarios (each states its claim in `claim` and reports `holds`):
- stalled_link: a worker reached through a loopback proxy that stops forwarding bytes: calls
  fail within their deadline with an error naming the task, and work again once bytes flow.
- dropped_link: the proxy cuts every connection: the call fails fast as unreachable, naming the
  task, and the next call after the link returns succeeds.
- corrupt_checkpoint: the newest checkpoint file is damaged: restore_latest_valid restores the one
  before, reporting the damaged file; nothing is half-assigned.
- disk_full_checkpoint: a checkpoint write fails for lack of space (a subprocess whose file-size
  limit is below the checkpoint's size: a real EFBIG from the kernel): the save raises, and the
  previous checkpoint is still listed, verifies and restores.
- worker_load: a worker under sustained concurrent RunGraph load for a bounded time: zero errors,
  p50/p99 latency, RSS growth.
- killed_ps_and_worker: SIGKILL of the ps and of a worker mid-training, recovery from checkpoints
  (runs tests/cloud/test_fault_tolerance.py).
- killed_offload_service: benchmarks/offload_fallback.py (hung, then killed mid-run).
- offload_load: benchmarks/offload_load.py with 32 clients.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.dirname(ROOT) not in sys.path and __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(ROOT))


class StallProxy:
    """A TCP proxy on 127.0.0.1 in front of `upstream` ("host:port"). mode "pass" forwards bytes;
    "stall" holds them (connections stay open, nothing moves); "drop" closes every connection and
    refuses new ones until the mode changes back."""

    def __init__(self, upstream: str):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.mode = "pass"
        self._lock = threading.Lock()
        self._conns: List[socket.socket] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="stall-proxy")
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_mode(self, mode: str) -> None:
        assert mode in ("pass", "stall", "drop")
        self.mode = mode
        if mode == "drop":
            with self._lock:
                for c in self._conns:
                    try:
                        c.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    c.close()
                self._conns.clear()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                down, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self.mode == "drop":
                down.close()
                continue
            try:
                up = socket.create_connection(self.upstream, timeout=2.0)
            except OSError:
                down.close()
                continue
            with self._lock:
                self._conns += [down, up]
            threading.Thread(target=self._pump, args=(down, up), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._stop.is_set():
                if self.mode == "stall":
                    time.sleep(0.01)
                    continue
                r, _, _ = select.select([a, b], [], [], 0.05)
                for s in r:
                    data = s.recv(65536)
                    if not data:
                        return
                    while self.mode == "stall" and not self._stop.is_set():
                        time.sleep(0.01)   # a stall that begins mid-message holds what was read
                    peers[s].sendall(data)
        except OSError:
            return
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self.set_mode("drop")
        self._sock.close()
        self._thread.join(2)


def _worker_and_graph():
    from isthmus.cloud import rpc
    from isthmus.cloud.worker import Worker
    from isthmus.cloud.server import serve_worker
    server, port = serve_worker(Worker("/job:worker/task:0", recv_timeout=5.0, wire=True))
    return server, f"127.0.0.1:{port}", _worker_graph_bytes()


def _call_until_ok(client, handle, feeds, budget_s: float) -> float:
    """Seconds until a run succeeds again (retrying), or raise after `budget_s`."""
    t0 = time.monotonic()
    while True:
        try:
            client.run_graph(handle, 1, feeds, ["y:0"])
            return time.monotonic() - t0
        except Exception:  # noqa: BLE001  (retrying is the point)
            if time.monotonic() - t0 > budget_s:
                raise
            time.sleep(0.1)


def _link_scenario(mode: str) -> dict:
    from isthmus.cloud import rpc
    from isthmus.cloud.errors import RendezvousTimeout, TaskUnavailable
    server, addr, gbytes = _worker_and_graph()
    proxy = StallProxy(addr)
    deadline = 1.0
    client = rpc.WorkerClient(proxy.address, timeout=deadline, name="/job:worker/task:0")
    feeds = {"x:0": np.ones((4, 64), np.float32)}
    try:
        h = client.register_graph(gbytes)
        (y,) = client.run_graph(h, 1, feeds, ["y:0"])
        ok_before = np.allclose(y, np.tanh(1.0))
        proxy.set_mode(mode)
        t0 = time.monotonic()
        err = None
        try:
            client.run_graph(h, 2, feeds, ["y:0"])   # the client's deadline: `deadline` s
        except (RendezvousTimeout, TaskUnavailable) as e:
            err = e
        failed_in = time.monotonic() - t0
        expected = RendezvousTimeout if mode == "stall" else TaskUnavailable
        proxy.set_mode("pass")
        recovered_in = _call_until_ok(client, h, feeds, budget_s=15.0)
        holds = (ok_before and isinstance(err, expected) and "/job:worker/task:0" in str(err)
                 and failed_in < deadline + 1.5 and recovered_in < 15.0)
        return {"holds": bool(holds), "error": f"{type(err).__name__}: {err}"[:200] if err else None,
                "failed_after_s": round(failed_in, 3), "deadline_s": deadline,
                "recovered_after_s": round(recovered_in, 3)}
    finally:
        client.close()
        proxy.close()
        server.stop(grace=None).wait(5)


def stalled_link() -> dict:
    r = _link_scenario("stall")
    r["claim"] = "a stalled link fails the call within its deadline naming the task; calls work once it flows"
    return r


def dropped_link() -> dict:
    r = _link_scenario("drop")
    r["claim"] = "a cut link fails the call as unreachable naming the task; the next call after it returns works"
    return r


def _small_model():
    import isthmus as ism
    g = ism.Graph(seed=0)
    with g.as_default():
        w = ism.Variable(np.arange(12, dtype=np.float32).reshape(3, 4), name="w")
        b = ism.Variable(np.zeros(4, np.float32), name="b")
        bump = [w.assign_add(np.ones((3, 4), np.float32)), b.assign_add(np.ones(4, np.float32))]
        init = ism.global_variables_initializer()
    return g, w, b, bump, init


def corrupt_checkpoint() -> dict:
    import isthmus as ism
    from isthmus.core.checkpoint import Saver
    g, w, b, bump, init = _small_model()
    with tempfile.TemporaryDirectory() as d, ism.Session(g) as sess:
        sess.run(init)
        saver = Saver()
        saver.save(sess, os.path.join(d, "ckpt"), global_step=1)
        good = sess.run([w, b])
        sess.run(bump)
        newest = saver.save(sess, os.path.join(d, "ckpt"), global_step=2)
        with open(newest, "r+b") as f:          # flip bytes in the middle of the newest file
            f.seek(os.path.getsize(newest) // 2)
            chunk = f.read(16)
            f.seek(-len(chunk), 1)
            f.write(bytes(c ^ 0xFF for c in chunk))
        sess.run(bump)
        warnings: List[str] = []
        restored = saver.restore_latest_valid(sess, d, warn=warnings.append)
        got = sess.run([w, b])
    holds = (all(np.array_equal(x, y) for x, y in zip(got, good)) and restored is not None
             and any(os.path.basename(newest) in m for m in warnings))
    return {"claim": "a damaged newest checkpoint is reported and the previous one restored",
            "holds": bool(holds), "restored": os.path.basename(str(restored)), "reported": warnings[:2]}


_DISK_FULL_CHILD = r"""
import os, resource, signal, sys, numpy as np
sys.path.insert(0, sys.argv[2])
import isthmus as ism
from isthmus.core.checkpoint import Saver
d = sys.argv[1]
g = ism.Graph(seed=0)
with g.as_default():
    w = ism.Variable(np.zeros((256, 256), np.float32), name="w")
    init = ism.global_variables_initializer()
sess = ism.Session(g); sess.run(init)
saver = Saver()
saver.save(sess, os.path.join(d, "ckpt"), global_step=1)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # a failed write returns EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))   # the checkpoint is 256 KiB
try:
    saver.save(sess, os.path.join(d, "ckpt"), global_step=2)
    print("SAVED")
except OSError as e:
    print("OSERROR", e.errno, str(e)[:120])
"""


def disk_full_checkpoint() -> dict:
    import isthmus as ism
    from isthmus.core.checkpoint import Saver
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([sys.executable, "-c", _DISK_FULL_CHILD, d, os.path.dirname(ROOT)],
                             capture_output=True, text=True, timeout=120)
        line = (out.stdout.strip().splitlines() or ["?"])[-1]
        leftovers = sorted(os.listdir(d))
        g = ism.Graph(seed=0)
        with g.as_default():
            w = ism.Variable(np.full((256, 256), 7.0, np.float32), name="w")
            init = ism.global_variables_initializer()
        with ism.Session(g) as sess:
            sess.run(init)
            restored = Saver().restore_latest_valid(sess, d)
            value = sess.run(w)
    holds = line.startswith("OSERROR") and np.array_equal(value, np.zeros((256, 256), np.float32))
    return {"claim": "a checkpoint write that runs out of space raises, and the previous checkpoint "
                     "is still listed, verifies and restores",
            "holds": bool(holds), "child": line, "stderr": out.stderr[-300:] if out.returncode else "",
            "restored": os.path.basename(str(restored)), "files_after": leftovers}


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker_load(seconds: float = 10.0, clients: int = 16) -> dict:
    """A worker task in a subprocess, `clients` threads calling RunGraph for `seconds`."""
    from isthmus.cloud import rpc
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "from isthmus.cloud.server import serve_worker; from isthmus.cloud.worker import Worker; import time; "
         "s, p = serve_worker(Worker('/job:worker/task:0', wire=True)); print(p, flush=True); time.sleep(3600)",
         os.path.dirname(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        gbytes = _worker_graph_bytes()
        setup = rpc.WorkerClient(f"127.0.0.1:{port}", timeout=10.0)
        h = setup.register_graph(gbytes)
        feeds = {"x:0": np.ones((8, 64), np.float32)}
        setup.run_graph(h, 0, feeds, ["y:0"])
        rss0 = _rss_mb(child.pid)
        lat: List[float] = []
        errors = [0]
        stop = time.monotonic() + seconds
        lock = threading.Lock()

        def loop(i: int) -> None:
            c = rpc.WorkerClient(f"127.0.0.1:{port}", timeout=10.0)
            mine = []
            step = i * 10_000_000
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                try:
                    (y,) = c.run_graph(h, step, feeds, ["y:0"])
                    if not np.allclose(y, np.tanh(1.0)):
                        raise ValueError("wrong result")
                except Exception:  # noqa: BLE001  (counted)
                    with lock:
                        errors[0] += 1
                mine.append(time.perf_counter() - t0)
                step += 1
            c.close()
            with lock:
                lat.extend(mine)

        threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 30)
        rss1 = _rss_mb(child.pid)
        setup.close()
        ms = np.array(lat) * 1e3
        growth = (rss1 - rss0) / rss0
        return {"claim": f"a worker under {clients} concurrent clients for {seconds:.0f} s: no errors, "
                         "RSS growth <= 10%",
                "holds": bool(errors[0] == 0 and growth <= 0.10 and len(lat) > 0),
                "requests": len(lat), "errors": errors[0], "throughput_rps": round(len(lat) / seconds, 1),
                "p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2),
                "rss_mb_before": round(rss0, 1), "rss_mb_after": round(rss1, 1), "rss_growth": round(growth, 4)}
    finally:
        child.kill()
        child.wait(10)


def _worker_graph_bytes() -> bytes:
    import isthmus as ism
    from isthmus.cloud import graph_codec
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(ism.float32, [None, 64], name="x")
        ism.tanh(ism.matmul(x, ism.constant(np.eye(64, dtype=np.float32))), name="y")
    return graph_codec.to_bytes(g)


def _last_json(text: str):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        from report import last_json
    finally:
        sys.path.pop(0)
    return last_json(text)


def _script(args, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=os.path.dirname(os.path.abspath(__file__)),
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))


def killed_ps_and_worker() -> dict:
    """kill -9 of the ps task and of a worker task at seeded steps of synchronous training on a
    LocalCluster, recovery from the newest valid checkpoint (tests/cloud/test_fault_tolerance.py)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
                          os.path.join(ROOT, "tests", "cloud", "test_fault_tolerance.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    summary = [ln for ln in out.stdout.splitlines() if " passed" in ln or " failed" in ln][-1:]
    return {"claim": "a ps or worker killed with SIGKILL mid-training is named within a bound, restarted, and "
                     "training ends with the parameters of an uninterrupted run (a torn checkpoint too)",
            "holds": out.returncode == 0, "result": summary[0] if summary else out.stdout[-200:]}


def killed_offload_service() -> dict:
    out = _script(["offload_fallback.py", "--requests", "60"], 600)
    r = _last_json(out.stdout) or {}
    return {"claim": "the offload service hung, then killed mid-run: every request is still answered "
                     "correctly, locally, within its deadline plus its local compute",
            "holds": out.returncode == 0 and bool(r.get("all_answers_correct")),
            "requests": r.get("requests"), "answered_locally": r.get("answered_locally"),
            "worst_request_ms": r.get("worst_request_ms"), "deadline_ms": r.get("deadline_ms"),
            "over_deadline_plus_local": r.get("requests_over_deadline_plus_their_local_time")}


def offload_load() -> dict:
    out = _script(["offload_load.py", "--clients", "32", "--requests", "60", "--rounds", "2",
                   "--blas-threads", "1"], 600)
    r = _last_json(out.stdout) or {}
    b = (r.get("modes") or {}).get("batched", {})
    return {"claim": "the offload service under 32 concurrent clients: no errors, right answers, RSS growth <= 10%",
            "holds": bool(r.get("zero_errors") and r.get("all_checked_answers_equal")
                          and r.get("rss_growth_within_10pct")),
            "requests": b.get("ok"), "errors": b.get("errors"), "throughput_rps": b.get("throughput_rps"), "p50_ms": b.get("p50_ms"),
            "p99_ms": b.get("p99_ms"), "rss_growth_pct": b.get("rss_growth_pct"),
            "batched_over_unbatched": r.get("throughput_ratio_batched_over_unbatched")}


SCENARIOS: Dict[str, Callable[[], dict]] = {
    "stalled_link": stalled_link,
    "dropped_link": dropped_link,
    "corrupt_checkpoint": corrupt_checkpoint,
    "disk_full_checkpoint": disk_full_checkpoint,
    "worker_load": worker_load,
    "killed_ps_and_worker": killed_ps_and_worker,
    "killed_offload_service": killed_offload_service,
    "offload_load": offload_load,
}


def run(names=None) -> List[dict]:
    rows = []
    for name in names or SCENARIOS:
        t0 = time.monotonic()
        try:
            r = SCENARIOS[name]()
        except Exception as e:  # noqa: BLE001  (a scenario that blows up does not hold)
            r = {"holds": False, "error": f"{type(e).__name__}: {e}"[:300]}
        r = {"scenario": name, **r, "seconds": round(time.monotonic() - t0, 2)}
        print(json.dumps(r), flush=True)
        rows.append(r)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), help="run just these scenarios")
    args = p.parse_args(argv)
    rows = run(args.only)
    return 0 if all(r["holds"] for r in rows) else 1


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
