"""deploy/: the Kubernetes manifests and the Dockerfile agree with what `isthmus server`, `isthmus
serve` and `isthmus health` accept: TF_CONFIG as Kubeflow's training operator sets it, ports, probes."""
import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time

import pytest

from .cli_models import ISTHMUS

yaml = pytest.importorskip("yaml")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K8S = os.path.join(ROOT, "deploy", "k8s")


def _docs(name):
    with open(os.path.join(K8S, name), encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def _parser(command: str) -> argparse.ArgumentParser:
    import importlib

    from isthmus.apps import cli
    p = argparse.ArgumentParser(prog=f"isthmus {command}")
    importlib.import_module(cli.COMMANDS[command][0]).add_arguments(p)
    return p


def operator_tf_config(job: dict, rtype: str, index: int, namespace: str = "default") -> dict:
    """TF_CONFIG as the training operator sets it for replica `rtype` #index of a TFJob."""
    name, cluster = job["metadata"]["name"], {}
    for rt, spec in job["spec"]["tfReplicaSpecs"].items():
        c = next(c for c in spec["template"]["spec"]["containers"] if c["name"] == "tensorflow")
        port = next(p["containerPort"] for p in c["ports"] if p["name"] == "tfjob-port")
        cluster[rt.lower()] = [f"{name}-{rt.lower()}-{i}.{namespace}.svc:{port}" for i in range(spec["replicas"])]
    return {"cluster": cluster, "task": {"type": rtype.lower(), "index": index}, "environment": "cloud"}


def test_tfjob_tf_config_ports_and_probes_are_what_isthmus_server_accepts():
    from isthmus.cloud.cluster import parse
    from isthmus.cloud.server import _resolve, bind_host
    (job,) = _docs("train-tfjob.yaml")
    assert job["kind"] == "TFJob" and job["apiVersion"] == "kubeflow.org/v1"
    for rtype, spec in job["spec"]["tfReplicaSpecs"].items():
        c = next(c for c in spec["template"]["spec"]["containers"] if c["name"] == "tensorflow")
        port = next(p["containerPort"] for p in c["ports"] if p["name"] == "tfjob-port")
        assert c["args"][0] == "server"
        args = _parser("server").parse_args(c["args"][1:])
        for i in range(spec["replicas"]):
            tf = operator_tf_config(job, rtype, i)
            cluster, tid = parse(json.dumps(tf))
            assert (tid.job, tid.index) == (rtype.lower(), i)
            old = os.environ.get("TF_CONFIG")
            os.environ["TF_CONFIG"] = json.dumps(tf)
            try:
                cl, jb, task = _resolve(args)
            finally:
                os.environ.pop("TF_CONFIG") if old is None else os.environ.__setitem__("TF_CONFIG", old)
            address = cl.address(jb, task)
            assert address.endswith(f":{port}") and (args.port in (None, port))
            assert bind_host(address) == "0.0.0.0"  # a Service name: every interface, so TLS + token below
        env = {e["name"]: e["value"] for e in c["env"]}
        assert {"ISTHMUS_TLS_CERT", "ISTHMUS_TLS_KEY", "ISTHMUS_TOKEN_FILE"} <= set(env)
        mounts = [m["mountPath"] for m in c["volumeMounts"]]
        assert all(any(v.startswith(m + "/") for m in mounts) for v in env.values())  # every file is mounted
        probe = c["readinessProbe"]["exec"]["command"]
        assert probe[:2] == ["isthmus", "health"]
        pargs = _parser("health").parse_args(probe[2:])
        assert pargs.address.endswith(f":{port}")


def test_offload_deployment_service_and_probe_agree_on_the_port():
    dep, svc = _docs("offload-service.yaml")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][0] == "serve"
    args = _parser("serve").parse_args(c["args"][1:])
    port = next(p["containerPort"] for p in c["ports"] if p["name"] == "offload")
    assert args.port == port and args.host == "0.0.0.0" and args.tls_cert and args.token_file
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    for path in (args.model, args.tls_cert, args.tls_key, args.token_file):
        assert os.path.dirname(path) in mounts, path
    probe = _parser("health").parse_args(c["readinessProbe"]["exec"]["command"][2:])
    assert probe.address.endswith(f":{port}") and probe.service == "isthmus.Offload"
    (sp,) = svc["spec"]["ports"]
    assert sp["targetPort"] == "offload" and svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_dockerfile_exposes_the_manifests_ports_and_runs_isthmus():
    text = open(os.path.join(ROOT, "deploy", "Dockerfile"), encoding="utf-8").read()
    exposed = {int(p) for line in text.splitlines() if line.startswith("EXPOSE") for p in line.split()[1:]}
    assert {2222, 7070} <= exposed
    assert 'ENTRYPOINT ["isthmus"]' in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_servers_started_from_an_operator_tf_config_pass_the_readiness_probe(tmp_path):
    """The TFJob's shape on loopback: one ps, one worker, each `isthmus server` with only TF_CONFIG,
    then the manifest's probe command (on the task's port) answers SERVING."""
    (job,) = _docs("train-tfjob.yaml")
    ports = {"ps": [_free_port()], "worker": [_free_port()]}
    cluster = {k: [f"127.0.0.1:{p}" for p in v] for k, v in ports.items()}
    procs = []
    try:
        for rtype, plist in ports.items():
            for i, _ in enumerate(plist):
                tf = {"cluster": cluster, "task": {"type": rtype, "index": i}, "environment": "cloud"}
                env = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")}
                env["TF_CONFIG"] = json.dumps(tf)
                procs.append(subprocess.Popen([*ISTHMUS, "server"], env=env,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        probe = job["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]["containers"][0]["readinessProbe"]
        for rtype, plist in ports.items():
            for p in plist:
                cmd = [a.replace("localhost:2222", f"127.0.0.1:{p}") for a in probe["exec"]["command"]]
                deadline, r = time.monotonic() + 60, None
                while time.monotonic() < deadline:
                    r = subprocess.run([*ISTHMUS, *cmd[1:]], capture_output=True,
                                       text=True, timeout=60)
                    if r.returncode == 0:
                        break
                    time.sleep(0.5)
                assert r.returncode == 0 and "SERVING" in r.stdout, (shlex.join(cmd), r.stderr)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
