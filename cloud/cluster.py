"""Cluster specs: which jobs exist, and the address of each of their tasks.

A spec is accepted in the shapes the launchers that start TensorFlow clusters already
write, so they start isthmus unchanged:

- a dict (or its JSON) `{"ps": ["host:port"], "worker": ["host:port", "host:port"]}`
  (a job may also map task indices to addresses: `{"worker": {"0": "host:port"}}`);
- TF_CONFIG's shape `{"cluster": {...}, "task": {"type": "worker", "index": 0}}`, whose
  task names the process's own job and index;
- a compact string `ps=host:port;worker=host:port,host:port`;
- a path to a file holding any JSON form above.

`from_env()` reads ISTHMUS_CLUSTER (any form above), then TF_CONFIG.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Dict, Iterator, List, Mapping, Optional, Tuple, Union

ENV_VAR = "ISTHMUS_CLUSTER"
TF_CONFIG = "TF_CONFIG"
_JOB = re.compile(r"^[A-Za-z_][\w-]*$")
_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[\w.-]+):(\d{1,5})$")


class ClusterSpecError(ValueError):
    """A cluster spec is malformed, or names a job or task it does not have."""


@dataclass(frozen=True)
class TaskId:
    job: str
    index: int

    @property
    def name(self) -> str:
        return f"/job:{self.job}/task:{self.index}"

    def __str__(self) -> str:
        return self.name


class ClusterSpec:
    """jobs -> task addresses (a list indexed by task). Immutable once built."""

    def __init__(self, jobs: Mapping[str, Union[List[str], Mapping]]):
        if not isinstance(jobs, Mapping) or not jobs:
            raise ClusterSpecError(f"a cluster spec maps job names to task addresses; got {jobs!r}")
        self._jobs: Dict[str, Tuple[str, ...]] = {}
        seen: Dict[str, str] = {}
        for job, tasks in jobs.items():
            if not isinstance(job, str) or not _JOB.match(job):
                raise ClusterSpecError(f"malformed job name {job!r}")
            addrs = _task_list(job, tasks)
            for i, a in enumerate(addrs):
                if not isinstance(a, str) or not _ADDRESS.match(a):
                    raise ClusterSpecError(f"task {i} of job '{job}' has a malformed address {a!r}; "
                                           "expected host:port")
                port = int(a.rsplit(":", 1)[1])
                if not 0 < port < 65536:
                    raise ClusterSpecError(f"task {i} of job '{job}': port {port} is out of range")
                other = seen.get(a)
                if other is not None:
                    raise ClusterSpecError(f"address {a} is given to both {other} and /job:{job}/task:{i}")
                seen[a] = f"/job:{job}/task:{i}"
            self._jobs[job] = tuple(addrs)

    # ---- reading ------------------------------------------------------------------------
    @property
    def jobs(self) -> List[str]:
        return list(self._jobs)

    def num_tasks(self, job: str) -> int:
        return len(self._jobs.get(job, ()))

    def address(self, job: str, index: int) -> str:
        tasks = self._jobs.get(job)
        if tasks is None:
            raise ClusterSpecError(f"the cluster has no job '{job}'; jobs: {', '.join(self._jobs)}")
        if not 0 <= int(index) < len(tasks):
            raise ClusterSpecError(f"job '{job}' has {len(tasks)} task(s); no task {index}")
        return tasks[int(index)]

    def tasks(self) -> Iterator[Tuple[TaskId, str]]:
        for job, addrs in self._jobs.items():
            for i, a in enumerate(addrs):
                yield TaskId(job, i), a

    def task_of(self, device: str) -> TaskId:
        """The task a device name (/job:x/task:n/...) belongs to; task 0 when it names none."""
        m = re.match(r"^/job:([\w-]+)(?:/replica:\d+)?(?:/task:(\d+))?", device or "")
        if not m:
            raise ClusterSpecError(f"device {device!r} names no job of the cluster")
        t = TaskId(m.group(1), int(m.group(2) or 0))
        self.address(t.job, t.index)  # raises when the cluster lacks it
        return t

    def as_dict(self) -> Dict[str, List[str]]:
        return {j: list(a) for j, a in self._jobs.items()}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    def __eq__(self, other) -> bool:
        return isinstance(other, ClusterSpec) and self._jobs == other._jobs

    def __repr__(self) -> str:
        return f"ClusterSpec({self.as_dict()!r})"

    # ---- building -----------------------------------------------------------------------
    @classmethod
    def parse(cls, spec: Union[str, Mapping, "ClusterSpec"]) -> "ClusterSpec":
        """Any accepted form (see the module's docstring); the TF_CONFIG task is dropped."""
        return parse(spec)[0]

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> Optional["ClusterSpec"]:
        got = from_env(environ)
        return None if got is None else got[0]


def _task_list(job: str, tasks) -> List[str]:
    if isinstance(tasks, str):
        return [tasks]
    if isinstance(tasks, Mapping):
        try:
            idx = {int(k): v for k, v in tasks.items()}
        except (TypeError, ValueError):
            raise ClusterSpecError(f"job '{job}' maps task indices to addresses; got keys {list(tasks)}") from None
        if sorted(idx) != list(range(len(idx))):
            raise ClusterSpecError(f"job '{job}' must number its tasks 0..{len(idx) - 1}; got {sorted(idx)}")
        return [idx[i] for i in range(len(idx))]
    if isinstance(tasks, (list, tuple)) and tasks:
        return list(tasks)
    raise ClusterSpecError(f"job '{job}' needs a list of task addresses; got {tasks!r}")


def parse(spec: Union[str, Mapping, ClusterSpec]) -> Tuple[ClusterSpec, Optional[TaskId]]:
    """(cluster, this process's task or None) from any accepted form."""
    if isinstance(spec, ClusterSpec):
        return spec, None
    if isinstance(spec, str):
        text = spec.strip()
        if not text:
            raise ClusterSpecError("empty cluster spec")
        if text[0] not in "{[" and "=" not in text:
            try:
                with open(text, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise ClusterSpecError(f"cluster spec {spec!r} is neither JSON, job=addresses, nor a "
                                       f"readable file ({e.strerror})") from None
            except UnicodeDecodeError:
                raise ClusterSpecError(f"cluster spec file {spec!r} is not text (JSON or job=addresses)") from None
        if text.lstrip()[:1] in "{[":
            try:
                spec = json.loads(text)
            except json.JSONDecodeError as e:
                raise ClusterSpecError(f"cluster spec is not valid JSON: {e}") from None
        else:
            return ClusterSpec(_compact(text)), None
    if not isinstance(spec, Mapping):
        raise ClusterSpecError(f"a cluster spec is a dict, JSON, job=addresses or a file; got {type(spec).__name__}")
    if "cluster" in spec:  # TF_CONFIG
        task = spec.get("task") or None
        tid = None
        if task is not None:
            try:
                tid = TaskId(str(task["type"]), int(task.get("index", 0)))
            except (KeyError, TypeError, ValueError, AttributeError):
                raise ClusterSpecError(f"TF_CONFIG task must be {{'type': job, 'index': n}}; got {task!r}") from None
        cluster = ClusterSpec(spec["cluster"])
        if tid is not None:
            cluster.address(tid.job, tid.index)
        return cluster, tid
    return ClusterSpec(spec), None


def _compact(text: str) -> Dict[str, List[str]]:
    jobs: Dict[str, List[str]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        job, eq, addrs = part.partition("=")
        if not eq:
            raise ClusterSpecError(f"cluster spec part {part!r} is not job=host:port[,host:port...]")
        jobs[job.strip()] = [a.strip() for a in addrs.split(",") if a.strip()]
    return jobs


def from_env(environ: Optional[Mapping[str, str]] = None) -> Optional[Tuple[ClusterSpec, Optional[TaskId]]]:
    env = os.environ if environ is None else environ
    for var in (ENV_VAR, TF_CONFIG):
        text = env.get(var)
        if text:
            try:
                return parse(text)
            except ClusterSpecError as e:
                raise ClusterSpecError(f"${var}: {e}") from None
    return None
