"""Op families. Importing this package registers every op; see math.py for the pattern."""
from . import base, linalg, math, sparse, state  # noqa: F401  (registration happens on import)
