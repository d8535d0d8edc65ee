"""The TFLite flatbuffer schema's Python code, taken from the PyPI `tflite` package, as one namespace.

The `tflite` package (the `tflite` extra: pip install 'isthmus[tflite]') holds one module per schema
table or enum (`tflite.Model` has the class `Model` and the builder functions `ModelStart`,
`ModelAddVersion`, ...). `schema()` gathers, from each such module `X`, the class or enum `X` and
every function whose name starts with `X`, so the writer and the readers say `fb.ModelStart`,
`fb.BuiltinOperator.CONV_2D`, `fb.Model.GetRootAs`. `fb` is a lazy handle: the package is imported
on the first attribute read, and a missing package raises an ImportError naming the extra.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
import types

EXTRA_HINT = "pip install 'isthmus[tflite]' (the PyPI package `tflite`, the TFLite schema's flatbuffer code)"


class TFLiteSchemaMissing(ImportError):
    """The optional `tflite` package is not installed."""


@functools.lru_cache(maxsize=1)
def schema() -> types.SimpleNamespace:
    """Every schema table, enum and builder function of the installed `tflite` package, by name."""
    try:
        import tflite  # deferred: tflite is optional (its ImportError is handled)
    except ImportError as e:
        raise TFLiteSchemaMissing(f"reading or writing .tflite flatbuffers needs the `tflite` extra: {EXTRA_HINT}") \
            from e
    names = {}
    for info in pkgutil.iter_modules(tflite.__path__):
        if not info.name[:1].isupper():      # tflite.utils and other helpers are not schema code
            continue
        mod = importlib.import_module(f"tflite.{info.name}")
        for attr, value in vars(mod).items():
            if attr == info.name or (attr.startswith(info.name) and isinstance(value, types.FunctionType)):
                names[attr] = value
    ns = types.SimpleNamespace(**names)
    ns.package_version = getattr(tflite, "__version__", "unknown")
    return ns


class _LazySchema:
    """Attribute reads go to `schema()`; importing this module does not import `tflite`."""

    def __getattr__(self, name: str):
        ns = schema()
        try:
            return getattr(ns, name)
        except AttributeError:
            raise AttributeError(f"the installed `tflite` package (version {ns.package_version}) has no schema "
                                 f"name '{name}' (a newer TFLite schema may be needed)") from None


fb = _LazySchema()

__all__ = ["fb", "schema", "TFLiteSchemaMissing", "EXTRA_HINT"]
