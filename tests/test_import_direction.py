"""DESIGN.md's import arrows, checked by reading the imports (STYLE.md habit 13), and no private name used across folders."""
import ast
import pathlib
import os
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ALLOWED = {  # folder -> isthmus folders it may import
    "jit": set(),  # compiled loop kernels: a leaf that core and edge may both use
    "proto": set(),  # schemas, generated code, regeneration scripts
    "wire": {"proto"},  # what edge and cloud share: a leaf above proto
    "core": {"jit"},
    "partitioner": {"core", "wire"},
    "cloud": {"core", "partitioner", "proto", "wire"},
    "edge": {"proto", "jit", "wire"},
    "converters": {"core", "partitioner", "proto", "edge", "wire"},
    "apps": {"jit", "proto", "wire", "core", "partitioner", "cloud", "edge", "converters"},  # the top: nothing imports it
}
ALLOWED_MODULES = {  # folder -> single modules of other folders it may import (DESIGN.md: "edge (its capability table only)")
    "partitioner": {"isthmus.edge.capabilities"},
}
FORBIDDEN_THIRD_PARTY = {
    "jit": {"onnx", "onnxruntime", "grpc", "flatbuffers", "torch"},
    "core": {"onnx", "onnxruntime", "grpc", "flatbuffers", "torch"},
    "edge": {"onnx", "torch"},  # grpc only lazily (offload client), onnxruntime only lazily (delegate)
    "partitioner": {"onnx", "onnxruntime", "grpc", "torch"},
    "wire": {"onnx", "onnxruntime", "flatbuffers", "torch", "scipy", "numba"},  # grpc only inside functions
}
_IMPORT_BY_NAME = {"import_module", "__import__"}
# imports by name that cross the arrows on purpose, each with its reason (nothing else may)
KNOWN_BY_NAME: set = set()  # (core's Session finds the cloud runtime through register_remote_session)


_TREES: dict = {}  # (path, mtime, size) -> its parsed tree: every check reads the same ~300 files


@pytest.fixture(autouse=True, scope="module")
def _forget_trees():
    """The parsed package (about 120 MB of trees) lives as long as this module's tests."""
    yield
    _TREES.clear()


def _tree(path: pathlib.Path, text=None):
    """`path` parsed once for all the checks here (the probes' given text is parsed as given)."""
    if text is not None:
        return ast.parse(text, str(path))
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    tree = _TREES.get(key)
    if tree is None:
        tree = _TREES[key] = ast.parse(path.read_text(), str(path))
    return tree


def _imports(path: pathlib.Path, folder: str = ""):
    """Every module `path` imports: import statements, and import_module("isthmus...") /
    __import__ calls whose name is a string constant (an f-string's constant head counts)."""
    yield from _imports_in(_tree(path),
                           ["isthmus"] + list(path.relative_to(ROOT).parent.parts))


def _imports_in(tree, pkg_parts):
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
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in _IMPORT_BY_NAME:
                yield from _module_names(node.args[0])


def _module_names(arg):
    """The module names a call's first argument may hold (a string, or an f-string's head)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        yield arg.value
    elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        yield str(arg.values[0].value)


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_import_arrows(folder):
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for mod in _imports(path, folder):
            parts = mod.split(".")
            if parts[0] == "isthmus" and len(parts) > 1 and parts[1] in ALLOWED and parts[1] != folder:
                if (parts[1] not in ALLOWED[folder] and mod not in ALLOWED_MODULES.get(folder, ())
                        and (path.relative_to(ROOT).as_posix(), mod) not in KNOWN_BY_NAME):
                    bad.append(f"{path.relative_to(ROOT)} imports {mod}")
            if parts[0] in FORBIDDEN_THIRD_PARTY.get(folder, ()):
                bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not bad, "imports against DESIGN.md's direction:\n" + "\n".join(bad)


def _module_strings(path: pathlib.Path):
    """String constants in `path` that name an isthmus module ("isthmus.<folder>..."), e.g. a table
    of command modules handed to import_module later."""
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts = node.value.split(".")
            if len(parts) > 1 and parts[0] == "isthmus" and parts[1] in ALLOWED and " " not in node.value:
                yield node.value


@pytest.mark.parametrize("folder", sorted(set(ALLOWED) - {"apps"}))
def test_no_import_by_name_around_the_layering(folder):
    # a module name in a string is an import the arrows above cannot see unless it is checked too
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for mod in _module_strings(path):
            target = mod.split(".")[1]
            if target != folder and target not in ALLOWED[folder] and (path.relative_to(ROOT).as_posix(), mod) not in KNOWN_BY_NAME:
                bad.append(f"{path.relative_to(ROOT)} names {mod}")
    assert not bad, "modules named against DESIGN.md's direction:\n" + "\n".join(bad)


def _private_names_from_other_folders(path: pathlib.Path, folder: str, text=None):
    """`from isthmus.<other folder>.m import _name`, and `m._name` where m was imported from another
    folder: a private name used across folders (give it a public name where it lives)."""
    tree = _tree(path, text)
    pkg = ["isthmus"] + list(path.relative_to(ROOT).parent.parts)
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = (pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else [])) if node.level \
                else (node.module or "").split(".")
            mod = ".".join(mod).split(".")
            if mod[0] != "isthmus" or len(mod) < 2 or mod[1] == folder:
                continue
            for a in node.names:
                is_module = (ROOT.joinpath(*mod[1:], a.name + ".py").is_file()
                             or ROOT.joinpath(*mod[1:], a.name).is_dir())
                if a.name.startswith("_") and not a.name.startswith("__") and not is_module:
                    yield f"{path.relative_to(ROOT)}:{node.lineno} imports {'.'.join(mod)}.{a.name}"
                bound[a.asname or a.name] = mod + [a.name]
        elif isinstance(node, ast.Import):
            for a in node.names:
                mod = a.name.split(".")
                if a.asname and mod[0] == "isthmus" and len(mod) > 1 and mod[1] != folder:
                    bound[a.asname] = mod
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            yield f"{path.relative_to(ROOT)}:{node.lineno} uses {'.'.join(bound[node.value.id])}.{node.attr}"


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_no_private_names_across_folders(folder):
    bad = [b for path in sorted((ROOT / folder).rglob("*.py")) for b in _private_names_from_other_folders(path, folder)]
    assert not bad, "private names used across folders:\n" + "\n".join(bad)


def test_the_private_name_check_sees_both_forms():
    probe = ROOT / "converters" / "_probe_private.py"  # never written: the checker reads the text given
    text = ("from isthmus.core.ops.array import _squeeze_axes, reshape\nfrom ..core.ops import array\n"
            "from isthmus.partitioner import calibrate as cal\nx = cal._placeholder\ny = array.reshape\n")
    got = list(_private_names_from_other_folders(probe, "converters", text))
    assert got == ["converters/_probe_private.py:1 imports isthmus.core.ops.array._squeeze_axes",
                   "converters/_probe_private.py:4 uses isthmus.partitioner.calibrate._placeholder"], got


def test_nothing_imports_apps():
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("apps", "tests", "benchmarks", "examples", "build") or ".venv" in rel.parts:
            continue
        if rel.as_posix() == "__main__.py":  # `python -m isthmus`: an entry point, like the console script
            continue
        mods = list(_imports(path)) + list(_module_strings(path))
        bad += [f"{rel} imports {m}" for m in mods if m.split(".")[:2] == ["isthmus", "apps"]]
    assert not bad, bad


def test_the_checker_sees_import_module_strings(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import importlib\n"
                     "from . import loader\n"
                     "def f(n):\n"
                     "    importlib.import_module('isthmus.core.graph')\n"
                     "    return __import__(f'isthmus.cloud.{n}')\n"
                     "TABLE = {'x': 'isthmus.converters.cli', 'y': 'not a module'}\n")
    tree = ast.parse(probe.read_text())
    assert list(_imports_in(tree, ["isthmus", "edge"])) == [
        "importlib", "isthmus.edge", "isthmus.core.graph", "isthmus.cloud."] or sorted(
        _imports_in(tree, ["isthmus", "edge"])) == sorted(["importlib", "isthmus.edge", "isthmus.core.graph", "isthmus.cloud."])
    assert sorted(_module_strings(probe)) == ["isthmus.cloud.", "isthmus.converters.cli", "isthmus.core.graph"]


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
        tree = _tree(path)
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


# ---- imports inside functions ------------------------------------------------------------------
_REASON = re.compile(r"#.*\b(deferred|cycle):")


def _generated(path: pathlib.Path) -> bool:
    head = path.read_text()[:400]
    return "automatically generated" in head or "Generated by the protocol buffer compiler" in head


def _function_imports(tree):
    """Import statements inside a function body (at any depth), in source order."""
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)) and inside:
                found.append(child)
            visit(child, inside)
    visit(tree, False)
    return sorted(found, key=lambda n: n.lineno)


def _unexplained_function_imports(path: pathlib.Path, text=None):
    """Function-level imports with no `# deferred: ...` or `# cycle: ...` comment on their own line or
    the line just above."""
    given = text is not None
    text = text if given else path.read_text()
    lines = text.splitlines()
    for node in _function_imports(_tree(path, text if given else None)):
        above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
        if _REASON.search(lines[node.lineno - 1]) or (above.startswith("#") and _REASON.search(above)):
            continue
        yield f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}"


_NOT_YET: set = set()  # issue 25: folders whose imports are still being sorted out (none left)


def _package_files():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", "benchmarks", "examples", "docs", "build") or ".venv" in rel.parts:
            continue
        if rel.parts[0] in _NOT_YET:
            continue
        if not _generated(path):
            yield path


def test_function_level_imports_say_why():
    # STYLE.md, issue 25: an import inside a function breaks a real cycle or defers a heavy optional
    # dependency, and says which (`# cycle: core.ops.math <-> core.ops.depthwise`, `# deferred: onnx is heavy`)
    bad = [b for path in _package_files() for b in _unexplained_function_imports(path)]
    assert not bad, f"{len(bad)} imports inside functions without a '# deferred:' or '# cycle:' reason:\n" + "\n".join(bad)


def test_the_function_import_check_sees_what_it_should():
    probe = ROOT / "edge" / "_probe_imports.py"  # never written: the checker reads the text given
    text = ("import os\n"
            "def f():\n"
            "    import grpc  # deferred: grpc is heavy\n"
            "    # cycle: edge.a <-> edge.b\n"
            "    from . import b\n"
            "    from . import c\n"
            "    import json\n"
            "    class K:\n"
            "        def g(self):\n"
            "            from . import d  # a comment that gives no reason\n")
    got = list(_unexplained_function_imports(probe, text))
    assert got == ["edge/_probe_imports.py:6: from . import c", "edge/_probe_imports.py:7: import json",
                   "edge/_probe_imports.py:10: from . import d  # a comment that gives no reason"], got


# ---- no import cycles inside a folder ------------------------------------------------------------
# module-level cycles that remain, each an importer's handler table and the family modules that
# register into it (the families import the registry and helpers from the module that imports them
# all): hub -> the prefix every member of its cycle has. Issue 25 leaves them; a new one fails.
KNOWN_CYCLES = {
    "converters.onnx_import": "converters.onnx_",
    "converters.onnx_export": "converters.onnx_export",
    "converters.tflite_import": "converters.tflite_",
}


def _known(group) -> bool:
    return any(hub in group and all(m.startswith(prefix) for m in group) for hub, prefix in KNOWN_CYCLES.items())


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level_imports(path: pathlib.Path, modules):
    """The modules of the package that `path` imports when it is loaded (not inside functions)."""
    tree = _tree(path)
    pkg = _module_name(path).split(".") if path.name == "__init__.py" else _module_name(path).split(".")[:-1]
    found = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name.split(".", 1)[1] for a in child.names if a.name.startswith("isthmus."))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = ".".join(pkg[: len(pkg) - child.level + 1] + ([child.module] if child.module else []))
                elif (child.module or "").startswith("isthmus."):
                    base = child.module.split(".", 1)[1]
                else:
                    base = ""
                if base:
                    subs = {f"{base}.{a.name}" for a in child.names} & modules
                    found.update(subs or {base})
            visit(child)
    visit(tree)
    return found & modules


def _cycles_in(folder: str):
    """Strongly connected groups (more than one module) of the folder's module-level imports."""
    paths = {_module_name(p): p for p in (ROOT / folder).rglob("*.py")}
    edges = {m: _module_level_imports(p, set(paths)) for m, p in paths.items()}
    index, low, stack, on, groups = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(frozenset(group))
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return groups


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_no_import_cycles_inside_a_folder(folder):
    # issue 25: the cycles core/ops <-> jit and cloud rpc <-> server are gone; none may come back
    new = [sorted(g) for g in _cycles_in(folder) if not _known(g)]
    assert not new, f"import cycles in {folder}/ (module level):\n" + "\n".join(" <-> ".join(g) for g in new)
    # a known cycle that was broken leaves the list
    groups = _cycles_in(folder)
    gone = [hub for hub in KNOWN_CYCLES if hub.split(".")[0] == folder and not any(hub in g for g in groups)]
    assert not gone, f"no longer cycles, remove them from KNOWN_CYCLES: {gone}"


def test_the_cycle_check_sees_a_cycle(tmp_path, monkeypatch):
    pkg = tmp_path / "probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("from . import c\nx = 1\n")
    (pkg / "c.py").write_text("import isthmus.probe.a\ndef f():\n    from .d import y\n")
    (pkg / "d.py").write_text("from .a import x\n")  # a cycle only through a function-level import: not counted
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _cycles_in("probe") == [frozenset({"probe.a", "probe.b", "probe.c"})]


LIBRARY_FOLDERS = ("apps", "cloud", "converters", "core", "edge", "jit", "partitioner", "wire")


def test_no_library_file_over_600_lines():
    """Issue 25 item 5: a file over 600 lines is doing more than one job; split it by job.
    Generated code (proto/) is not counted."""
    long = [f"{p.relative_to(ROOT)}: {n} lines" for folder in LIBRARY_FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 600]
    assert not long, long
