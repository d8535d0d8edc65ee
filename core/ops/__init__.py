"""Op families. Importing this package registers every op; see math.py for the pattern."""
from . import base, math, linalg, sparse, state, fused  # noqa: F401  (registration happens on import)
from . import array, reduce, random, nn, conv, training, control  # noqa: F401
from . import comm  # noqa: F401
from . import image, arange, recurrent, numerics  # noqa: F401
