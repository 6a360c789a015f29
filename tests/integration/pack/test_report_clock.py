"""Every figure of ``packfeed pack``'s report on one clock, the command's start, whichever Ray
the run uses: ``first_row_seconds <= seconds``, the start-up phases >= 0 and adding up to
``first_row_seconds``, and the checks counted in ``seconds``.

A Ray job's driver (a joined cluster) used to count ``seconds`` from the end of its checks and
``first_row_seconds`` from the command's start: its report said ``seconds 6.75 (start-up: first
row at 9.22)``. Each run here makes its checks last ``CHECK_S`` longer (a slow tokenizer load),
so a ``seconds`` that leaves them out falls short of the run's own wall clock.

Paths: the driver's head start without Ray; ``--no-head-start`` on an embedded Ray (the
checks beside Ray's start: the shared Ray stands in for it); this process's own Ray (tests,
Ray jobs); a cluster joined before the plan (the shared Ray again, the join made slow).
"""

from __future__ import annotations

import time

import pytest

from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.data.config import DataConfig
from packfeed.service.packjob import head_start as head_start_module
from packfeed.service.cluster import raycluster
from packfeed.service.packjob.pack_run import run_pack
from packfeed.service.cluster.scaling import PackingScaling
from packfeed.service.tokenize import samples

pytestmark = pytest.mark.integration

CHECK_S = 1.0  # added to the checks (the tokenizer's load)
JOIN_S = 0.3  # added to a join
AFTER_END_S = 0.75  # what the run does after its last figure: the metadata write, the report


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """The first 600 instructions of the bundled corpus: 3 windows of 200."""
    path = tmp_path_factory.mktemp("clock") / "instruct.jsonl"
    source = next(p for p in demo_corpus_paths() if p.endswith("instruct.jsonl"))
    with open(source, encoding="utf-8") as f:
        path.write_text("".join(line for _, line in zip(range(600), f)))
    return str(path)


@pytest.fixture
def slow_checks(monkeypatch):
    load = samples.load_tokenizer

    def slow_load(*args, **kwargs):
        time.sleep(CHECK_S)
        return load(*args, **kwargs)

    monkeypatch.setattr(samples, "load_tokenizer", slow_load)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def assert_one_clock(stats: dict, wall: float) -> None:
    print(f"\nseconds {stats['seconds']:.3f} of the command's {wall:.3f}, first row at {stats['first_row_seconds']:.3f}")
    phases = stats["startup_seconds"]
    assert all(s >= 0 for s in phases.values()), phases
    assert sum(phases.values()) == pytest.approx(stats["first_row_seconds"], abs=1e-9), phases
    assert 0 < stats["first_row_seconds"] <= stats["seconds"], (stats["first_row_seconds"], stats["seconds"])
    # the checks are in it: seconds is the command's wall clock, less what follows its end
    assert wall - AFTER_END_S <= stats["seconds"] <= wall, (stats["seconds"], wall)
    assert stats["first_row_seconds"] >= CHECK_S
    if stats["ray_to_first_row_seconds"] is not None:
        assert 0 <= stats["ray_to_first_row_seconds"] <= stats["first_row_seconds"]
        assert stats["ray_init_seconds"] <= stats["first_row_seconds"]


def pack(corpus: str, out, **kwargs) -> tuple[dict, float]:
    config = DataConfig.from_inputs([corpus], tokenizer=demo_tokenizer_path(), seq_len=512, window_samples=200)
    began = time.perf_counter()
    stats = run_pack(config, str(out), scaling=PackingScaling(num_workers=1), progress_seconds=60, **kwargs)
    return stats, time.perf_counter() - began


def test_the_driver_alone_without_ray(corpus, slow_checks, monkeypatch, tmp_path):
    monkeypatch.setattr(raycluster, "ray_initialised", lambda: False)  # as in a process of its own
    monkeypatch.setattr(head_start_module, "RAY_START_S", 1e6)  # the driver alone, whatever the machine's pace
    monkeypatch.setattr(raycluster, "init_ray", lambda *a, **k: pytest.fail("no Ray for a run the driver packs"))
    stats, wall = pack(corpus, tmp_path / "out")
    assert stats["driver_windows"] == stats["windows"] == 3 and stats["ray_init_seconds"] is None
    assert_one_clock(stats, wall)


def test_no_head_start_on_an_embedded_ray(ray_cluster, corpus, slow_checks, monkeypatch, tmp_path):
    # the checks in their thread beside Ray's start (here the shared Ray: its start is instant)
    monkeypatch.setattr(raycluster, "ray_initialised", lambda: False)
    stats, wall = pack(corpus, tmp_path / "out", head_start=False)
    assert stats["driver_windows"] == 0 and "ray_start_s" in stats["startup_seconds"]
    assert_one_clock(stats, wall)


def test_this_processs_own_ray(ray_cluster, corpus, slow_checks, tmp_path):
    stats, wall = pack(corpus, tmp_path / "out")
    assert stats["driver_windows"] == 0
    assert_one_clock(stats, wall)
    # Ray was up before the command: Ray up -> first row is the whole start-up
    assert stats["ray_to_first_row_seconds"] == pytest.approx(stats["first_row_seconds"], abs=0.002)


def test_a_cluster_joined_before_the_plan(ray_cluster, corpus, slow_checks, monkeypatch, tmp_path):
    init_ray = raycluster.init_ray

    def slow_join(*args, **kwargs):
        time.sleep(JOIN_S)
        return init_ray(*args, **kwargs)

    monkeypatch.setattr(raycluster, "joins_a_cluster", lambda address: True)
    monkeypatch.setattr(raycluster, "init_ray", slow_join)
    stats, wall = pack(corpus, tmp_path / "out")
    assert list(stats["startup_seconds"])[0] == "ray_start_s" and stats["startup_seconds"]["ray_start_s"] >= JOIN_S
    assert stats["ray_init_seconds"] >= JOIN_S
    assert_one_clock(stats, wall)
    # Ray up -> first row: from the join's end, the checks (run on the cluster) included
    assert stats["ray_to_first_row_seconds"] >= CHECK_S
