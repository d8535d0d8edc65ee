"""Op families. Importing this package registers every op; see math.py for the pattern."""
from . import base, math, linalg, sparse, state, fused  # noqa: F401  (registration happens on import)
from . import array, fill, array_dynamic, reduce, random, nn, conv, pool, training, control  # noqa: F401
from . import conv_residual  # noqa: F401  (FusedConv2DAdd, made by the fusion pass)
from . import pad_dynamic, bitwise, selection, spectral  # noqa: F401  (ONNX Pad with run-time pads, bitwise ops, CumProd/Unique/NMS, DFT/STFT)
from . import comm  # noqa: F401
from . import image, arange, recurrent, numerics  # noqa: F401
from . import device_copy  # noqa: F401
from . import activation, pointwise, indexing, ordering, normalization, quantization, conv_transpose, attention, einsum  # noqa: F401  (issue 20)
from . import det  # noqa: F401  (ONNX Det)
