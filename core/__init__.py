"""isthmus.core: the graph IR, op registry, executor, autodiff, variables and training."""
from . import dtypes
from .dtypes import bool_, float16, float32, float64, int8, int16, int32, int64, uint8
from .errors import (CheckpointError, ExecutionError, FeedError, GraphError, IsthmusError,
                     OpNotFoundError, ShapeError)
from .graph import (Graph, Node, Tensor, control_dependencies, device, get_default_graph,
                    name_scope, reset_default_graph)
from . import ops, registry
from .ops.base import constant, convert as convert_to_tensor, group, identity, no_op, placeholder, stop_gradient
from .ops.math import *  # noqa: F401,F403
from .ops.math import abs, pow  # noqa: A004
from .ops.linalg import bias_add, matmul
from .ops.sparse import IndexedSlices, gather
from .ops.array import *  # noqa: F401,F403  (each family lists its public functions in __all__)
from .ops.fill import *  # noqa: F401,F403
from .ops.array_dynamic import *  # noqa: F401,F403
from .ops.reduce import *  # noqa: F401,F403
from .ops.random import *  # noqa: F401,F403
from .ops.nn import *  # noqa: F401,F403
from .ops.conv import *  # noqa: F401,F403
from .ops.pool import *  # noqa: F401,F403
from .ops.activation import *  # noqa: F401,F403
from .ops.pointwise import *  # noqa: F401,F403
from .ops.indexing import *  # noqa: F401,F403
from .ops.ordering import *  # noqa: F401,F403
from .ops.normalization import *  # noqa: F401,F403
from .ops.quantization import *  # noqa: F401,F403
from .ops.conv_transpose import *  # noqa: F401,F403
from .ops.attention import *  # noqa: F401,F403
from .ops.einsum import einsum  # noqa: F401
from .ops.control import cond, while_loop
from .variables import (Variable, global_variables, global_variables_initializer, trainable_variables,
                        variables_initializer)
from .autodiff import gradients
from .session import Session
from . import checkpoint, nn, optimizers, passes, progress, rnn, summary, train  # noqa: E402  (subsystems over the core)
from .checkpoint import Saver, latest_checkpoint  # noqa: E402
from .passes import freeze  # noqa: E402
from .trace import RunMetadata, RunOptions  # noqa: E402
