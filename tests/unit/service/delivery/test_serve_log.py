"""``packfeed serve``'s log lines that summarise state: each says what is true.

The status line's consumer part (the hub's lag is negative while consumers wait for rows not
made yet; tests/unit/service/delivery/test_hub.py drives a real hub into both signs) and the last line (no Ray
shut down where none was started: a packed directory is served without Ray, end to end in
tests/integration/serve/test_metrics.py).
"""

from __future__ import annotations

import pytest
from packfeed.service.delivery.serve_run import consumers_status, stopped_line


@pytest.mark.parametrize("attached, max_lag, said", [
    pytest.param(0, 0, "no consumer reading the buffer", id="none-attached"),
    pytest.param(2, 300, "slowest consumer 300 rows behind the reader", id="behind"),
    pytest.param(1, 1, "slowest consumer 1 row behind the reader", id="one-row-behind"),
    pytest.param(3, 12_345, "slowest consumer 12,345 rows behind the reader", id="thousands"),
    pytest.param(1, 0, "every consumer waiting for the reader (the nearest needs 1 more row)", id="at-the-reader"),
    pytest.param(2, -92, "every consumer waiting for the reader (the nearest needs 93 more rows)", id="ahead"),
])  # fmt: skip
def test_the_status_line_says_behind_or_waiting_never_a_negative_lag(attached, max_lag, said):
    assert consumers_status(attached, max_lag) == said
    assert "-" not in said


@pytest.mark.parametrize("drained_s, reader_stopped, ray_s, said", [
    pytest.param(0.42, True, 1.26, "stopped (drained in 0.4s, Ray shut down in 1.3s)", id="pipeline"),
    pytest.param(0.42, True, None, "stopped (drained in 0.4s)", id="packed-directory-no-ray"),
    pytest.param(3.0, False, 0.5, "stopped (drained in 3.0s, the reader did not stop in time, Ray shut down in 0.5s)",
                 id="reader-late"),
])  # fmt: skip
def test_the_last_line_names_a_ray_shutdown_only_when_ray_ran(drained_s, reader_stopped, ray_s, said):
    assert stopped_line(drained_s, reader_stopped, ray_s) == said
