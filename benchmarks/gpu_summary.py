"""Print the GPU check's summary table from the JSON files in a folder (benchmarks/gpu_check.sh)."""
from __future__ import annotations

import json
import os
import sys


def _load(folder, name):
    try:
        with open(os.path.join(folder, name)) as f:
            return json.loads(f.read())
    except Exception as e:  # a step that timed out or crashed leaves no JSON: say so in the table
        return {"error": f"{type(e).__name__}: {e}"[:120]}


def main(folder: str) -> int:
    rows = []
    tr = _load(folder, "gpu_train.json")
    for key in ("mlp_b128", "mlp_b4096", "cnn_b64", "cnn_b512", "mobilenet_v2_96_b32"):
        r = tr.get(key) or {}
        ms = r.get("ms", {})
        rows.append((key, f"{ms.get('isthmus_eager')}", f"{ms.get('torch_eager')}",
                     f"{r.get('ratio_eager_vs_torch_eager', r.get('ratio_vs_torch_eager'))}",
                     f"capture {ms.get('isthmus_capture')} vs graph {ms.get('torch_cuda_graph')}" if key.startswith("mlp")
                     else f"default Session {ms.get('isthmus_default')}", f"same_as_cpu={r.get('same_as_cpu')}"))
    mm = _load(folder, "gpu_matmul.json")
    rows.append(("matmul 8192^3", str(mm.get("tflops", {}).get("isthmus")), str(mm.get("tflops", {}).get("cupy")),
                 str(mm.get("ratio_of_cupy")), "TFLOP/s", ""))
    tf = _load(folder, "gpu_transfer.json")
    gb = tf.get("GB_per_s", {})
    rows.append(("256MiB up (pinned feed)", str(gb.get("isthmus_up_pinned_feed")), str(gb.get("cupy_up_pinned")),
                 str(tf.get("ratio_up_pinned")), "GB/s", ""))
    rows.append(("256MiB up (pageable)", str(gb.get("isthmus_up_pageable_feed")), str(gb.get("cupy_up_pinned")),
                 str(tf.get("ratio_up_pageable")), "GB/s", ""))
    rows.append(("256MiB down", str(gb.get("isthmus_down")), str(gb.get("cupy_down_pinned")),
                 str(tf.get("ratio_down")), "GB/s", ""))
    ad = _load(folder, "gpu_adds.json").get("us_per_op", {})
    rows.append(("1000 adds us/op", str(ad.get("isthmus_eager")), str(ad.get("cupy_eager")), "",
                 f"torch {ad.get('torch_eager')} graph {ad.get('cupy_cuda_graph')} capture {ad.get('isthmus_capture')}", ""))
    dp = _load(folder, "gpu_data_parallel.json")
    for b in (128, 4096):
        r = dp.get(f"mlp_b{b}") or {}
        ms = r.get("ms", {})
        many = {k: v for k, v in ms.items() if k.startswith("data_parallel_") and k != "data_parallel_1gpu"}
        rows.append((f"DataParallel 1 GPU b{b}", f"{ms.get('data_parallel_1gpu')}", f"{ms.get('session_gpu0')}",
                     f"{r.get('ratio_1gpu_vs_session')}", f"ms vs a plain Session; {dp.get('communicator_1gpu')} "
                     + " ".join(f"{k[14:]} {v}" for k, v in many.items()),
                     f"loss_matches={r.get('first_loss_matches_1gpu')}"))
    print(f"{'workload':26} {'isthmus':>10} {'peer':>10} {'ratio':>7}  notes")
    for r in rows:
        print(f"{r[0]:26} {r[1]:>10} {r[2]:>10} {r[3]:>7}  {r[4]} {r[5]}")
    for name in ("gpu_train.json", "gpu_matmul.json", "gpu_transfer.json", "gpu_adds.json", "gpu_data_parallel.json"):
        d = _load(folder, name)
        errs = {k: v for k, v in d.items() if "error" in k}
        if errs:
            print(name, "errors:", json.dumps(errs)[:600])
    for log, what in (("pytest_gpu.log", "pytest -m gpu"), ("pytest_ops_on_gpu.log", "op suites, ISTHMUS_DEVICE=gpu")):
        try:
            with open(os.path.join(folder, log)) as f:
                lines = f.read().strip().splitlines()
        except OSError:
            print(f"{what}: no log")
            continue
        tally = [ln for ln in lines if (" passed" in ln or " failed" in ln or " error" in ln) and " in " in ln]
        print(f"{what}:", (tally or lines or ["(empty)"])[-1])
        failures = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
        for ln in failures[:25]:
            print("  ", ln[:240])
        if len(failures) > 25:
            print(f"   ... {len(failures) - 25} more")
    return 0


def record(folder: str, results_dir: str) -> None:
    """Store the GPU check's JSON as benchmarks/results records (report.py renders them), and its
    targets table as gpu_check.md (report.py appends it to the page)."""
    with open(os.path.join(results_dir, "gpu_check.md"), "w") as f:
        f.write(targets_table(folder))
    import time
    setup = ""
    try:
        with open(os.path.join(folder, "check.log")) as f:
            setup = f.read()
    except OSError:
        pass
    gpu_line = next((ln for ln in setup.splitlines() if ln.startswith("GPU 0")), "GPU ?")
    tree = next((ln.split()[-1] for ln in setup.splitlines() if ln.startswith("==")), "?")
    words = next((ln.split() for ln in setup.splitlines() if ln.startswith("isthmus ")), [])
    numpy_v = words[words.index("numpy") + 1] if "numpy" in words else "?"
    torch_v = next((ln.split()[1] for ln in setup.splitlines() if ln.startswith("torch ")), "-")
    for name in ("gpu_train", "gpu_matmul", "gpu_transfer", "gpu_adds", "gpu_data_parallel"):
        d = _load(folder, name + ".json")
        ok = "error" not in d or len(d) > 1
        dev = d.get("device", {}) if isinstance(d.get("device"), dict) else {}
        rec = {"name": name, "status": "ok" if ok else "failed", "result": d if ok else None,
               "stderr": "" if ok else d.get("error", ""), "when": dev.get("date", time.strftime("%Y-%m-%d %H:%M UTC")),
               "seconds": d.get("wall_s", 0), "load_before": 0.0,
               "machine": {"cpu": gpu_line.split("(UUID")[0].strip(), "cpus": 16, "python": "3.12",
                           "numpy": numpy_v, "torch": torch_v, "commit": tree}}
        with open(os.path.join(results_dir, name + ".json"), "w") as f:
            json.dump(rec, f, indent=1)


def _row(name, target, mine, peer, ratio, ok, unit):
    fmt = lambda v: "-" if v is None else (f"{v:g}" if isinstance(v, (int, float)) else str(v))
    return f"| {name} | {target} | {fmt(mine)} {unit} | {fmt(peer)} {unit} | {fmt(ratio)} | {ok} |"


def targets_table(folder: str) -> str:
    """Markdown: each issue-19 target against what the GPU check measured."""
    tr, mm = _load(folder, "gpu_train.json"), _load(folder, "gpu_matmul.json")
    tf, ad = _load(folder, "gpu_transfer.json"), _load(folder, "gpu_adds.json")
    dev = tr.get("device", {}) if isinstance(tr.get("device"), dict) else {}

    def ms(key, k):
        return (tr.get(key) or {}).get("ms", {}).get(k)

    def check(r, limit, le=True):
        return "?" if r is None else ("met" if (r <= limit if le else r >= limit) else "**missed**")
    rows = []
    for key, label in (("mlp_b128", "MLP 784-512-512-10 SGD b128"), ("mlp_b4096", "MLP b4096")):
        a, b = ms(key, "isthmus_eager"), ms(key, "torch_eager")
        r = None if None in (a, b) else round(a / b, 3)
        rows.append(_row(label + ", eager vs torch eager", "<= 1.2x", a, b, r, check(r, 1.2), "ms"))
        if key == "mlp_b128":
            a, b = ms(key, "isthmus_capture"), ms(key, "torch_cuda_graph")
            r = None if None in (a, b) else round(a / b, 3)
            rows.append(_row(label + ", step capture vs torch CUDA graph", "<= 2x", a, b, r, check(r, 2.0), "ms"))
    for key, label in (("cnn_b64", "CNN b64"), ("cnn_b512", "CNN b512"), ("mobilenet_v2_96_b32", "MobileNetV2 96x96 b32")):
        # the default Session (capture="auto", when the run has it) and capture=False
        for mode, what in (("isthmus_default", "default Session"), ("isthmus_eager", "capture=False")):
            a, b = ms(key, mode), ms(key, "torch_eager")
            if a is None and mode == "isthmus_default":
                continue  # a run from before capture="auto"
            r = None if None in (a, b) else round(a / b, 3)
            rows.append(_row(f"{label} train step, {what}, vs torch eager", "<= 1.5x", a, b, r, check(r, 1.5), "ms"))
    t = mm.get("tflops", {})
    rows.append(_row("8192^3 fp32 matmul through a Session vs cupy", ">= 0.95", t.get("isthmus"), t.get("cupy"),
                     mm.get("ratio_of_cupy"), check(mm.get("ratio_of_cupy"), 0.95, le=False), "TFLOP/s"))
    g = tf.get("GB_per_s", {})
    for k, r_key, label in (("isthmus_up_pinned_feed", "ratio_up_pinned", "256 MiB up, feed in pinned memory"),
                            ("isthmus_up_pageable_feed", "ratio_up_pageable", "256 MiB up, pageable feed"),
                            ("isthmus_down", "ratio_down", "256 MiB down (fetch)")):
        peer = g.get("cupy_down_pinned") if "down" in k else g.get("cupy_up_pinned")
        rows.append(_row(label + " vs cupy pinned", ">= 0.8", g.get(k), peer, tf.get(r_key),
                         check(tf.get(r_key), 0.8, le=False), "GB/s"))
    u = ad.get("us_per_op", {})
    e, c = u.get("isthmus_eager"), u.get("cupy_eager")
    rows.append(_row("1000 chained adds, eager vs cupy", "<= cupy", e, c, None if None in (e, c) else round(e / c, 3),
                     check(None if None in (e, c) else e / c, 1.0), "us/op"))
    cap = u.get("isthmus_capture")
    rows.append(_row("1000 chained adds, step capture", "<= 2 us/op", cap, u.get("cupy_cuda_graph"), None,
                     check(cap, 2.0), "us/op"))
    head = [f"## GPU check: issue 19's targets", "",
            f"Measured by `benchmarks/gpu_check.sh` on {dev.get('gpu', '?')} (cupy {dev.get('cupy', '?')}, CUDA runtime "
            f"{dev.get('cuda_runtime', '?')}), {dev.get('date', '?')}; isthmus and its peer in the same run. Peer: "
            "PyTorch for the training steps (its CUDA-graph replay for step capture), cupy otherwise; the second "
            "transfer row's peer is cupy pinned as the target says (cupy's own pageable copy: "
            f"{g.get('cupy_up_pageable', '?')} GB/s).", "",
            "| workload | target | isthmus | peer | ratio | |", "|---|---|---|---|---|---|"]
    tests = ["", "Tests on that GPU:"]
    for log, what in (("pytest_gpu.log", "`pytest -m gpu` (tests/core/test_gpu*.py)"),
                      ("pytest_ops_on_gpu.log", "the op suites with every Session on the GPU (`ISTHMUS_DEVICE=gpu`)")):
        try:
            with open(os.path.join(folder, log)) as f:
                lines = f.read().strip().splitlines()
        except OSError:
            tests.append(f"- {what}: no log")
            continue
        tally = [ln for ln in lines if (" passed" in ln or " failed" in ln) and " in " in ln]
        tests.append(f"- {what}: {(tally or ['no tally (timed out?)'])[-1].strip('= ')}")
        tests += [f"  - {ln.split(' - ')[0]}" for ln in lines if ln.startswith(("FAILED", "ERROR"))][:20]
    return "\n".join(head + rows + tests) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[2] == "--record":
        record(sys.argv[1], sys.argv[3])
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "gpu_out"))
