"""jit.cache_stamp: numba's disk cache of a kernel that inlines another module's function is
invalidated when that other module changes (numba alone keeps the stale machine code)."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numba")

_RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import isthmus.jit.cache_stamp as cs
    if sys.argv[2] == "tree":
        cs._DIR = sys.argv[3]  # stand-in for the jit package: the two modules below
        assert cs.install()
    from pkg import a
    print(a.f(), sum(a.f.stats.cache_hits.values()))
""")


def _write(pkg, value):
    with open(os.path.join(pkg, "b.py"), "w") as f:
        f.write(f"import numba\n\n\n@numba.njit(cache=True)\ndef g():\n    return {value}\n")


def _run(root, how, pkg):
    out = subprocess.run([sys.executable, "-c", _RUN, root, how, pkg], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NUMBA_CACHE_DIR": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    value, hits = out.stdout.split()
    return int(value), int(hits)


def test_a_change_in_an_inlined_module_recompiles_the_caller(tmp_path):
    root = str(tmp_path)
    pkg = os.path.join(root, "pkg")
    os.mkdir(pkg)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    with open(os.path.join(pkg, "a.py"), "w") as f:
        f.write("import numba\n\nfrom .b import g\n\n\n@numba.njit(cache=True)\ndef f():\n    return g() + 10\n")
    _write(pkg, 1)
    assert _run(root, "numba", pkg) == (11, 0)  # compiled and cached by numba's own locators
    _write(pkg, 22)  # only b changes: a's own stamp is the same
    assert _run(root, "numba", pkg) == (11, 1)  # numba alone: a's stale machine code still runs
    assert _run(root, "tree", pkg) == (32, 0)  # the tree's stamp: recompiled
    assert _run(root, "tree", pkg) == (32, 1)  # and cached
    _write(pkg, 5)
    assert _run(root, "tree", pkg) == (15, 0)


def test_installed_once_and_only_for_the_package_files():
    from numba.core import caching

    import isthmus.jit as jit
    from isthmus.jit import cache_stamp
    assert jit.available()
    names = [c.__name__ for c in caching.CacheImpl._locator_classes]
    assert cache_stamp.install() and names == [c.__name__ for c in caching.CacheImpl._locator_classes]
    assert names.index("IsthmusTreeInTreeCacheLocator") == names.index("InTreeCacheLocator") - 1
    tree = caching.CacheImpl._locator_classes[names.index("IsthmusTreeInTreeCacheLocator")]
    assert tree.from_function(test_installed_once_and_only_for_the_package_files, __file__) is None
    assert len(cache_stamp.tree_digest()) == 40
