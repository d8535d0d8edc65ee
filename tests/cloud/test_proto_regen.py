"""The committed proto/*_pb2*.py match their .proto sources (regenerated into a temp dir)."""
import importlib.util
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "proto"))
import regen_proto  # noqa: E402

sys.path.pop(0)

# lines that name the generating tool's version, not the schema: a newer grpcio-tools
# must not make the committed code look stale
_VERSIONS = [
    re.compile(r"^# Protobuf Python Version: .*$", re.M),
    re.compile(r"^_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)", re.M | re.S),
    re.compile(r"^GRPC_GENERATED_VERSION = .*$", re.M),
]


def _normal(text: str) -> str:
    for pat in _VERSIONS:
        text = pat.sub("<version>", text)
    return text


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None,
                    reason="grpcio-tools is not installed (pip install grpcio-tools): "
                           "cannot regenerate proto/*_pb2*.py to check that they are up to date")
def test_generated_code_is_fresh(tmp_path):
    regen_proto.generate(str(tmp_path))
    stale = []
    for name in regen_proto.generated_names():
        committed = (ROOT / "proto" / name)
        if not committed.exists():
            stale.append(f"{name} is missing")
            continue
        if _normal(committed.read_text()) != _normal((tmp_path / name).read_text()):
            stale.append(name)
    assert not stale, ("generated code is stale against the .proto sources; run "
                       "`python proto/regen_proto.py` and commit: " + ", ".join(stale))


def test_generated_imports_are_package_paths():
    for name in regen_proto.generated_names():
        text = (ROOT / "proto" / name).read_text()
        bad = re.findall(r"^import \w+_pb2\b.*$|^from (?!isthmus\.proto\b|google\b)\S+ import .*_pb2.*$",
                         text, re.M)
        assert not bad, f"{name}: top-level imports of generated modules: {bad}"


def test_generated_modules_import():
    from isthmus.proto import graph_pb2, master_pb2, master_pb2_grpc, tensor_pb2, worker_pb2, worker_pb2_grpc  # noqa: F401
    assert tensor_pb2.DataType.Value("DT_FLOAT32") == 2
    assert hasattr(worker_pb2_grpc, "WorkerStub") and hasattr(master_pb2_grpc, "MasterStub")
