"""Small models the CLI tests write to files: an ONNX CNN worth splitting, and its sample data."""
import sys

import numpy as np


def cnn_onnx(path: str, res: int = 48, seed: int = 0) -> None:
    """A CNN whose cheap stem shrinks the image 16x before a heavier body (so a split can win),
    exported to ONNX at IR 10 with a dynamic batch."""
    import onnx

    import isthmus as ism
    from isthmus import nn
    from isthmus.converters import to_onnx
    g = ism.Graph(seed=seed)
    with g.as_default():
        x = ism.placeholder("float32", (None, 1, res, res), name="image")
        net = nn.Sequential([nn.Conv2D(4, 3, strides=2, padding="SAME", activation="relu"), nn.MaxPool2D(2),
                             nn.Conv2D(64, 3, padding="SAME", activation="relu"),
                             nn.Conv2D(128, 3, padding="SAME", activation="relu"), nn.MaxPool2D(2),
                             nn.Conv2D(128, 3, padding="SAME", activation="relu"),
                             nn.GlobalAvgPool2D(), nn.Dense(10)])
        y = net(x, training=False)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    model = to_onnx(sess, [y])
    model.ir_version = 10
    onnx.save(model, path)


def images(n: int, res: int = 48, seed: int = 0) -> np.ndarray:
    """n smooth random images in [0, 1], [n, 1, res, res] float32."""
    rng = np.random.default_rng(seed)
    small = rng.random((n, 1, res // 8, res // 8)).astype(np.float32)
    return np.repeat(np.repeat(small, 8, axis=2), 8, axis=3)


# the `isthmus` command as a subprocess (one place to change when the entry point moves)
ISTHMUS = [sys.executable, "-m", "isthmus"]
