"""Suite-wide setup for parallel workers: the longest modules first (so two workers finish together),
and numba's disk-cache writes serialized between the workers' processes (jit/cache_lock.py); tests
marked `cpu` (the CPU's own kernels and thread scheduling) keep their sessions on the CPU when the
suite runs with ISTHMUS_DEVICE=gpu (the whole suite on the stand-in or a real GPU)."""
import pytest

from isthmus.jit import cache_lock

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


def pytest_configure(config):
    """numba's cache writes locked in the test processes before any kernel compiles (the library
    installs the same lock at jit.available(); tests may compile before that)."""
    cache_lock.install()


@pytest.fixture(autouse=True)
def _cpu_marked_tests_on_the_cpu(request, monkeypatch):
    if request.node.get_closest_marker("cpu") is not None:
        monkeypatch.delenv("ISTHMUS_DEVICE", raising=False)
