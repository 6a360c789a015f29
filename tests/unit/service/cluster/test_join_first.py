"""A command joins a running cluster before it plans (the scan then runs on the cluster's
nodes); an embedded Ray starts after the plan, so every input check answers before it."""

import pytest

from packfeed.service.cluster.raycluster import joins_a_cluster


@pytest.mark.parametrize("address, env, joins", [
    (None, None, False),  # an embedded Ray
    ("local", None, False),
    (None, "local", False),
    ("10.0.0.5:6379", None, True),
    ("auto", None, True),  # a cluster started by `ray start` on this machine
    (None, "ray://head:10001", True),
    ("local", "10.0.0.5:6379", False),  # the flag wins over the environment
])
def test_only_a_cluster_to_join_is_joined_before_the_plan(monkeypatch, address, env, joins):
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    assert joins_a_cluster(address) is joins
