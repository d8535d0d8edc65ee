"""Run the benchmarks and write docs/benchmarks.md: the latest tables, with date, machine and versions.

    python benchmarks/report.py                      # every benchmark in BENCHMARKS (tens of minutes)
    python benchmarks/report.py --only mlp rnn       # some; the others keep their last results
    python benchmarks/report.py --from-results       # rewrite the page from benchmarks/results/*.json

Each benchmark runs alone in a subprocess (the machines are noisy: a benchmark run beside other
work can be several times off, so the page records the load average before each run). Its JSON
goes to benchmarks/results/<name>.json; the page is generated from those files, so it always
shows, per benchmark, the numbers of its latest run and when and where they were taken.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")

# name -> (script arguments, what it shows). GPU benchmarks skip themselves without a GPU.
BENCHMARKS: Dict[str, tuple] = {
    "dispatch": (["dispatch.py"], "executor dispatch cost per op vs a numpy loop, onnxruntime, PyTorch eager"),
    "mlp": (["mlp.py"], "MLP train step vs hand-written numpy and PyTorch; inference vs onnxruntime"),
    "cnn": (["cnn.py"], "CNN train step vs PyTorch"),
    "rnn": (["rnn.py"], "RNN on while_loop vs numpy BPTT and PyTorch"),
    "passes": (["passes.py"], "graph passes on MobileNetV2-96"),
    "trace_overhead": (["trace_overhead.py"], "step tracing off/on cost"),
    "edge": (["edge.py"], "edge interpreter fp32/int8/delegate vs onnxruntime"),
    "quantize": (["quantize.py"], "int8 accuracy and file size"),
    "partitioner_placement": (["partitioner_placement.py"], "placement speed"),
    "partitioner_optimality": (["partitioner_optimality.py", "--cases", "500"], "mincut vs exhaustive"),
    "partitioner_cnn": (["partitioner_cnn.py"], "split benefit over a bandwidth sweep"),
    "partitioner_accuracy": (["partitioner_accuracy.py"], "predicted vs measured part latency"),
    "cloud_transfer": (["cloud_transfer.py"], "tensor transfer vs raw gRPC"),
    "gpu_matmul": (["gpu_matmul.py"], "GPU: 8192^3 float32 matmul through a Session vs cupy (skips without a GPU)"),
    "gpu_train": (["gpu_train.py"], "GPU training steps (MLP, CNN, MobileNetV2) vs PyTorch and cupy by hand (skips without a GPU)"),
    "gpu_transfer": (["gpu_transfer.py"], "GPU: 256 MiB host<->device through copy nodes vs cupy pinned (skips without a GPU)"),
    "gpu_adds": (["gpu_adds.py"], "GPU: 1000 chained adds, us per op, eager and captured (skips without a GPU)"),
}
OPTIONAL = ["cloud_null_step", "cloud_backup_workers", "offload_fallback", "converters_infer",
            "converters_import_time", "split_latency", "offload_overhead", "mobilenet_train", "tflite_export"]   # included when their scripts exist
BENCHMARKS["offload_load"] = (["offload_load.py", "--clients", "64", "--requests", "200"],
                              "offload service: 64 clients x 200 requests, batched vs unbatched")


def _scripts() -> Dict[str, tuple]:
    out = dict(BENCHMARKS)
    for name in OPTIONAL:
        if os.path.exists(os.path.join(HERE, name + ".py")):
            out[name] = ([name + ".py"], "")
    return out


def last_json(text: str) -> Optional[dict]:
    """The last JSON object printed (benchmarks print one, possibly indented, or one per line)."""
    dec = json.JSONDecoder()
    found = None
    i = 0
    while True:
        i = text.find("{", i)
        if i < 0:
            return found
        if i == 0 or text[i - 1] == "\n":
            try:
                obj, end = dec.raw_decode(text, i)
                if isinstance(obj, dict):
                    found = obj
                i = end
                continue
            except ValueError:
                pass
        i += 1


def run_one(name: str, args: List[str], timeout: float) -> dict:
    load = os.getloadavg()[0]
    t0 = time.time()
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
        out = subprocess.run([sys.executable, *args], cwd=HERE, capture_output=True, text=True, timeout=timeout,
                             env=env)  # measured without this workplace's OpenBLAS pins (NOTES.md)
        result = last_json(out.stdout)
        status = "ok" if out.returncode == 0 and result is not None else f"exit {out.returncode}"
        err = out.stderr[-500:] if status != "ok" else ""
    except subprocess.TimeoutExpired:
        result, status, err = None, f"timed out after {timeout:.0f} s", ""
    return {"name": name, "status": status, "result": result, "stderr": err,
            "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime(t0)) + " UTC",
            "seconds": round(time.time() - t0, 1), "load_before": round(load, 2), "machine": machine()}


def machine() -> dict:
    info = {"python": platform.python_version(), "cpus": os.cpu_count(), "arch": platform.machine()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    for mod in ("numpy", "onnxruntime", "onnx", "grpc", "torch"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001  (absent or broken: not listed)
            pass
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                        text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


def flatten(obj, prefix: str = "") -> List[tuple]:
    rows = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("machine", "benchmark"):
                continue
            rows += flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list) and obj and all(isinstance(v, dict) for v in obj):
        for i, v in enumerate(obj):
            rows += flatten(v, f"{prefix}[{i}]")
    else:
        text = json.dumps(obj) if not isinstance(obj, str) else obj
        rows.append((prefix, text if len(text) <= 160 else text[:157] + "..."))
    return rows


def render(records: List[dict]) -> str:
    lines = ["# Benchmarks", "",
             "Generated by `python benchmarks/report.py` from `benchmarks/results/*.json`: each benchmark's latest",
             "run, with when and where it ran. Ratios are isthmus over its peer measured in the same run (lower",
             "is better for times); `target` keys are the issues' targets. A load average well above 0 before a",
             "run means other work shared the machine: read those numbers as upper bounds.", ""]
    for r in records:
        m = r.get("machine", {})
        lines += [f"## {r['name']}", "",
                  f"{BENCHMARKS.get(r['name'], ('', ''))[1] or ''}".strip(),
                  "",
                  f"Run {r['when']} ({r['seconds']} s, load average before {r['load_before']}) on "
                  f"{m.get('cpu', '?')} x{m.get('cpus', '?')}; Python {m.get('python')}, numpy {m.get('numpy')}, "
                  f"onnxruntime {m.get('onnxruntime', '-')}, torch {m.get('torch', '-')}; commit {m.get('commit', '?')}.",
                  ""]
        if r["status"] != "ok" or r["result"] is None:
            lines += [f"**{r['status']}**", "", "```", (r.get("stderr") or "").strip()[-400:], "```", ""]
            continue
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v.replace('|', '/')} |" for k, v in flatten(r["result"])]
        lines.append("")
    return "\n".join(lines).replace("\n\n\n", "\n\n")


def load_results() -> List[dict]:
    records = []
    if os.path.isdir(RESULTS):
        for f in sorted(os.listdir(RESULTS)):
            if f.endswith(".json"):
                with open(os.path.join(RESULTS, f), encoding="utf-8") as fh:
                    rec = json.load(fh)
                if not isinstance(rec, dict) or "name" not in rec:  # a script's own file, not a run record
                    print(f"report.py: {f} is not a run record (no 'name'); left out of the page", file=sys.stderr)
                    continue
                records.append(rec)
    order = list(_scripts())
    return sorted(records, key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="run just these benchmarks")
    p.add_argument("--from-results", action="store_true", help="do not run anything; rewrite the page")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per benchmark (default %(default)s)")
    p.add_argument("--page", default=PAGE)
    args = p.parse_args(argv)
    scripts = _scripts()
    unknown = [n for n in args.only or [] if n not in scripts]
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; known: {sorted(scripts)}")
    if not args.from_results:
        os.makedirs(RESULTS, exist_ok=True)
        names = args.only or list(scripts)
        for i, name in enumerate(names, 1):
            print(f"[{i}/{len(names)}] {name} ...", file=sys.stderr, flush=True)
            rec = run_one(name, scripts[name][0], args.timeout)
            print(f"    {rec['status']} in {rec['seconds']} s", file=sys.stderr, flush=True)
            with open(os.path.join(RESULTS, name + ".json"), "w", encoding="utf-8") as f:
                json.dump(rec, f, indent=1)
    page = render(load_results())
    summary = os.path.join(RESULTS, "gpu_check.md")  # the GPU check's targets vs measured (gpu_summary.py)
    if os.path.exists(summary):
        with open(summary, encoding="utf-8") as f:
            page = page.rstrip("\n") + "\n\n" + f.read()
    with open(args.page, "w", encoding="utf-8") as f:
        f.write(page)
    print(f"wrote {args.page}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
