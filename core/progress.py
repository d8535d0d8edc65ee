"""A dependency-free progress bar for training loops: steps, loss, examples/s, ETA.

On a terminal it redraws one line; elsewhere (CI, logs) it prints a plain line every
`every_s` seconds and a last one at close, so logs stay short.
"""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class ProgressBar:
    def __init__(self, total: int, desc: str = "", unit: str = "ex", stream: Optional[TextIO] = None,
                 every_s: float = 5.0, width: int = 24):
        self.total, self.desc, self.unit = max(int(total), 1), desc, unit
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s, self.width = every_s, width
        self.n = 0
        self.examples = 0
        self.loss: Optional[float] = None
        self.t0 = time.perf_counter()
        self._last = self.t0
        self._closed = False

    def update(self, steps: int = 1, loss: Optional[float] = None, examples: int = 0) -> None:
        self.n += steps
        self.examples += examples
        if loss is not None:
            self.loss = loss if self.loss is None else 0.9 * self.loss + 0.1 * loss  # smoothed
        now = time.perf_counter()
        if self.tty and now - self._last >= 0.1:
            self._last = now
            self.stream.write("\r" + self.line())
            self.stream.flush()
        elif not self.tty and now - self._last >= self.every_s:
            self._last = now
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def line(self) -> str:
        el = time.perf_counter() - self.t0
        frac = min(self.n / self.total, 1.0)
        filled = int(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        rate = self.examples / el if el > 0 else 0.0
        eta = el / self.n * (self.total - self.n) if self.n else 0.0
        loss = f" loss {self.loss:.4f}" if self.loss is not None else ""
        speed = f" {rate:,.0f} {self.unit}/s" if self.examples else f" {self.n / el if el else 0:,.1f} it/s"
        return f"{self.desc} [{bar}] {self.n}/{self.total}{loss}{speed} eta {eta:4.0f}s"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stream.write(("\r" if self.tty else "") + self.line() + "\n")
        self.stream.flush()

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
