"""Checkpoints: variables (optimizer slots included) saved to .npz without pickle.

A checkpoint file is an uncompressed .npz (np.savez) holding one plain array per variable
and a member "#manifest" (JSON bytes: each variable's dtype, shape and SHA-256), so a file
verifies itself wherever it is copied. The directory's index, checkpoint.json, lists the
checkpoints in save order with the SHA-256 of each whole file, so any flipped byte in a
listed file is caught.

Writes are atomic: temporary file in the same directory, fsync, os.replace, fsync of the
directory; the data file first, the index after. A crash at any point leaves the previous
checkpoint loadable (if a save overwrites a listed file of the same name, the index drops
it before the file is replaced, so it never lists a file whose checksum has changed).

Reading never unpickles: members are parsed with numpy's .npy header functions, object
dtypes are refused, and each array's header must match the graph's variable before its
bytes are read, so a hostile file cannot make a restore allocate more than the variables.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import zipfile
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .errors import CheckpointError
from .graph import Graph, Tensor
from .variables import Variable, global_variables

INDEX = "checkpoint.json"
MANIFEST = "#manifest"  # '#' is never in a variable key, so it cannot collide with one
FORMAT = "isthmus-checkpoint-1"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.\-/]+$")
_SAFE_FILE = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]*\.npz$")
_MAX_MANIFEST = 64 << 20
_dir_locks: Dict[str, threading.Lock] = {}
_dir_locks_guard = threading.Lock()


def _key(name: str) -> str:
    """npz member name for a variable: validated so that no name can reach outside the archive."""
    if not _SAFE_NAME.match(name) or ".." in name.split("/") or name.startswith("/"):
        raise CheckpointError(f"variable name {name!r} cannot be stored safely in a checkpoint")
    return name


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).reshape(-1).view(np.uint8)).hexdigest()


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not every platform lets a directory be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: str, write) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(d)


def _dir_lock(directory: str) -> threading.Lock:
    with _dir_locks_guard:
        return _dir_locks.setdefault(os.path.realpath(directory), threading.Lock())


# ---- the index -----------------------------------------------------------------------------------
def _read_index(directory: str) -> List[Dict]:
    path = os.path.join(directory, INDEX)
    if not os.path.exists(path):
        return []
    try:
        with open(path, "r", encoding="utf-8") as f:
            data = json.load(f)
        entries = data.get("checkpoints") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise ValueError("no 'checkpoints' list")
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("file"), str) or not isinstance(e.get("sha256"), str):
                raise ValueError(f"malformed entry {e!r}")
            if not _SAFE_FILE.match(e["file"]):  # a hostile index must not name files elsewhere
                raise ValueError(f"unsafe file name {e['file']!r}")
        return entries
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint index {path} is unreadable: {e}") from None


def _write_index(directory: str, entries: List[Dict]) -> None:
    payload = json.dumps({"checkpoints": entries}, indent=1).encode()
    _atomic_write(os.path.join(directory, INDEX), lambda f: f.write(payload))


def latest_checkpoint(directory: str) -> Optional[str]:
    """The path of the newest checkpoint listed in `directory`, or None."""
    entries = _read_index(directory)
    return os.path.join(directory, entries[-1]["file"]) if entries else None


def list_checkpoints(directory: str) -> List[str]:
    """Listed checkpoints, oldest first."""
    return [os.path.join(directory, e["file"]) for e in _read_index(directory)]


# ---- reading one file ------------------------------------------------------------------------------
def _read_header(f, what: str) -> Tuple[tuple, bool, np.dtype]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"{what}: unsupported .npy version {version}")
    if dtype.hasobject:
        raise ValueError(f"{what}: object arrays are refused (they would need pickle)")
    return tuple(shape), bool(fortran), dtype


def _read_member(zf: zipfile.ZipFile, key: str, want_shape=None, want_dtype=None):
    """Read one array; its header must give want_shape/want_dtype (when set) before any data is read.
    Returns (array, raw bytes) or (None, (shape, dtype)) when the header differs."""
    with zf.open(key + ".npy") as f:
        shape, fortran, dtype = _read_header(f, key)
        if (want_shape is not None and shape != tuple(want_shape)) or (want_dtype is not None and dtype != want_dtype):
            return None, (shape, dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        raw = f.read(nbytes)
        if len(raw) != nbytes:
            raise ValueError(f"{key}: {len(raw)} bytes where {nbytes} are expected")
        arr = np.frombuffer(raw, dtype=dtype).reshape(shape, order="F" if fortran else "C")
        return arr, raw


def _read_manifest(zf: zipfile.ZipFile) -> Dict:
    try:
        info = zf.getinfo(MANIFEST + ".npy")
    except KeyError:
        raise ValueError("no manifest (not an isthmus checkpoint)") from None
    if info.file_size > _MAX_MANIFEST:
        raise ValueError(f"manifest of {info.file_size} bytes is implausibly large")
    with zf.open(info) as f:
        shape, _, dtype = _read_header(f, "manifest")
        if dtype != np.uint8 or len(shape) != 1 or shape[0] > _MAX_MANIFEST:
            raise ValueError("malformed manifest")
        manifest = json.loads(f.read(shape[0]).decode("utf-8"))
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT \
            or not isinstance(manifest.get("variables"), dict):
        raise ValueError("malformed manifest")
    return manifest


def _read_values(zf: zipfile.ZipFile, path: str, variables: Sequence[Variable]):
    """(variable, value) for each variable, or a CheckpointError naming every one that does not fit."""
    stored = _read_manifest(zf)["variables"]
    problems, wanted = [], []
    for v in variables:
        name = v.node.name
        spec = stored.get(name)
        if not isinstance(spec, dict):
            problems.append(f"'{name}' is missing (graph has {_fmt_spec(v.dtype, v.shape)})")
            continue
        shape, dtype = tuple(spec.get("shape", ())), np.dtype(spec.get("dtype"))
        if dtype != v.dtype or len(shape) != len(v.shape) or any(
                d is not None and d != s for d, s in zip(v.shape, shape)):
            problems.append(f"'{name}': graph has {_fmt_spec(v.dtype, v.shape)}, "
                            f"checkpoint has {_fmt_spec(dtype, shape)}")
            continue
        wanted.append((v, shape, dtype, spec.get("sha256")))
    if problems:
        raise CheckpointError(f"checkpoint {path} does not fit this graph ({len(problems)} "
                              "variable(s)): " + "; ".join(problems))
    values = []
    for v, shape, dtype, sha in wanted:
        name = v.node.name
        a, raw = _read_member(zf, _key(name), shape, dtype)
        if a is None:
            raise CheckpointError(f"checkpoint {path} is corrupt: '{name}' is stored as "
                                  f"{_fmt_spec(raw[1], raw[0])}, its manifest says {_fmt_spec(dtype, shape)}")
        if hashlib.sha256(raw).hexdigest() != sha:
            raise CheckpointError(f"checkpoint {path} is corrupt: the SHA-256 of '{name}' does not match "
                                  "its manifest")
        values.append((v, a))
    return values


def _fmt_spec(dtype, shape) -> str:
    return f"{np.dtype(dtype).name}{list(shape)}"


class Saver:
    """Save and restore `var_list` (default: every variable of the graph, optimizer slots too).

    `save(sess, "dir/model", global_step=3)` writes dir/model-3.npz and lists it in
    dir/checkpoint.json, keeping the newest `max_to_keep` (0 or None: all);
    `restore(sess, "dir")` loads the newest, `restore(sess, path)` a given file.
    """

    def __init__(self, var_list: Optional[Sequence[Variable]] = None, max_to_keep: Optional[int] = 5,
                 graph: Optional[Graph] = None):
        self._var_list = list(var_list) if var_list is not None else None
        self._graph = graph
        self.max_to_keep = max_to_keep

    def _variables(self, sess) -> List[Variable]:
        if self._var_list is not None:
            return self._var_list
        return global_variables(self._graph or sess.graph)

    # ---- save ----------------------------------------------------------------------------------------
    def save(self, sess, prefix: str, global_step=None) -> str:
        """Write `<prefix>-<step>.npz` (or `<prefix>.npz`); returns its path.

        `global_step` is an int or a Variable (its value in `sess` is used)."""
        if isinstance(global_step, Tensor):
            global_step = int(sess.run(global_step))
        directory = os.path.dirname(os.path.abspath(prefix))
        base = os.path.basename(prefix) + (f"-{int(global_step)}" if global_step is not None else "") + ".npz"
        if not _SAFE_FILE.match(base):
            raise CheckpointError(f"checkpoint file name {base!r} must be letters, digits, '_', '-', '.'")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, base)
        arrays, manifest = {}, {}
        for v in self._variables(sess):
            key = _key(v.node.name)
            a = sess.variable_value(v)
            if not a.flags.c_contiguous:
                a = np.array(a, order="C")  # (ascontiguousarray would make a 0-d value 1-d)
            arrays[key] = a
            manifest[key] = {"dtype": a.dtype.str, "shape": list(a.shape), "sha256": _digest(a)}
        meta = json.dumps({"format": FORMAT, "step": global_step, "variables": manifest}).encode()
        arrays[MANIFEST] = np.frombuffer(meta, dtype=np.uint8)
        with _dir_lock(directory):
            entries = _read_index(directory)
            if any(e["file"] == base for e in entries):  # overwriting a listed file: unlist it first
                entries = [e for e in entries if e["file"] != base]
                _write_index(directory, entries)
            _atomic_write(path, lambda f: np.savez(f, **arrays))
            entries.append({"file": base, "sha256": _file_digest(path), "step": global_step})
            keep = self.max_to_keep
            stale = entries[:-keep] if keep and len(entries) > keep else []
            _write_index(directory, entries[len(stale):])
            for e in stale:  # only after the index no longer lists them
                try:
                    os.unlink(os.path.join(directory, e["file"]))
                except OSError:
                    pass
        return path

    # ---- restore -------------------------------------------------------------------------------------
    def restore(self, sess, path: str) -> str:
        """Load `path` (a file written by save, or a directory: its newest checkpoint); returns the file.

        Nothing is assigned unless every variable is present, fits, and verifies."""
        if os.path.isdir(path):
            latest = latest_checkpoint(path)
            if latest is None:
                raise CheckpointError(f"no checkpoint in {path}")
            path = latest
        if not os.path.isfile(path):
            raise CheckpointError(f"checkpoint {path} does not exist")
        directory, base = os.path.split(os.path.abspath(path))
        entry = next((e for e in _read_index(directory) if e["file"] == base), None)
        if entry is not None:
            digest = _file_digest(path)
            if digest != entry["sha256"]:
                raise CheckpointError(f"checkpoint {path} is corrupt: its SHA-256 {digest[:16]}... does not "
                                      f"match the {entry['sha256'][:16]}... recorded in {INDEX}")
        try:
            with zipfile.ZipFile(path) as zf:
                values = _read_values(zf, path, self._variables(sess))
        except CheckpointError:
            raise
        except Exception as e:  # zip CRC, truncation, malformed headers or JSON
            raise CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint: "
                                  f"{type(e).__name__}: {e}") from None
        for v, a in values:
            sess.set_variable_value(v, a)
        return path

    def restore_latest_valid(self, sess, directory: str, warn=None) -> str:
        """Load the newest checkpoint of `directory` that verifies, falling back past corrupt ones
        (a torn disk, a flipped byte); returns the file. Each skipped file is reported through
        `warn(message)` (default: the `isthmus.checkpoint` logger). Raises CheckpointError,
        listing every file's problem, when none verifies."""
        paths = list_checkpoints(directory)
        if not paths:
            raise CheckpointError(f"no checkpoint in {directory}")
        if warn is None:
            warn = logging.getLogger("isthmus.checkpoint").warning
        problems = []
        for path in reversed(paths):
            try:
                used = self.restore(sess, path)
            except CheckpointError as e:
                problems.append(str(e))
                warn(f"skipping checkpoint {path}: {e}")
                continue
            return used
        raise CheckpointError(f"no checkpoint in {directory} verifies:\n  " + "\n  ".join(problems))
