"""No code path of the package can execute loaded data: a scan of every module's syntax tree.

Refused anywhere in the package: importing pickle, marshal, shelve, dill or cloudpickle;
calling eval/exec/compile/__import__ (one allowed use: the executor compiles the Python
source of a plan it generated itself from a verified graph); np.load without
allow_pickle=False; yaml.load. The scan is checked against a planted offender, so a scan
that silently matched nothing would fail.
"""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_DIRS = ["core", "partitioner", "edge", "cloud", "converters", "proto"]
FORBIDDEN_MODULES = {"pickle", "marshal", "shelve", "dill", "cloudpickle", "_pickle"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
# (file, call): the executor exec()s plan source it wrote itself (core/executor.py Plan)
ALLOWED = {("core/executor.py", "compile"), ("core/executor.py", "exec")}


def _package_files():
    files = [f for f in os.listdir(ROOT) if f.endswith(".py")]
    for d in PACKAGE_DIRS:
        for dirpath, _, names in os.walk(os.path.join(ROOT, d)):
            files += [os.path.relpath(os.path.join(dirpath, n), ROOT) for n in names if n.endswith(".py")]
    return sorted(files)


def offences(source: str, rel: str):
    found = []
    for node in ast.walk(ast.parse(source, rel)):
        if isinstance(node, ast.Import):
            found += [f"{rel}:{node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
            found.append(f"{rel}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in FORBIDDEN_CALLS and (rel, f.id) not in ALLOWED:
                found.append(f"{rel}:{node.lineno}: {f.id}()")
            elif isinstance(f, ast.Attribute) and f.attr == "load":
                owner = f.value.id if isinstance(f.value, ast.Name) else ""
                if owner in ("np", "numpy"):
                    safe = any(k.arg == "allow_pickle" and isinstance(k.value, ast.Constant) and k.value.value is False
                               for k in node.keywords)
                    if not safe:
                        found.append(f"{rel}:{node.lineno}: np.load without allow_pickle=False")
                elif owner == "yaml":
                    found.append(f"{rel}:{node.lineno}: yaml.load")
    return found


def test_package_never_unpickles_or_evals():
    files = _package_files()
    assert "core/executor.py" in files and "edge/loader.py" in files and len(files) > 50
    bad = []
    for rel in files:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            bad += offences(f.read(), rel)
    assert not bad, "code that could execute loaded data:\n" + "\n".join(bad)


def test_the_scan_catches_offenders():
    planted = ("import pickle\nfrom marshal import loads\nimport numpy as np\n"
               "eval('1')\nnp.load('x.npy')\nnp.load('y.npy', allow_pickle=False)\n__import__('os')\n")
    found = offences(planted, "edge/planted.py")
    assert [f.split(": ", 1)[1] for f in found] == [
        "import pickle", "from marshal import ...", "eval()", "np.load without allow_pickle=False", "__import__()"]
    assert offences("exec('1')\n", "core/executor.py") == []
    assert offences("exec('1')\n", "core/graph.py") == ["core/graph.py:1: exec()"]


def test_onnx_external_data_outside_the_model_directory_is_refused(tmp_path):
    """A model whose weights point outside its own folder ('../secret.bin') is refused, naming the tensor."""
    import numpy as np
    import onnx
    import pytest
    from onnx import TensorProto, helper, numpy_helper

    from isthmus.converters.onnx_import import from_onnx
    (tmp_path / "secret.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    w = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    for k, v in (("location", "../secret.bin"), ("offset", "0"), ("length", "16")):
        e = w.external_data.add()
        e.key, e.value = k, v
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])
    m = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w]))
    (tmp_path / "sub").mkdir()
    onnx.save(m, str(tmp_path / "sub" / "m.onnx"))
    with pytest.raises(Exception, match="'w'.*points outside"):
        from_onnx(str(tmp_path / "sub" / "m.onnx"))
