"""A small training loop: `fit` runs a train op over batches of feeds with a progress bar.

    batches = Batches({x: X_train, y: y_train}, batch_size=64, seed=0)
    history = fit(sess, train_op, loss, batches, epochs=5)

Everything here is a convenience over Session.run; nothing in it is needed to train.
`DataParallel` (core/data_parallel.py) trains one replica per GPU of a host, gradients all-reduced.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, TextIO, Union

import time

import numpy as np

from .data_parallel import DataParallel  # noqa: F401  (ism.train.DataParallel)
from .progress import ProgressBar
from .summary import log_step


class Batches:
    """Mini-batch feed dicts over equally long arrays, reshuffled on every pass (seeded).

    Iterating gives one epoch; `len()` is the number of batches in it. A last partial batch
    is kept unless `drop_last` (needed when a placeholder has a fixed batch dimension).
    """

    def __init__(self, arrays: Dict, batch_size: int, shuffle: bool = True, seed: Optional[int] = 0,
                 drop_last: bool = False):
        lengths = {len(a) for a in arrays.values()}
        if len(lengths) != 1:
            raise ValueError(f"arrays to batch have different lengths: {sorted(lengths)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.arrays = {k: np.asarray(a) for k, a in arrays.items()}
        self.n = lengths.pop()
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self._rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        full, rest = divmod(self.n, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __iter__(self):
        order = self._rng.permutation(self.n) if self.shuffle else None
        for b in range(len(self)):
            lo, hi = b * self.batch_size, min((b + 1) * self.batch_size, self.n)
            if order is None:
                yield {k: a[lo:hi] for k, a in self.arrays.items()}
            else:
                idx = order[lo:hi]
                yield {k: a[idx] for k, a in self.arrays.items()}


def _batch_len(feed: Dict) -> int:
    for v in feed.values():
        shape = getattr(v, "shape", None)
        if shape:
            return int(shape[0])
    return 0


def fit(session, train_op, loss, feeds: Union[Iterable[Dict], Callable[[], Iterable[Dict]]], epochs: int = 1,
        steps_per_epoch: Optional[int] = None, desc: str = "train", progress: bool = True,
        stream: Optional[TextIO] = None, on_epoch_end: Optional[Callable[[int, float], None]] = None,
        summary=None, metrics: Optional[Dict[str, object]] = None, histograms: Optional[Iterable] = None,
        histogram_every: int = 100) -> List[float]:
    """Run `train_op` (fetching `loss`) once per feed dict, for `epochs` passes over `feeds`.

    `feeds` is re-iterated every epoch (a Batches, a list, or a callable returning a fresh
    iterator); `steps_per_epoch` caps each pass. Returns the mean loss of each epoch;
    `on_epoch_end(epoch, mean_loss)` runs after each (to evaluate or checkpoint).

    With `summary` (a core.summary.SummaryWriter), every step writes the scalars `loss`,
    `step_time_s`, `examples_per_s` and each of `metrics` (name -> scalar tensor fetched
    with the step), and every `histogram_every` steps a histogram of each variable in
    `histograms`.
    """
    per_epoch = steps_per_epoch
    if per_epoch is None and hasattr(feeds, "__len__"):
        per_epoch = len(feeds)
    total = per_epoch * epochs if per_epoch is not None else None
    bar = ProgressBar(total, desc=desc, stream=stream) if progress else None
    history: List[float] = []
    metrics = dict(metrics or {})
    fetches = [loss, train_op] + list(metrics.values())
    histograms = list(histograms or ())
    step = 0
    try:
        for epoch in range(epochs):
            it = feeds() if callable(feeds) else feeds
            total_loss, steps = 0.0, 0
            for feed in it:
                if steps_per_epoch is not None and steps >= steps_per_epoch:
                    break
                t0 = time.perf_counter()
                out = session.run(fetches, feed)
                seconds = time.perf_counter() - t0
                value = float(out[0])
                total_loss += value
                steps += 1
                examples = _batch_len(feed)
                if bar is not None:
                    bar.update(1, loss=value, examples=examples)
                if summary is not None:
                    scalars = {"loss": value, "step_time_s": seconds,
                               "examples_per_s": examples / seconds if seconds > 0 else 0.0}
                    scalars.update({k: float(v) for k, v in zip(metrics, out[2:])})
                    log_step(summary, step, scalars,
                             histograms if histograms and step % histogram_every == 0 else None, session)
                step += 1
            if steps == 0:
                raise ValueError(f"epoch {epoch} got no feeds: pass a re-iterable (list, Batches) or a "
                                 "callable returning a fresh iterator")
            history.append(total_loss / steps)
            if on_epoch_end is not None:
                on_epoch_end(epoch, history[-1])
    finally:
        if bar is not None:
            bar.close()
        if summary is not None:
            summary.flush()
    return history
