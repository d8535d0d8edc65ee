import io

from isthmus.core.progress import ProgressBar


def test_plain_stream_prints_sparse_lines_and_a_final_one():
    out = io.StringIO()
    bar = ProgressBar(10, desc="train", stream=out, every_s=3600)
    for i in range(10):
        bar.update(1, loss=1.0 / (i + 1), examples=32)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1  # nothing every step, one line at the end
    assert lines[0].startswith("train [") and "10/10" in lines[0] and "loss" in lines[0] and "ex/s" in lines[0]
