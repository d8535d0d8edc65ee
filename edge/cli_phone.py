"""The part of `isthmus edge-run --runtime litert|onnxruntime` both phone runtimes share: read the inputs,
run once, time --repeat runs, print and save the outputs, and the client's TLS/token settings.
Each runtime's module (edge/cli_litert.py, edge/cli_onnxruntime.py) opens its model and client."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, List, Sequence

import numpy as np

from ..wire.security import ClientSecurity, SecurityError
from . import cli
from .phone_offload import OffloadCallError


@dataclass
class PhoneRun:
    """An opened model: its inputs (names, graph-layout shapes), how to run it and what it returns."""
    runtime: str                      # "LiteRT", "onnxruntime": the label of the timing line
    input_names: List[str]
    input_shapes: List[tuple]
    call: Callable[..., Sequence[np.ndarray]]
    close: Callable[[], None]
    output_names: List[str]
    load_s: float


def run_phone(args, opened: PhoneRun) -> int:
    """Run `opened` on the command's inputs (once, then --repeat timed runs); print and --save."""
    try:
        inputs = cli._inputs(args.input, opened.input_names, opened.input_shapes, cli._how(args))
        outs = opened.call(*inputs)
        times = []
        for _ in range(max(args.repeat, 1)):
            s = time.perf_counter()
            opened.call(*inputs)
            times.append(time.perf_counter() - s)
    except OffloadCallError as e:
        raise SystemExit(f"isthmus edge-run: {e}") from None
    finally:
        opened.close()
    cli._print_outputs(opened.output_names, outs)
    what = f"request via {args.cloud}" if args.cloud else "invoke"
    print(f"{opened.runtime}: load+prepare {opened.load_s * 1e3:.2f} ms; {what} median "
          f"{statistics.median(times) * 1e3:.3f} ms over {len(times)} runs")
    if args.save:
        np.save(args.save, outs[0], allow_pickle=False)
    return 0


def refuse_emulated_link(args, runtime: str) -> None:
    if getattr(args, "emulate_link", None):
        raise SystemExit(f"--emulate-link needs --runtime isthmus (the {runtime} client sends at the real link's speed)")


def client_security(args):
    """The offload client's ClientSecurity from --tls-ca/--tls-cert/--tls-key/--token-file, else the environment."""
    try:
        if args.tls_ca or args.tls_cert or args.token_file:
            return ClientSecurity.from_files(args.tls_ca, args.tls_cert, args.tls_key, token_file=args.token_file)
        return ClientSecurity.from_env()
    except SecurityError as e:
        raise SystemExit(f"isthmus edge-run: {e}") from None

