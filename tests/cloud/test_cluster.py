"""Cluster specs in every accepted form (dict, JSON, file, compact string, env var, TF_CONFIG)."""
import json

import pytest

from isthmus.cloud.cluster import ClusterSpec, ClusterSpecError, TaskId, from_env, parse

JOBS = {"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "host-b.example:2223"]}


def test_forms_agree(tmp_path):
    want = ClusterSpec(JOBS)
    f = tmp_path / "cluster.json"
    f.write_text(json.dumps(JOBS))
    tf = {"cluster": JOBS, "task": {"type": "worker", "index": 1}}
    assert ClusterSpec.parse(json.dumps(JOBS)) == want
    assert ClusterSpec.parse(str(f)) == want
    assert ClusterSpec.parse("ps=10.0.0.1:2222; worker=10.0.0.2:2222,host-b.example:2223") == want
    assert ClusterSpec({"ps": "10.0.0.1:2222", "worker": {"1": "host-b.example:2223", "0": "10.0.0.2:2222"}}) == want
    cluster, task = parse(json.dumps(tf))
    assert cluster == want and task == TaskId("worker", 1) and task.name == "/job:worker/task:1"
    assert parse(JOBS) == (want, None)
    assert want.address("worker", 1) == "host-b.example:2223" and want.num_tasks("worker") == 2
    assert [t.name for t, _ in want.tasks()] == ["/job:ps/task:0", "/job:worker/task:0", "/job:worker/task:1"]
    assert want.task_of("/job:worker/task:1/device:CPU:0") == TaskId("worker", 1)
    assert want.task_of("/job:ps") == TaskId("ps", 0)
    assert ClusterSpec.parse(want.to_json()) == want


def test_environment():
    assert from_env({}) is None
    tf = json.dumps({"cluster": JOBS, "task": {"type": "ps", "index": 0}})
    assert from_env({"TF_CONFIG": tf}) == (ClusterSpec(JOBS), TaskId("ps", 0))
    got = from_env({"ISTHMUS_CLUSTER": "worker=127.0.0.1:5000", "TF_CONFIG": tf})
    assert got == (ClusterSpec({"worker": ["127.0.0.1:5000"]}), None)
    with pytest.raises(ClusterSpecError, match=r"\$TF_CONFIG: .*not valid JSON"):
        from_env({"TF_CONFIG": "{nope"})
    assert ClusterSpec.from_env({"TF_CONFIG": tf}) == ClusterSpec(JOBS)


@pytest.mark.parametrize("spec, match", [
    ({}, "maps job names"),
    ({"ps": []}, "needs a list"),
    ({"bad job": ["a:1"]}, "malformed job name"),
    ({"ps": ["nohostport"]}, "malformed address"),
    ({"ps": ["a:99999"]}, "out of range"),
    ({"ps": ["a:1"], "worker": ["a:1"]}, "given to both /job:ps/task:0 and /job:worker/task:0"),
    ({"worker": {"0": "a:1", "2": "a:2"}}, "number its tasks"),
    ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "worker", "index": 0}}', "no job 'worker'"),
    ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 3}}', "no task 3"),
    ('{"cluster": {"ps": ["a:1"]}, "task": "ps"}', "TF_CONFIG task"),
    ("/no/such/file", "neither JSON"),
    ("ps:a:1", "neither JSON"),
    ("ps", "neither JSON"),
    ("", "empty"),
    (42, "got int"),
])
def test_malformed_specs_are_refused_clearly(spec, match):
    with pytest.raises(ClusterSpecError, match=match):
        parse(spec)


def test_lookups_name_what_is_missing():
    c = ClusterSpec(JOBS)
    with pytest.raises(ClusterSpecError, match="no job 'chief'; jobs: ps, worker"):
        c.address("chief", 0)
    with pytest.raises(ClusterSpecError, match="job 'worker' has 2 task"):
        c.task_of("/job:worker/task:2")
    with pytest.raises(ClusterSpecError, match="names no job"):
        c.task_of("/device:CPU:0")
