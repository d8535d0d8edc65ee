"""The small CNN the split-export tests cut: a Session, its input, softmax output, cost model and
an adaptive planner whose cut moves three times over the bandwidth grid."""
import numpy as np

import isthmus as ism
from isthmus.partitioner.costmodel import CostModel
from isthmus.partitioner.devices import EDGE
from isthmus.partitioner.plan import AdaptivePlanner
from isthmus.partitioner.problem import Constraints
from isthmus.wire.link import LinkModel

GRID = np.logspace(5, 10, 21)


def adaptive_cnn():
    """(sess, x, y, cm, ap): conv-pool-conv-pool-conv1x1-gap-dense-softmax on (None, 3, 32, 32),
    planned over GRID for an edge 100x slower than its profile and a 1 ms round trip."""
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 3, 32, 32), name="x")
        net = ism.nn.Sequential([ism.nn.Conv2D(16, 3, activation="relu"), ism.nn.MaxPool2D(2),
                                 ism.nn.Conv2D(32, 3, activation="relu"), ism.nn.MaxPool2D(2),
                                 ism.nn.Conv2D(8, 1, activation="relu"), ism.nn.GlobalAvgPool2D(), ism.nn.Dense(10)])
        y = ism.softmax(net(x), name="y")
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    cm = CostModel.edge_cloud(LinkModel(1e6, 1e6, 1e-3), edge=EDGE.scaled(100))
    return sess, x, y, cm, AdaptivePlanner(g, cm, [y], Constraints(edge_memory_budget=None), bandwidths=GRID)
