"""The start-up by phase (startup.py) and the actors' part files (part_sink.py): pure parts."""

from __future__ import annotations

import pytest

from packfeed.service.packed.part_sink import part_name
from packfeed.service.pipeline.startup import ACTOR_PHASES, startup_phases

DRIVER = [("plan", 10.5), ("tokenizer_load", 11.0), ("probe", 11.25), ("ray_start", 14.0), ("pipeline", 14.5)]
ACTOR = {"process_created": 14.75, "init_start": 15.5, "imports_done": 16.0, "tokenizer_done": 17.0,
         "call_start": 17.25, "packed": 18.0, "written": 18.25}


@pytest.mark.parametrize("actor, first_row_at, expected", [
    pytest.param(ACTOR, 18.5, {"plan_s": 0.5, "tokenizer_load_s": 0.5, "probe_s": 0.25, "ray_start_s": 2.75,
                               "pipeline_s": 0.5, "actor_process_s": 0.25, "actor_imports_s": 0.75,
                               "actor_packfeed_imports_s": 0.5, "actor_tokenizer_s": 1.0, "window_dispatch_s": 0.25,
                               "first_window_pack_s": 0.75, "first_window_write_s": 0.25, "to_driver_s": 0.25},
                 id="every-phase"),
    pytest.param({**ACTOR, "process_created": 3.0}, 18.5,
                 {"actor_process_s": 0.0, "actor_imports_s": 1.0}, id="process-started-ahead-counts-from-the-ask"),
    pytest.param(None, 20.0, {"ray_start_s": 2.75, "actors_and_first_window_s": 5.5}, id="actor-unknown"),
    pytest.param({"init_start": 15.0}, 20.0, {"actors_and_first_window_s": 5.5}, id="actor-timings-incomplete"),
    pytest.param({**ACTOR, "written": 30.0}, 18.5, {"first_window_write_s": 0.5, "to_driver_s": 0.0},
                 id="a-skewed-clock-never-passes-the-first-row"),
])
def test_the_phases_add_up_to_the_first_row(actor, first_row_at, expected):
    phases = startup_phases(10.0, DRIVER, actor, first_row_at)
    assert {k: phases[k] for k in expected} == expected
    assert sum(phases.values()) == pytest.approx(first_row_at - 10.0)
    assert all(v >= 0 for v in phases.values())
    if actor is ACTOR:
        assert list(phases)[5:-1] == [phase for _, phase in ACTOR_PHASES]


@pytest.mark.parametrize("window, num_windows, name", [
    pytest.param(0, 1, "part-00000.parquet", id="one-window"),
    pytest.param(7, 100_000, "part-00007.parquet", id="five-digits"),
    pytest.param(7, 100_001, "part-000007.parquet", id="wider-when-needed"),
])
def test_part_names(window, num_windows, name):
    assert part_name(window, num_windows) == name


@pytest.mark.parametrize("num_windows", [1, 9, 10, 99_999, 100_000, 123_457])
def test_part_names_sort_in_stream_order(num_windows):
    windows = sorted({0, 1, num_windows // 2, max(num_windows - 2, 0), num_windows - 1})
    names = [part_name(k, num_windows) for k in windows]
    assert sorted(names) == names and len(set(names)) == len(names)


def test_the_modules_an_embedded_rays_workers_preload_import_alone_without_torch():
    """Ray logs a preload that fails and goes on (a typo would silently cost the seconds back);
    and a preload that pulled in torch or transformers would cost every worker a second."""
    import subprocess
    import sys

    from packfeed.service.cluster.raycluster import WORKER_PRELOAD_MODULES

    code = ("import importlib, sys\n"
            f"for name in {list(WORKER_PRELOAD_MODULES)!r}: importlib.import_module(name)\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert "packfeed.service.pipeline.ray_pipeline" in WORKER_PRELOAD_MODULES  # the actor class's module
