"""A dependency-free progress bar for training loops: steps, loss, examples/s, ETA.

On a terminal it redraws one line (at most every `redraw_s`); elsewhere (CI, logs) it
prints a plain line every `every_s` seconds and a last one at close, so logs stay short.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class ProgressBar:
    """`total` steps (None when unknown: no bar, no ETA). The loss shown is smoothed
    (exponential average, weight `smoothing` on the newest value)."""

    def __init__(self, total: Optional[int], desc: str = "", unit: str = "ex", stream: Optional[TextIO] = None,
                 every_s: float = 10.0, width: int = 24, redraw_s: float = 0.1, smoothing: float = 0.1,
                 clock: Callable[[], float] = time.perf_counter):
        self.total = None if total is None else max(int(total), 1)
        self.desc, self.unit = desc, unit
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):  # no isatty, or a closed stream
            self.tty = False
        self.every_s, self.width, self.redraw_s, self.smoothing = every_s, width, redraw_s, smoothing
        self.clock = clock
        self.n = 0
        self.examples = 0
        self.loss: Optional[float] = None
        self.t0 = clock()
        self._last = self.t0
        self._shown = 0  # length of the line last drawn on a terminal
        self._closed = False

    def update(self, steps: int = 1, loss: Optional[float] = None, examples: int = 0) -> None:
        self.n += steps
        self.examples += examples
        if loss is not None:
            loss = float(loss)
            self.loss = loss if self.loss is None else (1 - self.smoothing) * self.loss + self.smoothing * loss
        now = self.clock()
        if now - self._last >= (self.redraw_s if self.tty else self.every_s):
            self._last = now
            self._write(self.line(now))

    def line(self, now: Optional[float] = None) -> str:
        el = (self.clock() if now is None else now) - self.t0
        parts = [self.desc] if self.desc else []
        if self.total is not None:
            frac = min(self.n / self.total, 1.0)
            filled = int(frac * self.width)
            parts.append(f"[{'#' * filled}{'-' * (self.width - filled)}] {self.n}/{self.total}")
        else:
            parts.append(f"{self.n}")
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.examples:
            parts.append(f"{self.examples / el if el > 0 else 0.0:,.0f} {self.unit}/s")
        else:
            parts.append(f"{self.n / el if el > 0 else 0.0:,.1f} it/s")
        if self.total is not None and self.n < self.total:
            parts.append(f"eta {_hms(el / self.n * (self.total - self.n)) if self.n else '?'}")
        else:
            parts.append(f"{_hms(el)}")
        return " ".join(parts)

    def _write(self, line: str, final: bool = False) -> None:
        if self.tty:
            pad = " " * max(self._shown - len(line), 0)  # blank out the rest of a longer line
            self._shown = len(line)
            self.stream.write("\r" + line + pad + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._write(self.line(), final=True)

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
