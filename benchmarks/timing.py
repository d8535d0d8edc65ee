"""Shared timing for the benchmarks: medians over repeats, machine facts, JSON out."""
from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, Optional


def median_seconds(fn: Callable[[], object], repeats: int = 15, inner: int = 1, warmup: int = 2) -> float:
    """Median wall time of one call of `fn` (each sample averages `inner` calls)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def blocked_medians(fns: Dict[str, Callable[[], object]], repeats: int = 21, rounds: int = 3,
                    pause_s: float = 0.05, warm_s: float = 0.02) -> Dict[str, float]:
    """Per contender, the median of its block medians: each round times every contender in a block
    of `repeats` calls (median_seconds), in an order rotating by round, so that no contender's
    threads (onnxruntime's spin after a run) disturb another's calls, and drift reaches all alike.
    Each block starts `pause_s` after the one before, once the last contender's threads stopped
    spinning: straight after an onnxruntime block, isthmus's batch-1 networks at default threads ran
    7-11% slower on the 2-core VM (its split kernels waited for the core onnxruntime's worker spun on);
    onnxruntime after isthmus's blocks was unchanged either way.
    After the pause each block first runs its contender untimed for `warm_s`: the 2-core VM's cores
    come back from 50 ms of idle slowly, and the first calls of a block ran 2-6x their steady time
    for about 2 ms (a batch-1 MLP: 452, 155, 104, 98 ... 75 us; the LSTM 584, 306, 283 ... 210 us,
    medians of 10 blocks), so a block's median of 21 calls sat inside that ramp for the small models
    and compared default threads' blocks with one thread's back-to-back calls unfairly (MLP b1 138
    against 107 us, LSTM b1 344 against 224; onnxruntime's own rows alike)."""
    names = list(fns)
    blocks: Dict[str, list] = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            time.sleep(pause_s)
            t0 = time.perf_counter()
            while True:  # untimed, at least two calls
                fns[k]()
                fns[k]()
                if time.perf_counter() - t0 >= warm_s:
                    break
            blocks[k].append(median_seconds(fns[k], repeats=repeats, warmup=0))
    return {k: statistics.median(v) for k, v in blocks.items()}


def wall_and_cpu_medians(fns: Dict[str, Callable[[], object]], repeats: int, warmup: int = 2):
    """Interleaved samples (as interleaved_medians) of wall time and of the calling thread's CPU
    time (time.thread_time, which other processes do not inflate): ({name: wall}, {name: cpu})."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    wall: Dict[str, list] = {k: [] for k in fns}
    cpu: Dict[str, list] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            w0, c0 = time.perf_counter(), time.thread_time()
            f()
            cpu[k].append(time.thread_time() - c0)
            wall[k].append(time.perf_counter() - w0)
    return ({k: statistics.median(v) for k, v in wall.items()}, {k: statistics.median(v) for k, v in cpu.items()})


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds process `pid` has used (robust to other load on the machine)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerProcess:
    """A server subprocess that prints '<tag> host:port' once it listens (isthmus serve prints
    ISTHMUS_OFFLOAD); `address` is that host:port; stop() sends SIGINT, then kills after 20 s."""

    def __init__(self, cmd, tag: str, env: Optional[dict] = None, start_timeout_s: float = 60.0):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        box = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(start_timeout_s)
        if not box or not box[0].startswith(tag + " "):
            self.stop()
            raise RuntimeError(f"{cmd[:4]} did not start: {box} {self.proc.stderr.read()[-2000:]}")
        self.address = box[0].split()[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate(timeout=10)


def machine() -> Dict[str, object]:
    import numpy as np
    info = {"python": platform.python_version(), "numpy": np.__version__, "cpus": os.cpu_count(),
            "machine": platform.machine(), "date": time.strftime("%Y-%m-%d")}
    try:
        import onnxruntime
        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    try:
        import torch
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def emit(name: str, results: Dict[str, object]) -> None:
    print(json.dumps({"benchmark": name, "machine": machine(), **results}, indent=2))
    sys.stdout.flush()


def torch_or_none():
    try:
        import torch
        return torch
    except ImportError:
        print("note: torch not installed (pip install torch==2.13.0); its column is skipped", file=sys.stderr)
        return None


def interleaved_medians(fns: Dict[str, Callable[[], object]], repeats: int = 21, inner: int = 1,
                        warmup: int = 2) -> Dict[str, float]:
    """Median seconds per call of each function, sampled in alternation so that a change in the
    machine's load hits every contender alike (the machines here are shared and noisy)."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    samples: Dict[str, list] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                f()
            samples[k].append((time.perf_counter() - t0) / inner)
    return {k: statistics.median(v) for k, v in samples.items()}


def torch_train_step(opt, loss_fn: Callable[[], object]) -> Callable[[], object]:
    """One PyTorch training step: zero the gradients, loss_fn() forward, backward, update."""
    def step():
        opt.zero_grad(set_to_none=True)
        out = loss_fn()
        out.backward()
        opt.step()
        return out
    return step


def measure_with_torch(contenders: Dict[str, Callable[[], object]], torch_step: Optional[Callable[[], object]],
                       repeats: int, inner: int = 1) -> Dict[str, float]:
    """isthmus and its numpy reference interleaved; PyTorch alone (its OpenMP threads spin after
    each call and would slow whichever contender ran next)."""
    t_torch = median_seconds(torch_step, repeats=repeats, inner=inner) if torch_step is not None else None
    res = interleaved_medians(contenders, repeats=repeats, inner=inner)
    if t_torch is not None:
        res["torch"] = t_torch
    return res
