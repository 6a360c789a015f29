"""Integration tests run against one real local Ray cluster per session (2 logical CPUs)."""

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
    )
    yield ray
    ray.shutdown()
