"""What the pack, serve and train tests on the S3 server share: a Ray whose processes reach the
store, and a small corpus of every kind on disk and under a bucket prefix."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from packfeed.service.assets import demo_corpus_paths

CORPUS = "corpus"  # the prefix (and local directory) of the inputs: the source's name either way


@contextlib.contextmanager
def ray_reaching(env: dict[str, str]) -> Iterator[None]:
    """A local Ray (2 CPUs) started with ``env`` set: its workers (packing actors, scan tasks,
    train workers) copy the environment of the Ray they belong to when they start, so they reach
    the store the driver reaches. Any Ray running before is shut down first; ``env`` is
    restored afterwards."""
    import ray

    from packfeed.service.cluster.embedded_ray import start_embedded
    from packfeed.service.cluster.raycluster import shutdown_ray

    shutdown_ray()
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        start_embedded(ray.init, loopback=False, num_cpus=2, object_store_memory=512 << 20,
                       include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
        yield
    finally:
        shutdown_ray()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def write_corpus(root: Path, *, lines: int | None = None) -> Path:
    """``root/corpus/``: the bundled JSONL files (their first ``lines`` lines, or all) and the
    stories again as Parquet in row groups of 200."""
    directory = root / CORPUS
    directory.mkdir(parents=True, exist_ok=True)
    for source in demo_corpus_paths():
        target = directory / os.path.basename(source)
        if lines is None:
            shutil.copyfile(source, target)
        else:
            with open(source) as f:
                target.write_text("".join(line for _, line in zip(range(lines), f)))
    stories = [json.loads(line) for line in (directory / "stories.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(stories[::2]), directory / "stories-again.parquet", row_group_size=200)
    return directory


def count_scans(monkeypatch) -> list[int]:
    """From now on, each plan built appends to the list it returns how many files it scanned
    (0: every file came from the scan manifest)."""
    from packfeed.service.data import plan as plan_module

    real_scan, scanned = plan_module.scan_sources, []

    def counting(sources, manifest=None, **kw):
        result = real_scan(sources, manifest, **kw)
        scanned.append(result[1])
        return result

    monkeypatch.setattr(plan_module, "scan_sources", counting)
    return scanned
