"""Regenerate proto/*_pb2.py and proto/*_pb2_grpc.py from proto/{tensor,graph,worker,master,offload}.proto.

    python proto/regen_proto.py [--out DIR]

Generated with grpc_tools.protoc (pip install grpcio-tools) from a temporary tree in which
the sources sit at isthmus/proto/, so every generated import is the package path
`isthmus.proto.<name>_pb2`, never a top-level `<name>_pb2`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ("tensor.proto", "graph.proto", "worker.proto", "master.proto", "offload.proto")
SERVICES = ("worker.proto", "master.proto", "offload.proto")  # the sources that declare services (get a _pb2_grpc.py)


def generated_names():
    names = [s[:-len(".proto")] + "_pb2.py" for s in SOURCES]
    names += [s[:-len(".proto")] + "_pb2_grpc.py" for s in SERVICES]
    return names


def generate(out_dir: str) -> None:
    try:
        from grpc_tools import protoc  # deferred: grpcio-tools is optional, needed only to regenerate
        import grpc_tools  # deferred: grpcio-tools is optional
    except ImportError:
        raise SystemExit("grpcio-tools not found: pip install grpcio-tools") from None
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        pkg = os.path.join(tmp, "isthmus", "proto")
        os.makedirs(pkg)
        for s in SOURCES:
            shutil.copyfile(os.path.join(HERE, s), os.path.join(pkg, s))
        out = os.path.join(tmp, "out")
        os.makedirs(out)
        for s in SOURCES:
            args = ["grpc_tools.protoc", f"-I{tmp}", f"-I{well_known}", f"--python_out={out}"]
            if s in SERVICES:
                args.append(f"--grpc_python_out={out}")
            args.append(os.path.join("isthmus", "proto", s))
            rc = protoc.main(args)
            if rc != 0:
                raise SystemExit(f"protoc failed on {s} (exit {rc})")
        os.makedirs(out_dir, exist_ok=True)
        for name in generated_names():
            src = os.path.join(out, "isthmus", "proto", name)
            with open(src, encoding="utf-8") as f:
                text = f.read()
            with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
                f.write(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=HERE)
    generate(p.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
