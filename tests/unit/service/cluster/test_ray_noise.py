"""ray_noise.py: the Ray lines that are untrue of a packfeed run go, every other byte on fd 2 stays."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from packfeed.service.cluster import ray_noise

# As Ray 2.60 printed them (the driver's own core worker; the GCS's, forwarded with its prefix).
CONSTRUCTOR = (b"[2026-11-29 02:11:57,985 E 26709 26709] core_worker.cc:2465: Actor with class name: "
               b"'MapWorker(MapBatches(WindowActor))' and ID: 'c0eb07aae52661e2b23174f201000000' has constructor "
               b"arguments in the object store and max_restarts > 0. If the arguments in the object store go out of "
               b"scope or are lost, the actor restart will fail. See https://github.com/ray-project/ray/issues/53727 "
               b"for more details.\n")
KILL = b"(gcs_server) [2026-11-29 02:20:01,001 E 1 1] gcs_actor_scheduler.cc:538: Failed to kill actor 7c06, status: x\n"
# Lines of the same files, and of packfeed, that must stay.
KEPT = [
    b"[2026-11-29 02:11:58,000 E 26709 26709] core_worker.cc:2470: Failed to register actor: GCS unavailable\n",
    b"(gcs_server) gcs_actor_scheduler.cc:538: Actor creation failed: node died\n",
    b"packfeed pack: error: the window's rows do not add up\n",
    "packfeed pack: r\u00e9sum\u00e9 \u2713 non-ASCII stays as it is\n".encode(),
]


@pytest.mark.parametrize("noise", [CONSTRUCTOR, KILL])
def test_the_known_lines_go_and_their_neighbours_stay(noise):
    assert ray_noise.kept(noise) == b""
    mixed = KEPT[0] + noise + KEPT[1] + noise + KEPT[2]
    assert ray_noise.kept(mixed) == KEPT[0] + KEPT[1] + KEPT[2]
    for line in KEPT:
        assert ray_noise.kept(line) == line


def test_the_filter_on_the_descriptor_keeps_order_and_partial_lines_and_gives_fd_2_back(capfd):
    """Written to fd 2 (as Ray's C++ logging and, outside pytest's capture, sys.stderr do), in
    pieces that split lines anywhere: what reaches the real stderr is everything but the noise, in order;
    a line without its newline still comes out; fd 2 is the real one again after ``stop``."""
    before = os.fstat(2).st_ino
    ray_noise.filter_ray_noise()
    try:
        assert os.fstat(2).st_ino != before  # a pipe now
        stream = KEPT[0] + CONSTRUCTOR + KEPT[1] + KILL + KEPT[2]
        for i in range(0, len(stream), 37):  # pieces that cut lines anywhere, the noise included
            os.write(2, stream[i:i + 37])
        os.write(2, b"one more\n")
        os.write(2, b"a prompt without newline")
        time.sleep(3 * ray_noise.PARTIAL_LINE_SECONDS)
        os.write(2, KEPT[3])
    finally:
        ray_noise.stop_filtering()
    assert os.fstat(2).st_ino == before
    err = capfd.readouterr().err.encode()
    assert err == KEPT[0] + KEPT[1] + KEPT[2] + b"one more\n" + b"a prompt without newline" + KEPT[3]


def test_a_child_that_keeps_the_pipe_open_does_not_hold_the_stop(capfd):
    """A process started while the filter is on inherits the pipe; ``stop`` returns within its
    timeout all the same, and the child's lines still reach the real stderr (filtered)."""
    ray_noise.filter_ray_noise()
    try:
        child = subprocess.Popen([sys.executable, "-c", "import os, sys, time; time.sleep(1.5); "
                                  f"os.write(2, {KEPT[0]!r} + {CONSTRUCTOR!r})"])
    finally:
        started = time.monotonic()
        ray_noise.stop_filtering()
        assert time.monotonic() - started < 2.5
    child.wait(10)
    time.sleep(0.3)
    assert capfd.readouterr().err.encode() == KEPT[0]


def test_forwarded_lines_lose_the_noise_in_ray_s_own_printer():
    """Lines of other processes reach the driver through Ray's log thread, whose printer is
    the dispatcher's ``ray_print_logs`` handler: wrapped once, it gets every batch but the
    noise, and no batch at all when nothing else is left."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    printed: list[dict] = []
    dispatcher.add_handler("ray_print_logs", printed.append)
    try:
        ray_noise.filter_forwarded_lines()
        ray_noise.filter_forwarded_lines()  # once only: not wrapped twice
        kept = [line.decode().rstrip("\n") for line in KEPT]
        dispatcher.emit({"pid": 7, "is_err": True, "lines": [kept[0], CONSTRUCTOR.decode().rstrip(), kept[1]]})
        dispatcher.emit({"pid": 8, "is_err": True, "lines": [KILL.decode().rstrip()]})
        dispatcher.emit({"pid": 9, "is_err": True, "lines": [RESOURCE_REQUEST, *TIMEOUT_TRACEBACK]})  # below
        assert printed == [{"pid": 7, "is_err": True, "lines": kept[:2]}]
    finally:
        dispatcher.remove_handler("ray_print_logs")


# Ray Train's controller on a loaded machine (Ray 2.60), as forwarded: the warning, then its traceback.
RESOURCE_REQUEST = (
    "Failed to send resource request for train-28caf4966c4a48f59b32791409c73d0d. If this only happens transiently "
    "during network partition or CPU being overloaded, it's safe to ignore this error. If this error persists, "
    "file a GitHub issue.")
TIMEOUT_TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "ray/train/v2/_internal/execution/scaling_policy/autoscaling_coordinator_client.py", line 58, in send',
    "    ray.get(",
    "           ^^^^^^^^^^^^^^^^^^^^^",
    "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.",
]


def test_the_transient_resource_request_warning_goes_once_per_process_with_its_whole_traceback():
    """Its first time in a process: the line and its traceback go, even split over batches, and
    the lines after it stay; a second time (the coordinator still silent): its line stays, the
    traceback goes; another process's first time goes too."""
    transient = ray_noise.Transient()
    assert transient.kept(7, ["before", RESOURCE_REQUEST, *TIMEOUT_TRACEBACK[:2]]) == ["before"]
    assert transient.kept(7, [*TIMEOUT_TRACEBACK[2:], "step 1/8", "  indented, after"]) == \
        ["step 1/8", "  indented, after"]
    assert transient.kept(7, [RESOURCE_REQUEST, *TIMEOUT_TRACEBACK, "step 2/8"]) == [RESOURCE_REQUEST, "step 2/8"]
    assert transient.kept(8, [RESOURCE_REQUEST, *TIMEOUT_TRACEBACK]) == []
    assert transient.kept(8, ["Traceback (most recent call last):", "  File x", "ValueError: a real one"]) == \
        ["Traceback (most recent call last):", "  File x", "ValueError: a real one"], "other tracebacks stay"
    assert transient.kept(9, [RESOURCE_REQUEST, "step 3/8", "  indented"]) == ["step 3/8", "  indented"], \
        "without a traceback after it, the next lines stay"
