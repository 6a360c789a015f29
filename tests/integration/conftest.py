"""Integration tests share one real local Ray (2 logical CPUs) in the pytest process.

It starts at the first test that asks for it and is shut down after the last test of this
directory, before any other test runs (unit tests must find no Ray). Its workers' output is
not sent to this process: a worker line printed late would land in a later test's captured
stderr (the CLI tests check that a user error is the last line). Tests read what the driver
says. A command run in-process (``main([...])``) uses it and leaves it running.

The tests are in rooms by the command they exercise: pack/ (``packfeed pack``: packing, the head
start, tokenizers, mixtures and pairs packed), serve/ (``packfeed serve`` and its clients),
train/ (``packfeed train``, the step's contract, torchrun, FSDP), cluster/ (Ray clusters and a
command's own Ray), storage/ (object stores, with a conftest of its own). This conftest serves
them all. No folder has an ``__init__.py``: pytest imports each test file by its name alone, so
a test file's name is unique under tests/ (pytest stops at collection with "import file
mismatch" otherwise); shared helpers live in tests/support/ (``pythonpath = ["tests"]``).
"""

import logging
import os
from pathlib import Path

import pytest

# Ray Train's controller polls its workers every 2 s: a run's end, and a checkpoint's
# registration, wait for the next poll. Every run of the suite polls every 0.25 s (set before
# any Ray starts, so the controllers of embedded Rays and local clusters inherit it).
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
# Ray Train starts an actor per run that watches for node preemption (spot instances): no node
# of a test is preempted, and the actor's process start cost each run ~2 s on 2 cores.
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    from packfeed.service.cluster.embedded_ray import start_embedded

    if not ray.is_initialized():
        # As a command's embedded Ray: its agent on a free port (Ray's fixed one would slow every
        # other Ray's start by 4 s), started again if a busy machine makes it miss Ray's limits.
        start_embedded(ray.init, loopback=False, num_cpus=2, object_store_memory=512 << 20,
                       include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    return ray


def pytest_runtest_teardown(item, nextitem):
    """The shared Ray ends when the next test is not one of this directory's (or none is)."""
    if nextitem is None or HERE not in Path(nextitem.path).parents:
        from packfeed.service.cluster.raycluster import shutdown_ray

        shutdown_ray()
