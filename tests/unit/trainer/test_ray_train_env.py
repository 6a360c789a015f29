"""packfeed train asks Ray Train's controller to look at its workers every 0.5 s (its default,
2 s, kept a finished run waiting ~4.7 s), where the user set nothing; a user's value stays, and
Ray Train passes the setting from the driver to its controller."""

from __future__ import annotations

from packfeed.trainer.launch import ray_driver as run_module


def test_the_controller_interval_is_set_where_the_user_set_none(monkeypatch):
    monkeypatch.setenv(run_module.HEALTH_CHECK_ENV, "recorded")  # so that the test's end removes what it sets
    monkeypatch.delenv(run_module.HEALTH_CHECK_ENV)
    run_module.ray_train_env()
    assert float(run_module.os.environ[run_module.HEALTH_CHECK_ENV]) == 0.5


def test_a_users_interval_is_kept(monkeypatch):
    monkeypatch.setenv(run_module.HEALTH_CHECK_ENV, "3")
    run_module.ray_train_env()
    assert run_module.os.environ[run_module.HEALTH_CHECK_ENV] == "3"


def test_ray_train_propagates_it_to_the_controller():
    from ray.train.v2._internal.constants import ENV_VARS_TO_PROPAGATE

    assert run_module.HEALTH_CHECK_ENV in ENV_VARS_TO_PROPAGATE
