"""TensorBoard event files: scalars, histograms and the graph, written with tensorboardX.

    with SummaryWriter("runs/mlp") as tb:
        tb.graph(g)                                  # the Graphs tab
        fit(sess, train_op, loss, batches, epochs=5, summary=tb,
            metrics={"accuracy": acc}, histograms=ism.trainable_variables(g))
    # tensorboard --logdir runs

tensorboardX (a maintained writer, no TensorFlow needed) is imported when a writer is
made, not with isthmus; without it the error says how to install it. Files are the
standard `events.out.tfevents.*` records, so TensorBoard and any TFRecord reader read them.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional

import numpy as np

from .graph import Graph

# TensorFlow's DataType enum values (types.proto), for the graph view's dtype labels.
_TF_DTYPES = {"float32": 1, "float64": 2, "int32": 3, "uint8": 4, "int16": 5, "int8": 6, "int64": 9,
              "bool": 10, "float16": 19}


def _tensorboardx():
    try:
        import tensorboardX  # deferred: tensorboardX is optional (its ImportError is handled)
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("TensorBoard logging needs tensorboardX: pip install 'isthmus[tensorboard]' "
                          "(or pip install tensorboardX)") from e
    return tensorboardX


class SummaryWriter:
    """Writes one run's event file under `logdir` (created if missing).

    `scalar(tag, value, step)`, `histogram(tag, values, step)`, `graph(graph)`; `flush()`
    and `close()` (also as a context manager). Steps are the caller's (global step).
    """

    def __init__(self, logdir: str, flush_secs: int = 10):
        self.logdir = str(logdir)
        self._w = _tensorboardx().SummaryWriter(logdir=self.logdir, flush_secs=flush_secs)

    def scalar(self, tag: str, value: float, step: int) -> None:
        self._w.add_scalar(tag, float(value), int(step))

    def histogram(self, tag: str, values, step: int) -> None:
        values = np.asarray(values)
        if values.size == 0:
            return  # TensorBoard cannot draw an empty histogram
        self._w.add_histogram(tag, values.astype(np.float64, copy=False).ravel(), int(step))

    def graph(self, graph: Graph) -> None:
        """The graph as TensorBoard draws it: name scopes become boxes, edges carry shapes."""
        self._w._get_file_writer().add_onnx_graph(graph_proto(graph))

    def flush(self) -> None:
        self._w.flush()

    def close(self) -> None:
        self._w.close()

    def __enter__(self) -> "SummaryWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def graph_proto(graph: Graph):
    """TensorBoard's GraphDef for `graph` (top level; a control-flow node is one box)."""
    # deferred: tensorboardX is a heavy or optional dependency
    from tensorboardX.proto import attr_value_pb2, graph_pb2, node_def_pb2, tensor_shape_pb2

    def shape_proto(shape) -> "tensor_shape_pb2.TensorShapeProto":
        if shape is None:
            return tensor_shape_pb2.TensorShapeProto(unknown_rank=True)
        return tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=-1 if d is None else int(d)) for d in shape])

    nodes = []
    for node in graph:
        inputs = [t.node.name if t.index == 0 else f"{t.node.name}:{t.index}" for t in node.inputs]
        inputs += ["^" + c.name for c in node.control_inputs]
        attr = {"_output_shapes": attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            shape=[shape_proto(t.shape) for t in node.outputs]))}
        if node.outputs:
            attr["T"] = attr_value_pb2.AttrValue(type=_TF_DTYPES.get(np.dtype(node.outputs[0].dtype).name, 0))
        nodes.append(node_def_pb2.NodeDef(name=node.name, op=node.op, input=inputs,
                                          device=node.device or "", attr=attr))
    return graph_pb2.GraphDef(node=nodes)


def log_step(writer: SummaryWriter, step: int, scalars: Dict[str, float],
             histograms: Optional[Iterable] = None, session=None) -> None:
    """Scalars for one step, and histograms of `histograms` (variables) read from `session`."""
    for tag, value in scalars.items():
        writer.scalar(tag, value, step)
    if histograms and session is not None:
        for var in histograms:
            node = getattr(var, "node", var)
            writer.histogram(node.name, session.variable_value(node), step)
