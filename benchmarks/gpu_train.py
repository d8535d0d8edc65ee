"""GPU benchmark 'train' (issue #9). Prints JSON.

Without cupy or a GPU it prints {"benchmark": ..., "skipped": "no GPU: <reason>"} and exits 0.
STATUS: the executor's GPU path is not built yet, so on a GPU this reports
"not_implemented" for the isthmus side instead of pretending to measure it.
"""
from __future__ import annotations

import json
import sys

from isthmus.core import gpu


def main() -> int:
    out = {"benchmark": "gpu_train"}
    if not gpu.gpu_available():
        out["skipped"] = f"no GPU: {gpu.unavailable_reason()}"
    else:
        out["not_implemented"] = "isthmus executor has no GPU device yet (issue #9)"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
