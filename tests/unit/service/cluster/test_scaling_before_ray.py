"""A scaling or placement flag means the same on any corpus (service/cluster/scaling.py,
``check_packing``): actors that could never be placed are refused before anything starts, on
the embedded Ray this machine would start (placement.embedded_node: its CPUs as Ray counts
them), whether the driver then packs the run alone (the head start: no Ray) or Ray starts.
``--cpus-per-worker 64`` on 2 CPUs used to pass on the bundled corpus and fail on one large
enough to start Ray. ``packfeed pack`` runs in-process here; this directory's conftest makes
``ray.init`` raise, so a command that reached Ray would fail with a traceback, not exit 2."""

from __future__ import annotations

import pytest

from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.cli import main
from packfeed.service.cluster import placement
from packfeed.service.packjob import head_start
from packfeed.service.cluster.placement import ray_cpus
from packfeed.service.cluster.raycluster import ray_initialised
from packfeed.service.cluster.scaling import PackingScaling, check_packing, flags_set

CPUS = ray_cpus()
LAPTOP = {"id": "l", "address": "", "resources": {"CPU": 2.0}, "labels": {}}

INVALID = [
    pytest.param(["--cpus-per-worker", str(CPUS + 1)], f"packing actors: 1 x ({CPUS + 1} CPU) do not fit on the 1 nodes "
                 f"(CPU: largest node {CPUS}, all {CPUS}; room for 0)", id="cpus-per-worker"),
    pytest.param(["--num-workers", str(CPUS + 1)], f"packing actors: {CPUS + 1} x (1 CPU) do not fit on the 1 nodes "
                 f"(CPU: largest node {CPUS}, all {CPUS}; room for {CPUS})", id="num-workers"),
    pytest.param(["--packer-label", "packfeed/role=packer"], "packing actors: no node matches the labels "
                 "{'packfeed/role': 'packer'} (node labels in the cluster: none)", id="packer-label"),
    pytest.param(["--packer-resource", "slot=1"], f"packing actors: {CPUS} x (1 CPU, 1 slot) do not fit", id="packer-resource"),
    pytest.param(["--packer-resource", "GPU=1"], "packer resources: GPU is not a custom resource", id="gpu-resource"),
    pytest.param(["--num-workers", "2", "--max-workers", "1"], "--max-workers (1) must be >= --num-workers (2)",
                 id="max-workers"),
]


def pack(tmp_path, *flags: str) -> list[str]:
    return ["pack", *demo_corpus_paths(), "--tokenizer", demo_tokenizer_path(), "--seq-len", "512",
            "--output", str(tmp_path / "out"), *flags]


def ray_wanted(monkeypatch) -> None:
    """The head start's question answered "start Ray", as for a corpus too large for the driver alone."""
    monkeypatch.setattr(head_start.HeadStart, "wants_ray", lambda self, *args, **kwargs: True)


@pytest.mark.parametrize("flags, line", INVALID)
def test_flags_that_could_never_be_placed_fail_the_same_way_with_or_without_ray(tmp_path, capsys, monkeypatch,
                                                                                 flags, line):
    """On the bundled corpus (the driver packs it alone: no Ray), on the same corpus as if large
    enough to start Ray, and with ``--no-head-start`` (Ray beside the checks): exit 2, the same
    one line, nothing written, no Ray."""
    errors = []
    for path in ("driver alone", "Ray wanted", "--no-head-start"):
        with monkeypatch.context() as m:
            if path == "Ray wanted":
                ray_wanted(m)
            code = main(pack(tmp_path, *flags, *(["--no-head-start"] if path == "--no-head-start" else [])))
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, (path, err)
        assert not ray_initialised(), path
        errors.append(err[-1])
        assert line in err[-1], (path, err[-1])
    assert errors[0].startswith("packfeed pack: error: ") and len(set(errors)) == 1, errors
    assert not (tmp_path / "out").exists(), "refused before the output was touched"


def test_valid_flags_the_driver_did_not_need_are_named_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(head_start.HeadStart, "wants_ray", lambda self, *args, **kwargs: False)  # whatever the load
    code = main(pack(tmp_path, "--num-workers", "1", "--cpus-per-worker", "0.5", "--packer-label", "packfeed/role=!x"))
    err = capsys.readouterr().err
    assert code == 0 and not ray_initialised()
    unused = [line for line in err.splitlines() if "unused" in line]
    assert unused == [("packfeed pack: --num-workers 1, --cpus-per-worker 0.5, --packer-label packfeed/role=!x unused: "
                       "the driver packed every window, sooner than Ray and packing actors would have started")], err


@pytest.mark.parametrize("scaling, fits", [
    pytest.param(PackingScaling(), True, id="one-per-cpu"),
    pytest.param(PackingScaling(cpus_per_worker=0.5), True, id="one-per-half-cpu"),
    pytest.param(PackingScaling(num_workers=2, max_workers=64), True, id="a-pool-may-grow-past-the-machine"),
    pytest.param(PackingScaling(num_workers=3), False, id="more-actors-than-cpus"),
    pytest.param(PackingScaling(cpus_per_worker=3), False, id="more-cpus-than-the-node"),
])
def test_what_fits_does_not_depend_on_the_windows(scaling, fits):
    """Whatever the windows (a run of 1 window starts 1 actor), the count asked for must fit."""
    assert scaling.num_actors(1, [LAPTOP]) == 1
    if fits:
        check_packing(scaling, [LAPTOP])
    else:
        with pytest.raises(ValueError, match="do not fit"):
            check_packing(scaling, [LAPTOP])


def test_the_settings_named_are_those_given():
    assert flags_set(PackingScaling()) == []
    assert flags_set(PackingScaling(num_workers=4, cpus_per_worker=0.5, max_workers=8, labels={"zone": "a"},
                                    resources={"slot": 2})) == \
        ["--num-workers 4", "--cpus-per-worker 0.5", "--max-workers 8", "--packer-label zone=a", "--packer-resource slot=2"]


CGROUPS = [
    pytest.param({}, id="no-limits"),
    pytest.param({"quota": "150000", "period": "100000"}, id="v1-quota-fractional"),
    pytest.param({"quota": "-1", "period": "100000", "cpuset": "0-2"}, id="v1-no-quota-a-cpuset"),
    pytest.param({"quota": "400000", "period": "100000", "cpuset": "0,2-3"}, id="v1-quota-and-cpuset"),
    pytest.param({"quota": "0", "period": "100000"}, id="v1-zero-quota"),
    pytest.param({"max": "max 100000"}, id="v2-unlimited"),
    pytest.param({"max": "300000 100000"}, id="v2-quota"),
    pytest.param({"max": "50000 100000", "cpuset": "0-7"}, id="v2-quota-under-one"),
]


@pytest.mark.parametrize("files", CGROUPS)
def test_cpus_are_counted_as_ray_counts_them(tmp_path, monkeypatch, files):
    """Ray's own reading of the same (fake) cgroup files: its CPUs for a node it starts."""
    from ray._private import utils

    monkeypatch.delenv("RAY_USE_MULTIPROCESSING_CPU_COUNT", raising=False)
    names = {"quota": "cpu.cfs_quota_us", "period": "cpu.cfs_period_us", "max": "cpu.max", "cpuset": "cpuset.cpus"}
    for key, text in files.items():
        (tmp_path / names[key]).write_text(text + "\n")
    paths = {key: str(tmp_path / name) for key, name in names.items()}
    docker = utils._get_docker_cpus(paths["quota"], paths["period"], paths["cpuset"], paths["max"])
    count = __import__("multiprocessing").cpu_count()
    expected = int(docker) if docker is not None and docker != count else count
    assert ray_cpus((paths["quota"], paths["period"]), paths["max"], paths["cpuset"]) == expected


def test_the_embedded_node_takes_what_ray_is_told(monkeypatch):
    monkeypatch.setenv("RAY_OVERRIDE_RESOURCES", '{"CPU": 6, "slot": 2}')
    monkeypatch.setenv("RAY_OVERRIDE_LABELS", '{"packfeed/role": "packer"}')
    node = placement.embedded_node()
    assert node["resources"] == {"CPU": 6.0, "slot": 2.0} and node["labels"] == {"packfeed/role": "packer"}
    check_packing(PackingScaling(num_workers=3, resources={"slot": 0.5}, labels={"packfeed/role": "packer"}), [node])
    monkeypatch.setenv("RAY_OVERRIDE_RESOURCES", "6 CPUs")
    with pytest.raises(ValueError, match=r"\$RAY_OVERRIDE_RESOURCES must be a JSON object"):
        placement.embedded_node()
