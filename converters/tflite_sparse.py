"""Sparse TFLite constants (SparsityParameters: traversal order, block map, DENSE / SPARSE_CSR dimension
metadata) read with bounds checks and densified, as TFLite's own FormatConverter does; a layout it cannot
densify is refused with a message that says the tensor is sparse."""
from __future__ import annotations

import importlib
from typing import Optional, Tuple

import numpy as np

from .tflite_read import TFLiteImportError

MAX_DENSE_ELEMENTS = 1 << 28  # a dense copy beyond this (1 GiB of float32) is refused, never allocated


def read_sparsity(r, t, what: str) -> Optional[dict]:
    """The tensor's sparsity parameters as plain data, or None for a dense tensor."""
    sp = r.call(f"{what} sparsity", t.Sparsity)
    if sp is None:
        return None
    r.check_table(sp, f"{what} sparsity")
    order = r.ints(f"{what} sparsity traversal_order", sp.TraversalOrderAsNumpy)
    block_map = r.ints(f"{what} sparsity block_map", sp.BlockMapAsNumpy)
    n = r.count(r.call(f"{what} sparsity dim_metadata", sp.DimMetadataLength), f"{what} sparsity dim_metadata")
    dims = []
    for k in range(n):
        dm = r.check_table(r.call(f"{what} sparsity dim {k}", sp.DimMetadata, k), f"{what} sparsity dim {k}")
        fmt = int(r.call(f"{what} sparsity dim {k} format", dm.Format))
        if fmt == 0:  # DENSE
            dims.append((0, int(r.call(f"{what} sparsity dim {k} dense_size", dm.DenseSize)), None, None))
        else:
            seg = _index_vector(r, dm.ArraySegmentsType, dm.ArraySegments, f"{what} sparsity dim {k} array_segments")
            idx = _index_vector(r, dm.ArrayIndicesType, dm.ArrayIndices, f"{what} sparsity dim {k} array_indices")
            dims.append((1, 0, seg, idx))
    return {"order": order, "block_map": block_map, "dims": dims}


def _index_vector(r, type_fn, table_fn, what: str) -> np.ndarray:
    kind = int(r.call(f"{what} type", type_fn))
    names = {1: "Int32Vector", 2: "Uint16Vector", 3: "Uint8Vector"}
    if kind not in names:
        raise TFLiteImportError(f"{what}: sparse index vector type {kind} is not one of {sorted(names)}")
    table = r.call(what, table_fn)
    if table is None:
        raise TFLiteImportError(f"{what}: missing")
    cls = getattr(importlib.import_module(f"tflite.{names[kind]}"), names[kind])
    vec = cls()
    vec.Init(table.Bytes, table.Pos)
    r.check_table(vec, what)
    v = r.call(f"{what} values", vec.ValuesAsNumpy)
    return np.zeros(0, np.int64) if isinstance(v, int) else np.asarray(v, np.int64).reshape(-1)


def densify(values: np.ndarray, shape: Tuple[int, ...], sp: dict, what: str) -> np.ndarray:
    """The dense array of `shape` whose non-zeros `values` (in traversal order) the parameters describe."""
    rank, order, block_map, dims = len(shape), sp["order"], sp["block_map"], sp["dims"]
    n = len(order)
    if sorted(order) != list(range(n)) or len(dims) != n or n != rank + len(block_map) or \
            any(not 0 <= d < rank for d in block_map):
        raise TFLiteImportError(f"{what}: sparse tensor with inconsistent sparsity parameters (traversal order "
                                f"{order}, block map {block_map}, {len(dims)} dimension metadata for rank {rank})")
    total = int(np.prod(shape, dtype=np.int64))
    if total > MAX_DENSE_ELEMENTS:
        raise TFLiteImportError(f"{what}: sparse tensor of shape {list(shape)} is too large to densify")
    block = {d: dims[order.index(rank + k)][1] for k, d in enumerate(block_map)}  # blocks are DENSE dims
    if any(dims[order.index(rank + k)][0] != 0 or b <= 0 for k, (d, b) in enumerate(block.items())):
        raise TFLiteImportError(f"{what}: sparse tensor with a sparse block dimension is not supported")
    # the expanded coordinate of every stored value, level by level (one row per value reached so far)
    coords = np.zeros((1, 0), np.int64)
    parents = np.zeros(1, np.int64)  # position of each row within its level (indexes the next segments)
    for level, (fmt, size, seg, idx) in enumerate(dims):
        if fmt == 0:
            if size <= 0:
                raise TFLiteImportError(f"{what}: sparse tensor dense dimension {level} has size {size}")
            coords = np.concatenate([np.repeat(coords, size, 0), np.tile(np.arange(size), len(coords))[:, None]], 1)
            parents = np.repeat(parents, size) * size + np.tile(np.arange(size), len(parents))
        else:
            if len(parents) and len(seg) < int(parents.max()) + 2:
                raise TFLiteImportError(f"{what}: sparse tensor dimension {level} has {len(seg)} segments for "
                                        f"{len(parents)} rows")
            lo, hi = seg[parents], seg[parents + 1]
            if np.any(hi < lo) or np.any(lo < 0) or (len(hi) and hi.max() > len(idx)):
                raise TFLiteImportError(f"{what}: sparse tensor dimension {level} has segments outside its "
                                        f"{len(idx)} indices")
            counts = hi - lo
            pos = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)]) if len(lo) else np.zeros(0, np.int64)
            coords = np.concatenate([np.repeat(coords, counts, 0), idx[pos][:, None]], 1)
            parents = pos
        if len(coords) > MAX_DENSE_ELEMENTS:
            raise TFLiteImportError(f"{what}: sparse tensor metadata reaches more than {MAX_DENSE_ELEMENTS} values")
    if len(coords) != values.size:
        raise TFLiteImportError(f"{what}: sparse tensor metadata addresses {len(coords)} values, the buffer "
                                f"holds {values.size}")
    expanded = np.empty_like(coords)
    expanded[:, order] = coords  # column k: the coordinate along expanded dim k
    full = expanded[:, :rank].copy()
    for k, d in enumerate(block_map):
        full[:, d] = full[:, d] * block[d] + expanded[:, rank + k]
    if np.any(full < 0) or np.any(full >= np.asarray(shape, np.int64)):
        raise TFLiteImportError(f"{what}: sparse tensor indices fall outside its shape {list(shape)}")
    dense = np.zeros(shape, values.dtype)
    dense[tuple(full.T)] = values.reshape(-1)
    return dense
