"""Suite-wide test order: the modules whose single tests run longest go first, so that two workers
(pyproject's `-n`) finish together instead of one running the demo alone at the end."""

# Modules holding one test of 20 s or more in a clean clone (a subprocess demo, a chain of CLI
# subprocesses, the first compile of many kernels), longest first. Order only: every test still runs,
# each module's tests in their own order, so module-scoped fixtures are still built once.
LONG_FIRST = (
    "tests/test_examples.py",            # `isthmus demo` quick run: 76 s cold, load 3.5
    "tests/converters/test_onnx_edge.py",  # MobileNetV2 int8 as QDQ, op by op: 41 s
    "tests/test_cli_docs.py",            # every documented command line, one module fixture: 74 s in all
    "tests/test_cli_e2e.py",             # the four commands as subprocesses: 21 s
    "tests/apps/test_graph_io.py",       # a TFLite CNN through three formats: 20 s
)


def pytest_collection_modifyitems(session, config, items):
    """LONG_FIRST's modules ahead of the rest; a stable sort keeps every other order as collected."""
    rank = {path: i for i, path in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
