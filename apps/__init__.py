"""The top layer: what ties the wings together (the command-line tools, the demo, graph-file I/O,
`deploy_split`). It may import every package of isthmus; nothing imports it (tests/test_import_direction.py).

The commands' Python faces: `deploy_split` (isthmus split), `quantize` (isthmus quantize),
`describe_file` (isthmus info), `bench` (isthmus bench), `load_model` (every model format), and
`LoadedModel`, a graph with named inputs and outputs (what deploy_split takes besides a file)."""
from .cmd_bench import bench
from .cmd_info import describe_file
from .cmd_quantize import quantize
from .deploy import deploy_split, load_profile
from .model_source import LoadedModel, load_model

__all__ = ["deploy_split", "quantize", "describe_file", "bench", "load_model", "LoadedModel", "load_profile"]
