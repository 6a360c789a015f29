"""Integration tests run against one real local Ray cluster per session (2 logical CPUs).

The cluster lives until the whole pytest session ends, so its workers' output is not sent to
this process: a worker line printed late would land in a later test's captured stderr (the
unit tests check that a user error is the last line). Tests read what the driver says.
"""

import logging

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

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
