"""The progress bar (terminal and log modes, with a fake clock) and the small fit loop."""
import io

import numpy as np
import pytest

import isthmus as ism
from isthmus.core.progress import ProgressBar
from isthmus.core.train import Batches, fit


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_plain_stream_prints_sparse_lines_and_a_final_one():
    out = io.StringIO()
    bar = ProgressBar(10, desc="train", stream=out, every_s=3600)
    for i in range(10):
        bar.update(1, loss=1.0 / (i + 1), examples=32)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1  # nothing every step, one line at the end
    assert lines[0].startswith("train [") and "10/10" in lines[0] and "loss" in lines[0] and "ex/s" in lines[0]


def test_log_mode_prints_one_line_every_interval_with_rate_and_eta():
    out, clock = io.StringIO(), Clock()
    bar = ProgressBar(100, desc="fit", stream=out, every_s=5.0, clock=clock, smoothing=1.0)
    for i in range(40):
        clock.t += 0.5  # 2 steps/s, 64 examples per step
        bar.update(1, loss=2.0, examples=64)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4  # at 5, 10, 15 and 20 s
    assert "[##-" in lines[0] and "10/100" in lines[0] and "loss 2.0000" in lines[0] and "128 ex/s" in lines[0]
    assert "eta 00:45" in lines[0]  # 90 steps left at 2 steps/s
    for _ in range(60):
        bar.update(1)
    bar.close()  # done: the last line shows the elapsed time instead of an ETA
    assert out.getvalue().splitlines()[-1].endswith(" 00:20") and "100/100" in out.getvalue().splitlines()[-1]


def test_terminal_mode_redraws_one_line():
    out, clock = Tty(), Clock()
    with ProgressBar(3, stream=out, clock=clock, redraw_s=0.1) as bar:
        for _ in range(3):
            clock.t += 1.0
            bar.update(1)
    text = out.getvalue()
    assert text.count("\r") == 4 and text.count("\n") == 1 and text.endswith("\n")
    assert "3/3" in text.split("\r")[-1] and "it/s" in text


def test_unknown_total_shows_count_without_eta():
    out = io.StringIO()
    bar = ProgressBar(None, stream=out)
    bar.update(5)
    bar.close()
    line = out.getvalue().strip()
    assert line.startswith("5 ") and "eta" not in line and "[" not in line


def test_batches_cover_every_example_once_per_epoch():
    x = np.arange(10)
    b = Batches({"x": x}, batch_size=4, seed=0)
    assert len(b) == 3
    e1 = np.concatenate([f["x"] for f in b])
    e2 = np.concatenate([f["x"] for f in b])
    assert sorted(e1) == list(range(10)) and sorted(e2) == list(range(10)) and list(e1) != list(e2)
    assert len(Batches({"x": x}, 4, drop_last=True)) == 2
    with pytest.raises(ValueError, match="different lengths"):
        Batches({"x": x, "y": x[:3]}, 2)


def test_fit_trains_and_reports():
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((64, 3)).astype(np.float32)
    yv = (xv @ np.array([1.0, -2.0, 0.5], np.float32))[:, None]
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 3))
        y = ism.placeholder("float32", (None, 1))
        loss = ism.nn.mse(y, ism.nn.Dense(1, seed=0)(x))
        train = ism.optimizers.SGD(0.1).minimize(loss)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
    out, seen = io.StringIO(), []
    history = fit(sess, train, loss, Batches({x: xv, y: yv}, 16), epochs=5, stream=out,
                  on_epoch_end=lambda e, l: seen.append(e))
    assert len(history) == 5 and history[-1] < history[0] * 0.1 and seen == [0, 1, 2, 3, 4]
    assert "20/20" in out.getvalue()
    with pytest.raises(ValueError, match="epoch 1 got no feeds"):
        fit(sess, train, loss, iter([{x: xv, y: yv}]), epochs=2, progress=False)
