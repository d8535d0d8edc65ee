"""Variables read on a GPU: a value that reached the slot from the host (a checkpoint restore, a
cloud task's Assign over RPC, set_variable_value from code that predates the device) moves onto
the device at its first read there and stays."""
from __future__ import annotations

import numpy as np

from . import generic_factory


def _variable(node, ctx):
    read = generic_factory("Variable")(node, ctx)
    slot, xp = ctx.var_slot(node), ctx.xp

    def run():
        v = read()
        if type(v) is np.ndarray:  # a host value: move it once (exactly ndarray: device arrays are not)
            with slot.lock:
                if type(slot.value) is np.ndarray:
                    slot.value = xp.asarray(slot.value)
                v = slot.value
        return v
    return run


KERNELS = {"Variable": _variable}
