"""numba's on-disk cache for isthmus.jit, invalidated when any file of the package changes.

numba keys a function's cache on its own source file's stamp (mtime and size). A kernel that inlines
another module's function or intrinsic (jit.dense, jit.rnn and jit.gemm_pixels use jit.gemm_f32's
tile) keeps running the old machine code after only that other module changed: the old speed, or,
where a packing layout changed, wrong results. This happens after a `git pull` or a merge into an
editable install, never after a fresh install (every file is rewritten). So the functions defined in
this package get locators whose stamp is their file's stamp plus a digest of every .py file here:
any change recompiles them all, once. Installed when numba is first imported for the kernels
(jit.available()); functions decorated before that keep numba's own stamp.
"""
from __future__ import annotations

import hashlib
import os

_DIR = os.path.dirname(os.path.abspath(__file__))
_state: dict = {}


def tree_digest() -> str:
    """sha1 over the names and contents of this package's .py files (computed once per process)."""
    d = _state.get("digest")
    if d is None:
        h = hashlib.sha1()
        for name in sorted(os.listdir(_DIR)):
            if name.endswith(".py"):
                h.update(name.encode())
                with open(os.path.join(_DIR, name), "rb") as f:
                    h.update(f.read())
        d = _state["digest"] = h.hexdigest()
    return d


def _in_package(py_file: str) -> bool:
    return os.path.dirname(os.path.abspath(py_file)) == _DIR


def _tree_locator(base):
    """base (one of numba's source-file locators) for this package's files, stamped with tree_digest."""
    class TreeLocator(base):
        @classmethod
        def from_function(cls, py_func, py_file):
            return super().from_function(py_func, py_file) if _in_package(py_file) else None

        def get_source_stamp(self):
            return (super().get_source_stamp(), tree_digest())
    TreeLocator.__name__ = TreeLocator.__qualname__ = f"IsthmusTree{base.__name__}"
    return TreeLocator


def install() -> bool:
    """Put the tree-stamped locators ahead of numba's own (once); False where numba's caching module
    has not the shape this was written against (numba's own locators then serve, as before)."""
    if "installed" in _state:
        return _state["installed"]
    try:
        from numba.core import caching  # deferred: numba is imported only for the kernels
        classes = list(caching.CacheImpl._locator_classes)
        mixin = caching._SourceFileBackedLocatorMixin
    except (ImportError, AttributeError):
        _state["installed"] = False
        return False
    out = []
    for cls in classes:
        if issubclass(cls, mixin) and not cls.__name__.startswith("IsthmusTree"):
            out.append(_tree_locator(cls))
        out.append(cls)
    caching.CacheImpl._locator_classes = out
    _state["installed"] = True
    return True
