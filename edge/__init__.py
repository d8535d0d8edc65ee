"""isthmus.edge: the edge runtime. Load and verify a flatbuffer model, prepare its kernels once,
plan one memory arena, invoke. Imports numpy and flatbuffers only: never the graph machinery."""
from .format import EdgeModelError
from .loader import EdgeModel, load, loads
from .split_model import Cut, SplitModel, cut_for, load_split, mid_bandwidth_bps


def __getattr__(name):
    if name in ("Interpreter",):
        # deferred: the interpreter and its kernel tables (~0.4 s) stay out of `import isthmus.edge`
        from .interpreter import Interpreter
        return Interpreter
    if name in ("ModelWriter",):
        from .writer import ModelWriter  # deferred: the writer loads flatbuffers
        return ModelWriter
    if name == "OffloadClient":
        from .offload_client import OffloadClient  # deferred: the client loads protobuf (and grpc when it connects)
        return OffloadClient
    if name in ("EmulatedLink", "emulated_kernel_seconds"):  # test and benchmark machinery
        from . import link_emulation  # deferred: link emulation loads the interpreter
        return getattr(link_emulation, name)
    raise AttributeError(f"module 'isthmus.edge' has no attribute '{name}'")


__all__ = ["EdgeModelError", "EdgeModel", "load", "loads", "Cut", "SplitModel", "cut_for", "load_split",
           "mid_bandwidth_bps", "Interpreter", "ModelWriter", "OffloadClient", "EmulatedLink",
           "emulated_kernel_seconds"]
