"""Every command line shown in README.md and docs/ runs (issue 22 item 6), not only parses: each code
block's lines in order, in a folder of their own holding the files they name (a CNN, 100 images, a
split of it, a graph file, a checkpoint, TLS files); `serve`/`server` lines start in the background on
a free port and stop when their block ends. What cannot run here is listed in EXCLUDED with its reason,
and a test keeps that list (and ADDED) free of lines the docs no longer show."""
import contextlib
import io
import json
import os
import queue
import re
import shutil
import socket
import subprocess
import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from isthmus.apps import cli

from .cli_models import ISTHMUS, cnn_onnx, images
from .test_docs import ROOT, TEXTS

# documented lines that cannot run here, and why
EXCLUDED = {
    'python -m pip install -e ".[examples]"': "installs the package: CI's setup step (.ci/run) does that",
    'python -m pip install -e ".[test]"': "installs the package: CI's setup step (.ci/run) does that",
    "python -m pytest": "the whole suite, this test included (.ci/run runs it)",
    "isthmus demo": "trains for minutes; tests/test_examples.py::test_main_demo_quick_run_end_to_end runs it "
                    "with small flags",
    "docker build -f deploy/Dockerfile -t isthmus:0.1.0 .": "needs a Docker daemon (none in CI); "
                                                             "tests/test_cli_deploy.py checks the Dockerfile",
    "kubectl create secret generic isthmus-tls --from-file=tls.crt --from-file=tls.key --from-file=ca.crt":
        "needs a Kubernetes cluster; tests/test_cli_deploy.py checks the manifests against `isthmus server`",
    "kubectl create secret generic isthmus-token --from-file=token": "needs a Kubernetes cluster",
    "isthmus profile --device gpu": "needs an NVIDIA GPU and cupy (tests marked gpu run it where there is one)",
    "isthmus serve MODEL.cloud --device gpu": "needs an NVIDIA GPU and cupy",
    "isthmus server --device gpu": "needs an NVIDIA GPU and cupy",
}
# flags added to documented lines that only make them quicker or steadier here: (command, added when this
# flag is on the line (None: always), flags, why)
ADDED = [("profile", None, ["--quick", "--ops", "MatMul"],
          "a full profile times every op at every size: about 3 minutes here"),
         ("edge-run", "--cloud", ["--deadline-ms", "60000"],
          "a loaded CI machine may answer the first call after the default 1 s deadline; the line then runs "
          "locally, and --require-cloud fails it; a cold server compiles its kernels on that call (with two test "
          "workers compiling too, 20 s was once not enough)")]
# the value a `...` or a user's own path stands for after these flags (the docs' /etc/isthmus/*, C, K, T)
FLAG_FILES = {"--tls-cert": "tls/server.pem", "--tls-key": "tls/server.key", "--tls-ca": "tls/ca.pem",
              "--tls-client-ca": "tls/ca.pem", "--token-file": "tls/token.txt"}
OUTPUT_FLAGS = ("-o", "--out", "--output", "--save")
SERVERS = ("serve", "server")


def shell_blocks(text: str):
    """[lines] for each shell code block (bash, sh, console or unmarked), then [line] for each inline
    `isthmus ...` span: `$ ` prompts, comments and `\\` continuations dropped, `a && b` as two lines, a
    line that starts with a flag (the docs' "also add this") as the line above plus that flag."""
    out = []
    for lang, block in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S):
        if lang not in ("bash", "sh", "console", ""):
            continue
        lines = []
        for raw in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s+)#.*$", "", raw.strip()).removeprefix("$ ").strip()
            if line.startswith("-") and lines:
                line = lines[-1].rstrip("& ") + " " + line
            lines += [" ".join(part.split()) for part in line.split("&&") if part.strip()]
        if lines:
            out.append(lines)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    out += [[" ".join(m.split())] for m in re.findall(r"`(isthmus [a-z][a-z-]*(?: [^`]*)?)`", prose)]
    return out


def documented():
    """(page, [lines]) for every block of every page, each distinct block once."""
    seen, out = set(), []
    for path in TEXTS:
        for lines in shell_blocks(open(os.path.join(ROOT, path), encoding="utf-8").read()):
            if tuple(lines) not in seen:
                seen.add(tuple(lines))
                out.append((path, lines))
    return out


def _name_only(line: str) -> bool:
    """`isthmus split` in prose names the command; it is a command line only if it parses alone."""
    import argparse
    import importlib
    words = line.split()
    if len(words) != 2 or cli.ALIASES.get(words[1], words[1]) not in cli.COMMANDS:
        return False
    p = argparse.ArgumentParser(exit_on_error=False)
    importlib.import_module(cli.COMMANDS[cli.ALIASES.get(words[1], words[1])][0]).add_arguments(p)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse prints its usage before it exits
            p.parse_args([])
    except (argparse.ArgumentError, SystemExit):
        return True
    return False


def argv_of(line: str, port: int) -> list:
    """A documented line as the argv it runs as: [optional] parts kept, the first of a|b, placeholders
    and `...` filled with this test's files, port 7070 (or P, PORT) as `port`."""
    line = line.replace("\\|", "|").replace("[", " ").replace("]", " ").rstrip("&").strip()
    values = {"P": str(port), "PORT": str(port), "7070": str(port), "N": "1", "NAME": "x", "SPEC": "cluster.json",
              "CKPT": "ckpt", "DIR": "out", "FILE": "m.isth", "MODEL": "m.onnx"}
    argv = []
    for tok in line.split()[1:]:
        tok = tok.split("|")[0]
        if argv and argv[-1] in FLAG_FILES:
            argv.append(FLAG_FILES[argv[-1]])
            continue
        if tok in ("...", "…"):
            continue
        tok = re.sub(r"^NAME=", "image=", tok)
        tok = re.sub(r"^(127\.0\.0\.1|localhost|HOST):(7070|PORT|P)$", lambda m: f"{m.group(1)}:{port}", tok)
        argv.append(values.get(tok, tok).replace("HOST:", "127.0.0.1:"))
    return argv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Background:
    """A server started as a subprocess; ready once it prints its address; stopped at the end."""

    def __init__(self, argv, cwd, env, timeout=90):
        self.proc = subprocess.Popen([*ISTHMUS, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: "queue.Queue[str]" = queue.Queue()
        self.seen = []
        threading.Thread(target=self._drain, daemon=True).start()
        while True:  # bounded: each get waits at most `timeout`, and the process's end puts ''
            line = self.lines.get(timeout=timeout)
            self.seen.append(line)
            if line.startswith("ISTHMUS_OFFLOAD ") or "listening on port" in line or not line:
                break
        self.ready = bool(line)

    def _drain(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)


def _qdq(src, dst) -> None:
    """model.qdq.onnx: the CNN quantized by onnxruntime's quantize_static in QDQ form (docs/converters.md)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"image": images(1, seed=s)} for s in range(8)])

        def get_next(self):
            return next(self.feeds, None)
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """The files the docs name, made once: a CNN (ONNX, graph file + checkpoint, .tflite, edge file), its
    calibration images, an input, the split the docs' walk-through makes, TLS files and a token."""
    from isthmus.core.checkpoint import Saver

    from .tls_certs import make_certs
    fx = tmp_path_factory.mktemp("docs_fixtures")
    cnn_onnx(str(fx / "cnn.onnx"))
    for name in ("model.onnx", "m.onnx", "MODEL.onnx"):
        shutil.copy(fx / "cnn.onnx", fx / name)
    np.savez(fx / "calib.npz", image=images(100))
    np.savez(fx / "data.npz", image=images(20))
    np.save(fx / "x.npy", images(1, seed=5))
    _qdq(fx / "cnn.onnx", fx / "model.qdq.onnx")
    make_certs(fx / "tls")
    here = os.getcwd()
    os.chdir(fx)
    try:
        for argv in (["import", "model.onnx", "-o", "model.graph", "--trainable"],
                     ["export", "model.graph", "--to", "tflite", "-o", "model.tflite"],
                     ["convert", "cnn.onnx", "--to", "edge", "-o", "model.isth"],
                     ["split", "cnn.onnx", "--bandwidth", "5mbps", "--rtt", "10ms", "--edge-profile", "phone",
                      "-o", "deploy"]):
            with threadpool_limits(1, user_api="blas"):
                assert cli.main(argv) == 0, argv
    finally:
        os.chdir(here)
    from isthmus.apps.graph_io import _session, load_graph
    graph, _, _ = load_graph(str(fx / "model.graph"))
    Saver(graph=graph).save(_session(graph, None), str(fx / "ckpt" / "model"))
    shutil.copy(fx / "model.graph", fx / "m.graph")
    for name in ("mobilenet.tflite", "MODEL.tflite"):
        shutil.copy(fx / "model.tflite", fx / name)
    shutil.copy(fx / "deploy" / "model.isth", fx / "m.isth")  # FILE: the edge part of the split
    assert (fx / "deploy" / "model.cloud").exists(), "the docs' split must offload for the walk-through to run"
    for name in ("model.cloud", "MODEL.cloud"):
        shutil.copy(fx / "deploy" / "model.cloud", fx / name)
    return fx


@pytest.fixture(scope="module")
def served(fixtures):
    """The cloud part of the docs' split, served for lines that talk to a server they do not start."""
    server = Background(["serve", "MODEL.cloud", "--port", "0"], fixtures, dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert server.ready, server.seen
    yield int(server.seen[-1].split(":")[-1])
    server.stop()


def _block_dir(tmp: str, fx, argvs) -> None:
    """Fill `tmp` with the fixtures the block's lines name, less what the block itself writes."""
    outputs = {a[i + 1].split("/")[0] for a in argvs for i in range(len(a) - 1) if a[i] in OUTPUT_FLAGS}
    named = {v.split("/")[0] for a in argvs for tok in a for v in (tok, tok.split("=", 1)[-1])}
    for name in sorted(named - outputs):
        src = fx / name
        if src.is_dir():
            shutil.copytree(src, os.path.join(tmp, name))
        elif src.is_file():
            shutil.copy(src, os.path.join(tmp, name))


def _run_block(path, lines, tmp_path, fx, shared_port, capsys, monkeypatch) -> int:
    """Run one block's lines in order; returns how many ran."""
    has_server = any(ln.split()[1:2] and ln.split()[1] in SERVERS for ln in lines if ln.startswith("isthmus "))
    port = _free_port() if has_server else shared_port
    runs = []
    for line in lines:
        if line in EXCLUDED or (line.startswith("isthmus ") and _name_only(line)):
            continue
        assert line.startswith("isthmus "), f"{path}: `{line}` is not an isthmus command: run it or add it to EXCLUDED"
        argv = argv_of(line, port)
        argv += [f for command, on, flags, _ in ADDED if argv[0] == command and (on is None or on in argv) for f in flags]
        runs.append((line, argv))
    _block_dir(str(tmp_path), fx, [a for _, a in runs])
    (tmp_path / "cluster.json").write_text(json.dumps({"worker": [f"127.0.0.1:{port}"]}))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1",
               TF_CONFIG=json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}"]}, "task": {"type": "worker", "index": 0}}))
    monkeypatch.chdir(tmp_path)
    background = []
    try:
        for line, argv in runs:
            if argv[0] in SERVERS:
                for b in background:  # one server per block at a time (the next one may take its port)
                    b.stop()
                background = [Background(argv, tmp_path, env)]
                assert background[0].ready, f"{path}: `{line}` did not start: {''.join(background[0].seen)[-2000:]}"
                continue
            capsys.readouterr()
            with threadpool_limits(1, user_api="blas"):  # as the servers: 2 BLAS threads on 2 busy cores run 10x slower
                code = cli.main(list(argv))
            out, err = capsys.readouterr()
            assert code == 0, f"{path}: `{line}` (run as {argv}) exit {code}: {err[-2000:]}"
            for i, a in enumerate(argv[:-1]):
                if a in OUTPUT_FLAGS:
                    assert os.path.exists(argv[i + 1]), f"{path}: `{line}` did not write {argv[i + 1]}"
    finally:
        for b in background:
            b.stop()
    return len(runs)


BLOCKS = documented()


@pytest.mark.slow
@pytest.mark.parametrize("path,lines", BLOCKS, ids=[f"{p}:{ls[0][:50]}" for p, ls in BLOCKS])
def test_documented_command_lines_run(path, lines, fixtures, served, tmp_path, capsys, monkeypatch):
    _run_block(path, lines, tmp_path, fixtures, served, capsys, monkeypatch)


def test_exclusions_are_current():
    """Every EXCLUDED line is still shown in the docs, and every ADDED entry still applies to one that runs."""
    shown = {ln for _, lines in BLOCKS for ln in lines}
    stale = sorted(set(EXCLUDED) - shown)
    assert not stale, f"EXCLUDED lines the docs no longer show: {stale}"
    runs = [ln for ln in shown if ln.startswith("isthmus ") and ln not in EXCLUDED and not _name_only(ln)]
    for command, on, flags, _ in ADDED:
        assert any(ln.split()[1] == command and (on is None or on in ln.split()) for ln in runs), \
            f"ADDED {command} {flags}: no documented line it applies to"
    assert len(shown) > 40
