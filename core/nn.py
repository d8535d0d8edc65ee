"""isthmus.nn: layers, losses and metrics over the core ops.

A layer creates its Variables on its first call (from the input's static shape) and reuses
them on later calls, so one layer object serves a training and an inference branch. Weights
are drawn at graph-construction time from a numpy Generator seeded by the layer's seed
(default: derived from its name), so a graph built twice starts from the same numbers.
"""
from __future__ import annotations

import zlib
from typing import Callable, List, Optional, Sequence, Union

import numpy as np

from . import ops as _ops  # noqa: F401  (registers the ops)
from .errors import ShapeError
from .graph import Tensor, get_default_graph
from .ops.array import flatten as _flatten
from .ops.base import convert
from .ops.conv import conv2d
from .ops.linalg import bias_add, matmul
from .ops.math import cast, equal, gelu, relu, relu6, sigmoid, square, sub, tanh
from .ops.nn import batch_norm, dropout as _dropout, layer_norm, softmax, softmax_cross_entropy as _xent
from .ops.nn import sparse_softmax_cross_entropy as _sparse_xent
from .ops.pool import avg_pool, global_avg_pool, max_pool
from .ops.reduce import argmax, reduce_mean
from .ops.sparse import gather
from .optimizers import UPDATE_OPS
from .rnn import GRUCell, LSTMCell, RNNCell, dynamic_rnn  # noqa: F401  (part of isthmus.nn)
from .variables import Variable

ACTIVATIONS = {None: None, "linear": None, "relu": relu, "relu6": relu6, "tanh": tanh, "sigmoid": sigmoid,
               "gelu": gelu, "softmax": softmax}


def activation(name: Union[str, Callable, None]) -> Optional[Callable]:
    if callable(name):
        return name
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; known: {sorted(k for k in ACTIVATIONS if k)}")
    return ACTIVATIONS[name]


# ---- initializers ----------------------------------------------------------------------------------
def glorot_uniform(rng, shape, fan_in, fan_out):
    lim = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-lim, lim, shape)


def he_normal(rng, shape, fan_in, fan_out):
    return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)


def zeros(rng, shape, fan_in, fan_out):
    return np.zeros(shape)


def ones(rng, shape, fan_in, fan_out):
    return np.ones(shape)


INITIALIZERS = {"glorot_uniform": glorot_uniform, "he_normal": he_normal, "zeros": zeros, "ones": ones}


def initializer(name: Union[str, Callable]) -> Callable:
    """An initializer by name, or a callable `f(rng, shape, fan_in, fan_out) -> array` as is."""
    if callable(name):
        return name
    if name not in INITIALIZERS:
        raise ValueError(f"unknown initializer {name!r}; known: {sorted(INITIALIZERS)}")
    return INITIALIZERS[name]


class Layer:
    def __init__(self, name: Optional[str] = None, seed: Optional[int] = None):
        self._base_name = name or type(self).__name__.lower()
        self.name: Optional[str] = None
        self.seed = seed
        self.variables: List[Variable] = []
        self.built = False

    @property
    def trainable_variables(self) -> List[Variable]:
        return [v for v in self.variables if v.trainable]

    def _rng(self) -> np.random.Generator:
        seed = self.seed if self.seed is not None else zlib.crc32(self.name.encode())
        return np.random.default_rng(seed)

    def _var(self, suffix: str, value: np.ndarray, dtype, trainable: bool = True) -> Variable:
        # self.name already carries the enclosing name scope: name the variable absolutely
        with get_default_graph().name_scope(self.name + "/"):
            v = Variable(np.asarray(value, dtype=dtype), name=suffix, trainable=trainable)
        self.variables.append(v)
        return v

    def __call__(self, x, training: bool = False):
        x = convert(x)
        g = x.graph
        with g.as_default():  # variables go where the input lives, whatever the default graph
            if not self.built:
                self.name = g.unique_name(self._base_name)
                self.build(x)
                self.built = True
            elif self.variables and self.variables[0].graph is not g:
                raise ShapeError(f"layer '{self.name}' was built in another graph than input '{x.name}'")
            return self.call(x, training)

    def build(self, x: Tensor) -> None:
        pass

    def call(self, x: Tensor, training: bool) -> Tensor:
        raise NotImplementedError


class Dense(Layer):
    def __init__(self, units: int, activation=None, use_bias: bool = True, kernel_initializer: str = "glorot_uniform",
                 name: Optional[str] = None, seed: Optional[int] = None):
        super().__init__(name or "dense", seed)
        self.units, self.act, self.use_bias = units, globals()["activation"](activation), use_bias
        self.init = initializer(kernel_initializer)

    def build(self, x):
        n_in = x.shape[-1]
        if n_in is None:
            raise ShapeError(f"Dense '{self.name}' needs a known last input dim, got {x.shape}")
        rng = self._rng()
        self.kernel = self._var("kernel", self.init(rng, (n_in, self.units), n_in, self.units), x.dtype)
        self.bias = self._var("bias", np.zeros(self.units), x.dtype) if self.use_bias else None

    def call(self, x, training):
        y = matmul(x, self.kernel)
        if self.bias is not None:
            y = bias_add(y, self.bias)
        return self.act(y) if self.act else y


def _pair(v) -> tuple:
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else tuple(int(a) for a in v)


class Conv2D(Layer):
    """NCHW convolution; weights OIHW."""

    def __init__(self, filters: int, kernel_size, strides=1, padding="SAME", dilation=1, groups: int = 1,
                 activation=None, use_bias: bool = True, kernel_initializer: str = "he_normal",
                 name: Optional[str] = None, seed: Optional[int] = None):
        super().__init__(name or "conv2d", seed)
        self.filters, self.kernel_size, self.strides = filters, _pair(kernel_size), _pair(strides)
        self.padding, self.dilation, self.groups = padding, _pair(dilation), groups
        self.act, self.use_bias = globals()["activation"](activation), use_bias
        self.init = initializer(kernel_initializer)

    def build(self, x):
        if len(x.shape) != 4 or x.shape[1] is None:
            raise ShapeError(f"Conv2D '{self.name}' needs NCHW input with known channels, got {x.shape}")
        c = x.shape[1]
        if c % self.groups or self.filters % self.groups:
            raise ShapeError(f"Conv2D '{self.name}': {c} channels and {self.filters} filters must divide by groups={self.groups}")
        kh, kw = self.kernel_size
        fan_in = c // self.groups * kh * kw
        shape = (self.filters, c // self.groups, kh, kw)
        self.kernel = self._var("kernel", self.init(self._rng(), shape, fan_in, self.filters * kh * kw), x.dtype)
        self.bias = self._var("bias", np.zeros(self.filters), x.dtype) if self.use_bias else None

    def call(self, x, training):
        y = conv2d(x, self.kernel, strides=self.strides, padding=self.padding, dilations=self.dilation, groups=self.groups)
        if self.bias is not None:
            y = bias_add(y, self.bias, axis=1)
        return self.act(y) if self.act else y


class DepthwiseConv2D(Conv2D):
    """One filter (or `depth_multiplier` filters) per input channel."""

    def __init__(self, kernel_size, depth_multiplier: int = 1, strides=1, padding="SAME", dilation=1,
                 activation=None, use_bias: bool = True, name: Optional[str] = None, seed: Optional[int] = None):
        super().__init__(0, kernel_size, strides, padding, dilation, 1, activation, use_bias, "he_normal",
                         name or "depthwise_conv2d", seed)
        self.depth_multiplier = depth_multiplier

    def build(self, x):
        c = x.shape[1]
        if c is None:
            raise ShapeError(f"DepthwiseConv2D '{self.name}' needs known channels, got {x.shape}")
        self.filters, self.groups = c * self.depth_multiplier, c
        super().build(x)


class BatchNorm(Layer):
    """Batch statistics when called with training=True, moving statistics otherwise.

    A training-mode call builds the moving-average updates
    (moving = momentum * moving + (1 - momentum) * batch statistic) and puts them in the graph
    collection "update_ops" (optimizers.UPDATE_OPS), which Optimizer.minimize groups into the
    step it returns; `layer.updates` holds the same ops for callers that use apply_gradients or
    run them on their own.
    """

    def __init__(self, axis: Optional[int] = None, momentum: float = 0.99, epsilon: float = 1e-3,
                 name: Optional[str] = None):
        super().__init__(name or "batch_norm")
        self.axis, self.momentum, self.epsilon = axis, momentum, epsilon
        self.updates: list = []

    def build(self, x):
        self._axis = self.axis if self.axis is not None else (1 if len(x.shape) == 4 else -1)
        c = x.shape[self._axis]
        if c is None:
            raise ShapeError(f"BatchNorm '{self.name}' needs a known channel dim, got {x.shape}")
        self.gamma = self._var("gamma", np.ones(c), x.dtype)
        self.beta = self._var("beta", np.zeros(c), x.dtype)
        self.moving_mean = self._var("moving_mean", np.zeros(c), x.dtype, trainable=False)
        self.moving_variance = self._var("moving_variance", np.ones(c), x.dtype, trainable=False)

    def call(self, x, training):
        args = (x, self.gamma, self.beta, self.moving_mean, self.moving_variance, self.epsilon)
        if not training:
            return batch_norm(*args, training=False, axis=self._axis)
        y, mean, var = batch_norm(*args, training=True, axis=self._axis)
        m = self.momentum
        g = x.graph
        for mv, stat in ((self.moving_mean, mean), (self.moving_variance, var)):
            upd = mv.assign(mv * m + stat * (1.0 - m))
            g.add_to_collection(UPDATE_OPS, upd.node)
            self.updates.append(upd.node)
        return y


class LayerNorm(Layer):
    def __init__(self, axis: int = -1, epsilon: float = 1e-5, name: Optional[str] = None):
        super().__init__(name or "layer_norm")
        self.axis, self.epsilon = axis, epsilon

    def build(self, x):
        shape = tuple(x.shape[self.axis:])  # normalised over axis..last, as the LayerNorm op does
        if any(d is None for d in shape):
            raise ShapeError(f"LayerNorm '{self.name}' needs known normalised dims, got {x.shape}")
        self.gamma = self._var("gamma", np.ones(shape), x.dtype)
        self.beta = self._var("beta", np.zeros(shape), x.dtype)

    def call(self, x, training):
        return layer_norm(x, self.gamma, self.beta, axis=self.axis, epsilon=self.epsilon)


class Embedding(Layer):
    """Row lookup; its gradient is row-sparse, so optimizers update only the rows used."""

    def __init__(self, vocab_size: int, dim: int, name: Optional[str] = None, seed: Optional[int] = None,
                 dtype="float32"):
        super().__init__(name or "embedding", seed)
        self.vocab_size, self.dim, self.dtype = vocab_size, dim, np.dtype(dtype)

    def build(self, ids):
        self.embeddings = self._var("embeddings", self._rng().uniform(-0.05, 0.05, (self.vocab_size, self.dim)), self.dtype)

    def call(self, ids, training):
        return gather(self.embeddings, ids)


class Dropout(Layer):
    def __init__(self, rate: float, seed: Optional[int] = None, name: Optional[str] = None):
        super().__init__(name or "dropout", seed)
        self.rate = rate

    def call(self, x, training):
        return _dropout(x, self.rate, seed=self.seed) if training and self.rate > 0 else x


class Flatten(Layer):
    def call(self, x, training):
        return _flatten(x)


class MaxPool2D(Layer):
    def __init__(self, pool_size=2, strides=None, padding: str = "VALID", name: Optional[str] = None):
        super().__init__(name or "max_pool")
        self.pool, self.strides, self.padding = pool_size, strides or pool_size, padding

    def call(self, x, training):
        return max_pool(x, self.pool, self.strides, self.padding)


class AvgPool2D(MaxPool2D):
    def call(self, x, training):
        return avg_pool(x, self.pool, self.strides, self.padding)


class GlobalAvgPool2D(Layer):
    def call(self, x, training):
        return global_avg_pool(x)


class Sequential(Layer):
    def __init__(self, layers: Sequence, name: Optional[str] = None):
        super().__init__(name or "sequential")
        self.layers = list(layers)

    def __call__(self, x, training: bool = False):
        for layer in self.layers:
            x = layer(x, training=training) if isinstance(layer, Layer) else layer(x)
        self.variables = [v for layer in self.layers if isinstance(layer, Layer) for v in layer.variables]
        return x


# ---- losses and metrics -------------------------------------------------------------------------
def sparse_softmax_cross_entropy(labels, logits) -> Tensor:
    """Mean cross-entropy of integer labels against logits."""
    return reduce_mean(_sparse_xent(labels, logits))


def softmax_cross_entropy(labels, logits) -> Tensor:
    return reduce_mean(_xent(labels, logits))


def mse(targets, predictions) -> Tensor:
    return reduce_mean(square(sub(predictions, targets)))


def accuracy(labels, logits) -> Tensor:
    """Fraction of rows whose arg-max logit is the label."""
    labels = convert(labels)
    pred = argmax(logits, -1, output_type=labels.dtype)
    return reduce_mean(cast(equal(pred, labels), "float32"))
