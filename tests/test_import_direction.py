"""DESIGN.md's import arrows, checked by reading the imports (STYLE.md habit 13)."""
import ast
import pathlib
import os
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ALLOWED = {  # folder -> isthmus folders it may import
    "jit": set(),  # compiled loop kernels: a leaf that core and edge may both use
    "core": {"jit"},
    "partitioner": {"core"},
    "proto": set(),
    "cloud": {"core", "partitioner", "proto"},
    "edge": {"proto", "jit"},
    "converters": {"core", "partitioner", "proto", "edge"},
}
ALLOWED_MODULES = {  # folder -> single modules of other folders it may import (DESIGN.md: "edge (its capability table only)")
    "partitioner": {"isthmus.edge.capabilities"},
}
FORBIDDEN_THIRD_PARTY = {
    "jit": {"onnx", "onnxruntime", "grpc", "flatbuffers", "torch"},
    "core": {"onnx", "onnxruntime", "grpc", "flatbuffers", "torch"},
    "edge": {"onnx", "torch"},  # grpc only lazily (offload client), onnxruntime only lazily (delegate)
    "partitioner": {"onnx", "onnxruntime", "grpc", "torch"},
}


def _imports(path: pathlib.Path, folder: str):
    tree = ast.parse(path.read_text(), str(path))
    pkg_parts = ["isthmus"] + list(path.relative_to(ROOT).parent.parts)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - node.level + 1]
                yield ".".join(base + ([node.module] if node.module else []))
            else:
                yield node.module or ""


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_import_arrows(folder):
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for mod in _imports(path, folder):
            parts = mod.split(".")
            if parts[0] == "isthmus" and len(parts) > 1 and parts[1] in ALLOWED and parts[1] != folder:
                if parts[1] not in ALLOWED[folder] and mod not in ALLOWED_MODULES.get(folder, ()):
                    bad.append(f"{path.relative_to(ROOT)} imports {mod}")
            if parts[0] in FORBIDDEN_THIRD_PARTY.get(folder, ()):
                bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not bad, "imports against DESIGN.md's direction:\n" + "\n".join(bad)


def test_import_isthmus_is_lazy():
    code = ("import sys, isthmus; "
            "heavy = [m for m in ('onnx', 'grpc', 'onnxruntime', 'isthmus.edge', 'isthmus.core', 'flatbuffers', 'numba') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_no_pickle_or_eval_in_the_package():
    offenders = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", "benchmarks", "build") or ".venv" in rel.parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in ("eval",) or (isinstance(f, ast.Attribute) and name in ("load", "loads")
                                         and isinstance(f.value, ast.Name) and f.value.id == "pickle"):
                    offenders.append(f"{rel}:{node.lineno}")
                for kw in node.keywords:
                    if kw.arg == "allow_pickle" and isinstance(kw.value, ast.Constant) and kw.value.value:
                        offenders.append(f"{rel}:{node.lineno} allow_pickle=True")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(m.split(".")[0] in ("pickle", "cPickle", "dill", "cloudpickle") for m in mods):
                    offenders.append(f"{rel}:{node.lineno} imports pickle")
    assert not offenders, offenders


def test_blas_threads_env_is_applied_at_import():
    # ISTHMUS_BLAS_THREADS=1 limits every loaded BLAS at `import isthmus`; set_blas_threads changes it
    code = ("import isthmus\n"
            "from threadpoolctl import threadpool_info\n"
            "print(sorted({i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas'}), isthmus.blas_threads())\n"
            "isthmus.set_blas_threads(2)\n"
            "print(isthmus.blas_threads())\n")
    env = dict(os.environ, ISTHMUS_BLAS_THREADS="1", OPENBLAS_NUM_THREADS="2", OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[1] 1", "2"]
    env["ISTHMUS_BLAS_THREADS"] = "many"
    out = subprocess.run([sys.executable, "-c", "import isthmus"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0 and "ISTHMUS_BLAS_THREADS" in out.stderr and "many" in out.stderr
