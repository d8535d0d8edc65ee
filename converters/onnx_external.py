"""Reading an ONNX model's bytes and initializers for from_onnx, external data confined to one folder.

A model may keep weights in side files (`data_location = EXTERNAL`, a relative `location`). Such
data is read only when the caller names the folder it may come from (or gives the model as a path,
whose folder is then that folder), and only from inside it: no absolute path, no `..`, no
symlink resolving outside, no read past the file's end.
"""
from __future__ import annotations

import mmap
import os
import sys
from typing import Optional, Tuple

import numpy as np

from .onnx_import import ImportError_
from .onnx_wire import RawWeights, parse_without_weights


def load_model(model, external_data_dir: Optional[str]) -> Tuple[object, Optional[str], Optional[RawWeights]]:
    """(ModelProto, the folder external data may be read from or None, the initializers' raw_data left
    in the file or bytes by onnx_wire (the caller closes it), or None when the ModelProto holds them)."""
    import onnx  # deferred: onnx is a heavy or optional dependency
    base = None if external_data_dir is None else os.fspath(external_data_dir)
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        base = base if base is not None else (os.path.dirname(os.path.abspath(path)))
        try:
            with open(path, "rb") as fh:
                fast = _mapped(fh)
                if fast is not None:
                    return fast[0], base, RawWeights(fast[1], path=path)
                data = fh.read()
        except OSError as e:
            raise ImportError_(f"cannot read {path}: {e.strerror or e}") from None
        return _parse(data, path), base, None
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        fast = parse_without_weights(data) if sys.byteorder == "little" else None
        if fast is not None:
            return fast[0], base, RawWeights(fast[1], data=data)
        return _parse(data, "the model bytes"), base, None
    if isinstance(model, onnx.ModelProto):
        return model, base, None
    raise ImportError_(f"from_onnx takes a path, bytes or an onnx.ModelProto, not {type(model).__name__}")


def _mapped(fh):
    """parse_without_weights over a read-only map of the open file (None: an empty file, no mmap, or a
    framing the fast path does not take)."""
    if sys.byteorder != "little":
        return None
    try:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (ValueError, OSError):
        return None
    with mm:
        return parse_without_weights(mm)


def _parse(data: bytes, what: str):
    import onnx  # deferred: onnx is a heavy or optional dependency
    try:
        return onnx.load_from_string(data)
    except Exception as e:  # noqa: BLE001  (protobuf's DecodeError and friends)
        raise ImportError_(f"{what}: not an ONNX model ({type(e).__name__}: {e})") from None


def read_initializer(init, base: Optional[str], raws: Optional[RawWeights] = None, k: int = 0) -> np.ndarray:
    """The initializer's array; external data read from inside `base` only. `raws`: the raw_data that
    onnx_wire left in the model's file or bytes (initializer number k's is read from there)."""
    from onnx import TensorProto, helper, numpy_helper  # deferred: onnx is a heavy or optional dependency
    name = _name(init.name)
    if raws is not None and raws.spans[k] is not None:
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
        except Exception:  # noqa: BLE001
            raise ImportError_(f"initializer '{name}' has unsupported element type {init.data_type}") from None
        try:
            if _STORAGE_BITS.get(init.data_type) == dtype.itemsize * 8:
                count = int(np.prod(init.dims, dtype=np.int64))
                return raws.get(k, dtype, count, f"initializer '{name}'").reshape(tuple(init.dims))
            init = _with_raw(init, raws.get(k, np.dtype(np.uint8), raws.spans[k][1], f"initializer '{name}'"))
        except (ValueError, OSError) as e:
            raise ImportError_(str(e)) from None
    if init.data_location == TensorProto.EXTERNAL:
        init = _with_external_bytes(init, base)
    try:
        arr = numpy_helper.to_array(init)
    except Exception as e:  # noqa: BLE001
        raise ImportError_(f"initializer '{name}' cannot be read: {type(e).__name__}: {e}") from None
    if arr.dtype == object or arr.dtype.kind not in "fiub":
        raise ImportError_(f"initializer '{name}' has unsupported dtype {arr.dtype}")
    return arr


# element types whose raw_data is plain little-endian numpy storage, with its width in bits
_STORAGE_BITS = {1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64}


def _with_raw(init, raw):
    from onnx import TensorProto  # deferred: onnx is a heavy or optional dependency
    out = TensorProto()
    out.CopyFrom(init)
    out.raw_data = raw.tobytes()
    return out


def _with_external_bytes(init, base: Optional[str]):
    from onnx import TensorProto  # deferred: onnx is a heavy or optional dependency
    name = _name(init.name)
    info = {e.key: e.value for e in init.external_data}
    loc = info.get("location", "")
    if base is None:
        raise ImportError_(f"initializer '{name}' keeps its data outside the model (external data '{loc}'); "
                           "pass external_data_dir= naming the folder it may be read from")
    path = confined_path(base, loc, f"initializer '{name}'")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise ImportError_(f"initializer '{name}': external data offset/length are not integers") from None
    try:
        size = os.path.getsize(path)
        if offset < 0 or offset > size or (length is not None and (length < 0 or offset + length > size)):
            raise ImportError_(f"initializer '{name}': external data [{offset}, +{length}) lies outside "
                               f"'{loc}' ({size} bytes)")
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(size - offset if length is None else length)
    except OSError as e:
        raise ImportError_(f"initializer '{name}': cannot read external data '{loc}': {e.strerror or e}") from None
    out = TensorProto()
    out.CopyFrom(init)
    del out.external_data[:]
    out.data_location = TensorProto.DEFAULT
    out.raw_data = data
    return out


def confined_path(base: str, location: str, what: str) -> str:
    """`location` resolved inside `base`, or OnnxImportError naming `what` when it would leave it."""
    if not location:
        raise ImportError_(f"{what}: external data names no location")
    if "\x00" in location or os.path.isabs(location) or location.startswith(("/", "\\")) or \
            (len(location) > 1 and location[1] == ":"):
        raise ImportError_(f"{what}: external data location '{location}' is absolute: it points outside the "
                           "model's folder (it must be relative to it)")
    parts = location.replace("\\", "/").split("/")
    if ".." in parts:
        raise ImportError_(f"{what}: external data location '{location}' points outside the model's "
                           "folder (it climbs out with '..')")
    root = os.path.realpath(base)
    path = os.path.realpath(os.path.join(root, *parts))
    if os.path.commonpath([root, path]) != root:
        raise ImportError_(f"{what}: external data location '{location}' points outside the model's folder "
                           "(a symlink leads out of it)")
    if not os.path.isfile(path):
        raise ImportError_(f"{what}: external data file '{location}' does not exist in {base}")
    return path


def _name(v) -> str:
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
