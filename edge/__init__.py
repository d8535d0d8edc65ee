"""isthmus.edge: the edge runtime. Load and verify a flatbuffer model, prepare its kernels once,
plan one memory arena, invoke. Imports numpy and flatbuffers only: never the graph machinery."""
from .format import EdgeModelError
from .loader import EdgeModel, load, loads
from .split_model import Cut, SplitModel, cut_for, load_split, mid_bandwidth_bps


def __getattr__(name):
    if name in ("Interpreter",):
        from .interpreter import Interpreter
        return Interpreter
    if name in ("ModelWriter",):
        from .writer import ModelWriter
        return ModelWriter
    if name == "OffloadClient":  # deferred: the client loads grpc
        from .offload_client import OffloadClient
        return OffloadClient
    if name in ("EmulatedLink", "emulated_kernel_seconds"):  # deferred: test and benchmark machinery
        from . import link_emulation
        return getattr(link_emulation, name)
    raise AttributeError(f"module 'isthmus.edge' has no attribute '{name}'")


__all__ = ["EdgeModelError", "EdgeModel", "load", "loads", "Cut", "SplitModel", "cut_for", "load_split",
           "mid_bandwidth_bps", "Interpreter", "ModelWriter", "OffloadClient", "EmulatedLink", "emulated_kernel_seconds"]
