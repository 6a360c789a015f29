"""start_embedded: a start whose node misses Ray's start-up limits is killed whole and made again;
any other failure is not retried. Real processes stand in for Ray's (started through the same
``ConsolePopen`` Ray starts its own with), so the group kill is the real one."""

import copy
import logging
import os

import psutil
import pytest

from packfeed.service.cluster import embedded_ray
from packfeed.service.errors import user_message
from packfeed.service.cluster.embedded_ray import NODE_TIMED_OUT, START_ATTEMPTS, RayStartTimedOut, start_embedded


class FakeInit:
    """``ray.init`` whose first ``failures`` calls start two "Ray processes" (a leader and one
    more in its group, as gcs_server and raylet) and fail as a node that timed out does."""

    def __init__(self, failures: int, error: str = f"{NODE_TIMED_OUT}. This could happen because ...") -> None:
        self.failures, self.error = failures, error
        self.calls: list[dict] = []
        self.started: list[psutil.Process] = []
        self.groups: list[int] = []  # each started process's group, read as it starts

    def __call__(self, **kwargs) -> None:
        import ray._private.services as services

        self.calls.append(copy.deepcopy(kwargs))
        kwargs.get("_system_config", {})["object_spilling_config"] = "{...}"  # as ray.init does
        for _ in range(2):
            process = services.ConsolePopen(["sleep", "60"])  # returns after the child's exec
            self.started.append(psutil.Process(process.pid))
            self.groups.append(os.getpgid(process.pid))
        if len(self.calls) <= self.failures:
            raise Exception(self.error)

    def running(self) -> list[psutil.Process]:
        alive = []
        for process in self.started:
            try:
                if process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except psutil.NoSuchProcess:
                pass
        return alive


@pytest.fixture
def init():
    made: list[FakeInit] = []
    yield lambda *args, **kwargs: made.append(FakeInit(*args, **kwargs)) or made[-1]
    for fake in made:  # the successful attempt's processes are Ray's to stop; here the test's
        for process in fake.running():
            process.kill()


@pytest.mark.parametrize("failures", range(START_ATTEMPTS))
def test_a_node_that_timed_out_is_killed_whole_and_started_again(init, failures, caplog):
    fake = init(failures)
    with caplog.at_level(logging.WARNING, logger="packfeed"):
        start_embedded(fake, num_cpus=2, _system_config={"preload_python_modules": ["ray.data"]})

    # Every attempt gets the arguments as given (ray.init fills in the dicts it is passed).
    assert fake.calls == [{"address": "local", "num_cpus": 2,
                           "_system_config": {"preload_python_modules": ["ray.data"]}}] * (failures + 1)
    # Each attempt's processes shared one group of their own, led by the first; the failed
    # attempts' groups are gone, the last one's runs.
    assert fake.groups[0::2] == fake.groups[1::2] == [p.pid for p in fake.started[0::2]]
    assert fake.running() == fake.started[-2:]
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"Ray's node did not come up within Ray's start-up limits (a busy machine: its agent started "
        f"too slowly); starting it again (attempt {n + 1} of {START_ATTEMPTS})" for n in range(1, failures + 1)]


def test_the_last_failure_is_one_line_for_the_user_with_nothing_left_running(init):
    fake = init(START_ATTEMPTS)
    with pytest.raises(RayStartTimedOut) as error:
        start_embedded(fake)
    assert len(fake.calls) == START_ATTEMPTS
    assert fake.running() == []
    assert NODE_TIMED_OUT in str(error.value.__context__)  # Ray's own, kept off the line
    assert user_message(error.value) == str(error.value) == (
        f"Ray's node did not come up within Ray's start-up limits in {START_ATTEMPTS} attempts (its dashboard "
        "agent gets 15 s to start, the node 30 s to register): this machine is too busy for an embedded Ray; "
        "run the command again when it is less loaded, or join a running cluster with --address")


def test_any_other_failure_is_not_retried(init):
    fake = init(1, error="Ray has not been started yet")
    with pytest.raises(Exception, match="not been started"):
        start_embedded(fake)
    assert len(fake.calls) == 1


def test_the_group_kill_returns_once_every_process_is_gone():
    import ray._private.services as services

    with embedded_ray._own_process_group() as group:
        leader = services.ConsolePopen(["sleep", "60"])
        member = services.ConsolePopen(["sh", "-c", "trap '' TERM; sleep 60"])  # SIGKILL is not refused
    embedded_ray._kill_group(group, timeout=10)
    assert group == [leader.pid]
    for process in (leader, member):
        assert process.poll() is not None  # reaped: this process started them
