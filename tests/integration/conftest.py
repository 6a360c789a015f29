"""Integration tests run against one real local Ray cluster per session (2 logical CPUs).

The cluster lives until the whole pytest session ends, so its workers' output is not sent to
this process: a worker line printed late would land in a later test's captured stderr (the
unit tests check that a user error is the last line). Tests read what the driver says.
"""

import logging
import os

import pytest

# Ray Train's controller polls its workers every 2 s: a run's end, and a checkpoint's
# registration, wait for the next poll. Every run of the suite polls every 0.25 s (set before
# any Ray starts, so the controllers of embedded Rays and local clusters inherit it).
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from packfeed.service.raycluster import agent_on_a_free_port

    with agent_on_a_free_port():  # Ray's fixed port would slow every other Ray's start by 4 s
        ray.init(
            address="local",
            num_cpus=2,
            object_store_memory=512 << 20,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    yield ray
    ray.shutdown()
