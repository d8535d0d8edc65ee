"""`isthmus profile --parts` measures edge parts for real (apps/part_measure.py): the offload client
against an in-process service runs every part; each sample counts the part's boundary bytes as the
plan's pricing does, and the fit writes a part section into the profile."""
import numpy as np

from isthmus.apps import cli
from isthmus.apps.part_measure import _graphs, part_samples, repriced
from isthmus.partitioner.devices import DeviceProfile


def test_samples_count_the_boundary_and_time_the_parts():
    from dataclasses import replace
    from isthmus.partitioner.devices import CLOUD
    samples = part_samples(int8=True, cuts=3, requests=2, profile=replace(CLOUD, kernel_table="edge"))
    graphs = _graphs()
    assert sorted({s["model"] for s in samples}) == [0, 1, 2]
    for mi, (g, x, y) in enumerate(graphs):
        mine = [s for s in samples if s["model"] == mi]
        assert len(mine) == 3  # cloud-only, one inside, edge-only
        io = 4 * (int(np.prod(x.shape)) + int(np.prod(y.shape)))
        cloud_only, edge_only = mine[0], mine[-1]
        # the input goes as it came (counted once); the output is received, then returned (twice)
        assert cloud_only["nbytes"] == io + 4 * int(np.prod(y.shape)) and cloud_only["kernels_s"] == 0.0
        assert edge_only["nbytes"] == io and edge_only["kernels_s"] > 0.0
        assert mine[1]["nbytes"] > io  # a part inside the network sends what it computed
        # the part's kernels as the profile prices them: none on the cloud-only cut, all on the edge-only one
        assert cloud_only["priced_s"] == 0.0 < mine[1]["priced_s"] < edge_only["priced_s"]
        for s in mine:
            assert s["seconds"] >= 0.0 and s["edge_s"] > 0.0 and np.isfinite(s["edge_s"])
    # the same parts priced by another profile (twice as slow): the measurements kept, the prices doubled
    again = repriced(samples, replace(CLOUD, kernel_table="edge").scaled(2.0), cuts=3)
    assert [s["edge_s"] for s in again] == [s["edge_s"] for s in samples]
    assert np.allclose([s["priced_s"] for s in again], [2 * s["priced_s"] for s in samples])


def test_profile_parts_writes_the_part_section(tmp_path, capsys, monkeypatch):
    from isthmus.apps import part_measure
    fast = part_measure.part_samples
    monkeypatch.setattr(part_measure, "part_samples", lambda int8, profile=None: fast(int8, cuts=3, requests=2,
                                                                                      profile=profile))
    path = str(tmp_path / "e.json")
    assert cli.main(["profile", "--device", "e", "--ops", "Relu", "--quick", "--slowdown", "8", "--parts", "fp32",
                     "--out", path, "--force"]) == 0
    assert "wrote the part section of" in capsys.readouterr().out
    part = DeviceProfile.load(path).part
    assert part is not None and part.invoke_s + part.byte_s > 0
