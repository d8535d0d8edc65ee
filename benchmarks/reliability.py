"""Fuzz the input boundaries that exist today and write RELIABILITY.md.

    python benchmarks/reliability.py [--inputs 2000]

Harnesses: the edge model loader/verifier (and preparing the interpreter on what it accepts) and
the ONNX importer. Inputs are mutations (bit flips, byte overwrites, truncations, spliced chunks)
of valid files the project makes itself. Each harness runs in a subprocess whose address space is
capped at 1 GiB above its start; any exception other than the documented error types, any input
taking over 2 s, or a memory error counts as a failure. (The GraphDef/TensorProto decoders and the
TFLite importer join when they exist; see the reliability issue.)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _seeds_edge():
    import isthmus as ism
    from isthmus.converters.edge_export import to_edge
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 3, 12, 12), name="x")
        h = ism.nn.Conv2D(8, 3, activation="relu")(x)
        h = ism.nn.DepthwiseConv2D(3, activation="relu6")(h)
        y = ism.nn.Dense(4)(ism.global_avg_pool(ism.max_pool(h, 2, 2)))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return [to_edge(sess, [y])]


def _seeds_onnx():
    import isthmus as ism
    from isthmus.converters import to_onnx
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 3, 8, 8), name="x")
        h = ism.nn.Conv2D(4, 3, activation="relu")(x)
        y = ism.softmax(ism.nn.Dense(5)(ism.flatten(ism.max_pool(h, 2, 2))))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return [to_onnx(sess, [y]).SerializeToString()]


def _mutate(rng, data: bytes) -> bytes:
    b = bytearray(data)
    kind = rng.integers(0, 4)
    if kind == 0:
        for _ in range(rng.integers(1, 8)):
            i = int(rng.integers(0, len(b)))
            b[i] ^= 1 << int(rng.integers(0, 8))
    elif kind == 1:
        for _ in range(rng.integers(1, 4)):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
    elif kind == 2:
        b = b[:int(rng.integers(0, len(b)))]
    else:
        i, j = sorted(int(v) for v in rng.integers(0, len(b), 2))
        k = int(rng.integers(0, len(b)))
        b[k:k] = b[i:j]
    return bytes(b)


def _run_edge(data: bytes) -> bool:
    """True when the input got past the verifier (and the interpreter was prepared on it)."""
    from isthmus.edge import EdgeModelError, Interpreter, loads
    try:
        model = loads(data)
    except EdgeModelError:
        return False
    try:
        Interpreter(model)
    except EdgeModelError:
        pass
    return True


def _run_onnx(data: bytes) -> None:
    import onnx
    import isthmus as ism
    from isthmus.converters import OnnxImportError, from_onnx
    try:
        model = onnx.load_from_string(data)
    except Exception:
        return False  # onnx's own parser refused the bytes: not our input
    try:
        from_onnx(model)
    except (OnnxImportError, ism.ShapeError, ism.GraphError):
        pass
    return True


HARNESSES = {"edge_loader": (_seeds_edge, _run_edge), "onnx_importer": (_seeds_onnx, _run_onnx)}


class _Timeout(Exception):
    pass


def worker(name: str, n: int, seed: int) -> dict:
    seeds_fn, run = HARNESSES[name]
    seeds = seeds_fn()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    used = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 30), hard))

    def alarm(*_):
        raise _Timeout()
    signal.signal(signal.SIGALRM, alarm)
    rng = np.random.default_rng(seed)
    crashes, hangs, memory, deep, examples = 0, 0, 0, 0, []
    t0 = time.time()
    for _ in range(n):
        data = _mutate(rng, seeds[int(rng.integers(0, len(seeds)))])
        signal.alarm(2)
        try:
            deep += bool(run(data))
        except _Timeout:
            hangs += 1
        except MemoryError:
            memory += 1
        except Exception as e:  # anything undocumented
            crashes += 1
            if len(examples) < 5:
                examples.append(f"{type(e).__name__}: {str(e)[:120]}")
        finally:
            signal.alarm(0)
    return {"harness": name, "inputs": n, "reached_deep": deep, "crashes": crashes, "hangs": hangs, "over_1GiB": memory,
            "seconds": round(time.time() - t0, 1), "examples": examples}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--inputs", type=int, default=2000)
    p.add_argument("--out", default=os.path.join(ROOT, "RELIABILITY.md"))
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.inputs, args.seed)))
        return 0
    rows = []
    for name in HARNESSES:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", name, "--inputs", str(args.inputs)],
                             capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            rows.append({"harness": name, "inputs": args.inputs, "reached_deep": "-", "crashes": "worker died", "hangs": "-",
                         "over_1GiB": "-", "seconds": "-", "examples": [out.stderr[-300:]]})
        else:
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]))
    import onnx
    lines = ["# Reliability", "", f"Written by `python benchmarks/reliability.py --inputs {args.inputs}` on "
             f"{time.strftime('%Y-%m-%d')} (Python {platform.python_version()}, numpy {np.__version__}, "
             f"onnx {onnx.__version__}). Mutated valid files; a failure is an undocumented exception, an input "
             "over 2 s, or an allocation over 1 GiB. \"Past the first check\": edge files the verifier accepted (the "
             "interpreter was then prepared on them); ONNX files onnx's parser accepted (then imported).", "",
             "| harness | inputs | past the first check | crashes | hangs | over 1 GiB | seconds |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['harness']} | {r['inputs']} | {r['reached_deep']} | {r['crashes']} | {r['hangs']} | "
                     f"{r['over_1GiB']} | {r['seconds']} |")
    for r in rows:
        for ex in r["examples"]:
            lines.append(f"\n- {r['harness']}: `{ex}`")
    lines.append("\nNot yet covered: GraphDef and TensorProto decoders, the TFLite importer (they do not exist yet), "
                 "fault injection and load scenarios of the cloud runtime.\n")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return 0 if all(r["crashes"] == 0 and r["hangs"] == 0 and r["over_1GiB"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
