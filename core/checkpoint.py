"""Checkpoints: variables (optimizer slots included) saved to .npz without pickle.

A save writes the data file to a temporary name in the same directory, fsyncs it and
renames it into place, then does the same for the JSON index that lists checkpoints with
their SHA-256; a crash at any point leaves the previous checkpoint intact and listed. A
restore verifies the checksum and that every variable is present with its dtype and shape.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np

from .errors import CheckpointError
from .graph import Graph
from .variables import Variable, global_variables

INDEX = "checkpoint.json"
_SAFE = re.compile(r"^[A-Za-z0-9_.\-/]+$")


def _key(name: str) -> str:
    """npz member name for a variable: validated, '/' kept (npz members are not paths on disk)."""
    if not _SAFE.match(name) or ".." in name.split("/") or name.startswith("/"):
        raise CheckpointError(f"variable name {name!r} cannot be stored safely in a checkpoint")
    return name


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


def _read_index(directory: str) -> Dict:
    path = os.path.join(directory, INDEX)
    if not os.path.exists(path):
        return {"checkpoints": []}
    try:
        with open(path, "r", encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or not isinstance(data.get("checkpoints"), list):
            raise ValueError("no 'checkpoints' list")
        return data
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint index {path} is unreadable: {e}") from None


def latest_checkpoint(directory: str) -> Optional[str]:
    entries = _read_index(directory)["checkpoints"]
    return os.path.join(directory, entries[-1]["file"]) if entries else None


class Saver:
    """Save and restore `var_list` (default: every variable of the graph, optimizer slots too)."""

    def __init__(self, var_list: Optional[Sequence[Variable]] = None, max_to_keep: int = 5,
                 graph: Optional[Graph] = None):
        self._var_list = list(var_list) if var_list is not None else None
        self._graph = graph
        self.max_to_keep = max_to_keep

    def _variables(self, sess) -> List[Variable]:
        if self._var_list is not None:
            return self._var_list
        return global_variables(self._graph or sess.graph)

    def save(self, sess, prefix: str, global_step: Optional[int] = None) -> str:
        """Write `<prefix>-<step>.npz` (or `<prefix>.npz`); returns its path."""
        directory = os.path.dirname(os.path.abspath(prefix)) or "."
        os.makedirs(directory, exist_ok=True)
        base = os.path.basename(prefix) + (f"-{int(global_step)}" if global_step is not None else "") + ".npz"
        path = os.path.join(directory, base)
        arrays = {}
        for v in self._variables(sess):
            arrays[_key(v.node.name)] = np.array(sess.variable_value(v), order="C")  # 0-d stays 0-d
        _atomic_write(path, lambda f: np.savez(f, **arrays))
        digest = _sha256(path)
        index = _read_index(directory)
        entries = [e for e in index["checkpoints"] if e.get("file") != base]
        entries.append({"file": base, "sha256": digest, "step": global_step,
                        "variables": {k: [a.dtype.str, list(a.shape)] for k, a in arrays.items()}})
        stale = entries[:-self.max_to_keep] if self.max_to_keep and len(entries) > self.max_to_keep else []
        entries = entries[len(stale):]
        payload = json.dumps({"checkpoints": entries}, indent=1).encode()
        _atomic_write(os.path.join(directory, INDEX), lambda f: f.write(payload))
        for e in stale:  # only after the index no longer lists them
            try:
                os.unlink(os.path.join(directory, e["file"]))
            except OSError:
                pass
        return path

    def restore(self, sess, path: str) -> None:
        """Load `path` (a file written by save, or a directory: its latest checkpoint)."""
        if os.path.isdir(path):
            latest = latest_checkpoint(path)
            if latest is None:
                raise CheckpointError(f"no checkpoint in {path}")
            path = latest
        if not os.path.exists(path):
            raise CheckpointError(f"checkpoint {path} does not exist")
        directory, base = os.path.split(os.path.abspath(path))
        entry = next((e for e in _read_index(directory)["checkpoints"] if e.get("file") == base), None)
        if entry is None:
            raise CheckpointError(f"checkpoint {path} is not listed in {os.path.join(directory, INDEX)}")
        digest = _sha256(path)
        if digest != entry.get("sha256"):
            raise CheckpointError(f"checkpoint {path} is corrupt: SHA-256 {digest[:16]}... does not match "
                                  f"the recorded {str(entry.get('sha256'))[:16]}...")
        try:
            with np.load(path, allow_pickle=False) as data:
                stored = {k: data[k] for k in data.files}
        except Exception as e:
            raise CheckpointError(f"checkpoint {path} cannot be read: {e}") from None
        problems, values = [], []
        for v in self._variables(sess):
            name = v.node.name
            a = stored.get(name)
            if a is None:
                problems.append(f"'{name}' is missing")
            elif a.dtype != v.dtype or len(a.shape) != len(v.shape) or any(
                    d is not None and d != s for d, s in zip(v.shape, a.shape)):
                problems.append(f"'{name}': graph has {v.dtype.name}{list(v.shape)}, checkpoint has "
                                f"{a.dtype.name}{list(a.shape)}")
            else:
                values.append((v, a))
        if problems:
            raise CheckpointError(f"checkpoint {path} does not fit this graph: " + "; ".join(problems))
        for v, a in values:
            sess.set_variable_value(v, a)
