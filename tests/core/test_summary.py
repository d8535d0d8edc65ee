"""TensorBoard event files written by fit() and SummaryWriter, read back record by record.

The reader here is written from the TFRecord format (length, masked CRC-32C of the length,
payload, masked CRC-32C of the payload) and parses each payload as TensorBoard's Event,
so a file TensorBoard could not read fails these tests.
"""
import glob
import struct

import numpy as np
import pytest

pytest.importorskip("tensorboardX")
from tensorboardX.proto import event_pb2, graph_pb2  # noqa: E402

import isthmus as ism  # noqa: E402
from isthmus.core import nn  # noqa: E402
from isthmus.core.summary import SummaryWriter  # noqa: E402
from isthmus.core.train import Batches, fit  # noqa: E402


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def _masked_crc(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_events(logdir):
    files = glob.glob(f"{logdir}/events.out.tfevents.*")
    assert len(files) == 1, files
    data = open(files[0], "rb").read()
    events, pos = [], 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[pos + 8:pos + 12])[0] == _masked_crc(header)
        payload = data[pos + 12:pos + 12 + length]
        assert struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])[0] == _masked_crc(payload)
        events.append(event_pb2.Event.FromString(payload))
        pos += 16 + length
    return events


def _model():
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder(ism.float32, [None, 4], name="x")
        y = ism.placeholder(ism.int32, [None], name="y")
        with ism.name_scope("net"):
            logits = nn.Dense(3, name="out")(x)
        loss = nn.sparse_softmax_cross_entropy(y, logits)
        acc = nn.accuracy(y, logits)
        train = ism.optimizers.SGD(0.1).minimize(loss)
        init = ism.global_variables_initializer()
    return g, x, y, loss, acc, train, init


def test_fit_writes_scalars_histograms_and_graph(tmp_path):
    g, x, y, loss, acc, train, init = _model()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 4)).astype(np.float32)
    Y = (X[:, 0] > 0).astype(np.int32)
    sess = ism.Session(g)
    sess.run(init)
    with SummaryWriter(str(tmp_path)) as tb:
        tb.graph(g)
        history = fit(sess, train, loss, Batches({x: X, y: Y}, batch_size=10, seed=0), epochs=2,
                      progress=False, summary=tb, metrics={"accuracy": acc},
                      histograms=ism.trainable_variables(g), histogram_every=4)
    events = read_events(tmp_path)
    assert events[0].file_version == "brain.Event:2"

    scalars = {}
    for e in events:
        for v in e.summary.value:
            if v.HasField("simple_value"):
                scalars.setdefault(v.tag, []).append((e.step, v.simple_value))
    assert set(scalars) == {"loss", "accuracy", "step_time_s", "examples_per_s"}
    assert [s for s, _ in scalars["loss"]] == list(range(8))
    # the mean of the logged losses of each epoch is what fit returned
    losses = [v for _, v in scalars["loss"]]
    np.testing.assert_allclose([np.mean(losses[:4]), np.mean(losses[4:])], history, rtol=1e-6)
    assert all(0.0 <= v <= 1.0 for _, v in scalars["accuracy"])
    assert all(v > 0 for _, v in scalars["examples_per_s"])

    hists = [(e.step, v.tag, v.histo) for e in events for v in e.summary.value if v.HasField("histo")]
    kernel = [h for h in hists if h[1].endswith("kernel")]
    assert [s for s, _, _ in kernel] == [0, 4]  # every 4th step
    final_kernel = sess.variable_value(next(v for v in ism.trainable_variables(g) if v.name.startswith("net/out/kernel")))
    assert kernel[-1][2].num == final_kernel.size

    graphs = [graph_pb2.GraphDef.FromString(e.graph_def) for e in events if e.graph_def]
    assert len(graphs) == 1
    names = {n.name: n for n in graphs[0].node}
    assert set(names) == {n.name for n in g}
    matmul = next(n for n in g if n.op == "MatMul")
    nd = names[matmul.name]
    assert nd.op == "MatMul" and [i.split(":")[0] for i in nd.input] == [t.node.name for t in matmul.inputs]
    shape = nd.attr["_output_shapes"].list.shape[0]
    assert [d.size for d in shape.dim] == [-1, 3]


def test_empty_histogram_is_skipped_and_writer_closes(tmp_path):
    with SummaryWriter(str(tmp_path)) as tb:
        tb.histogram("nothing", np.zeros((0,)), 0)
        tb.scalar("x", 2.5, 7)
    events = read_events(tmp_path)
    values = [(e.step, v.tag, v.simple_value) for e in events for v in e.summary.value]
    assert values == [(7, "x", 2.5)]
