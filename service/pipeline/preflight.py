"""What every command checks before Ray, in one order (``packfeed pack``, ``serve``, ``train``).

::

    join a cluster (when asked: its nodes scan) -> plan -> the command's own checks of the plan
      -> tokenizer -> probe (every input's first rows, the chat template on them) -> start Ray

A mistake in a config, an input or the tokenizer is then one line before an embedded Ray
starts (seconds). Each command passes only what differs:

* how its Ray starts and what it says (``RayStart``): serve's logs Ray's line; train's prints
  it, with the dashboard, and acts on a signal meanwhile instead of raising it
  (trainer/run.py); pack's starts it beside the checks, in the main thread while the checks
  run in another, with the driver's head start (ray_beside.py);
* its own checks of the plan (``check_plan``: pack's output, train's resume, model and memory
  plan), which may end the command there (a finished run resumed: no probe, no Ray);
* a tokenizer it loaded already (train, which needs one for a packed directory too), and the
  start-up clock (pack: the phases ``plan``, ``tokenizer_load`` and ``probe``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import StreamPlan, build_plan
from packfeed.service.data.probe import check_inputs
from packfeed.service.pipeline import raycluster
from packfeed.service.pipeline.startup import StartupClock
from packfeed.service.tokenize import samples

logger = logging.getLogger("packfeed")


def load_tokenizer_for(config: DataConfig, *, snapshot: bool = True) -> samples.SampleTokenizer:
    """The driver's tokenizer of ``config``: its name, loss mode, eos and back-end.
    ``snapshot``: rebuilt from the copy kept on this machine's disk (tokenize/snapshots.py: no
    transformers import from the second run on), enough for a driver that packs or serves."""
    return samples.load_tokenizer(config.tokenizer, snapshot=snapshot, loss=config.loss, add_eos=config.add_eos,
                                  backend=config.tokenizer_backend)


@dataclass(frozen=True)
class Checked:
    """What passed the checks: the plan, the driver's tokenizer (a ``SampleTokenizer``), and
    whether a cluster was joined before the plan (else Ray started after the probe)."""

    plan: StreamPlan
    tokenizer: Any
    joined: bool


class RayStart:
    """How a command gets its Ray around the checks: a cluster to join is joined before the
    plan (``join``: the scan runs on its nodes); any other Ray (embedded, this process's own)
    once the checks passed (``around``, ``start``). This one logs Ray's line (``up``);
    ``init_kwargs`` go to ``init_ray``. A command with its own way overrides some of them."""

    def __init__(self, address: str | None, **init_kwargs: Any) -> None:
        self.address, self.init_kwargs = address, init_kwargs
        self.joined = False

    def join(self) -> bool:
        """Join the cluster at ``address`` if it names one; whether it did."""
        self.joined = raycluster.joins_a_cluster(self.address)
        if self.joined:
            self.up()
        return self.joined

    def around(self, checks: Callable[[], Checked | None]) -> Checked | None:
        """``checks()``, then ``start`` when they passed."""
        checked = checks()
        if checked is not None:
            self.start()
        return checked

    def start(self) -> None:
        """Ray once the checks passed: nothing more after a join."""
        if not self.joined:
            self.up()

    def up(self) -> None:
        logger.info(raycluster.init_ray(self.address, **self.init_kwargs))


def preflight(config: DataConfig, ray: RayStart, *, scan_cache: str | None = None, tokenizer: Any = None,
              check_plan: Callable[[StreamPlan], bool] | None = None,
              clock: StartupClock | None = None) -> Checked | None:
    """Join (``ray.join``), then the checks (the plan, ``check_plan``, ``tokenizer`` or the
    config's, the probe) and Ray around them (``ray.around``): what passed, or None when
    ``check_plan`` said there is nothing more to do (no probe, no Ray). ``scan_cache``: where
    the plan keeps the inputs' scan manifest. Raises the first check that fails, before Ray
    starts (or, where Ray starts beside the checks, having shut it down)."""
    joined = ray.join()

    def checks() -> Checked | None:
        plan = build_plan(config, scan_cache=scan_cache)
        _mark(clock, "plan")
        if check_plan is not None and not check_plan(plan):
            return None
        loaded = tokenizer if tokenizer is not None else load_tokenizer_for(config)
        _mark(clock, "tokenizer_load")
        check_inputs(plan, loaded)
        _mark(clock, "probe")
        return Checked(plan, loaded, joined)

    return ray.around(checks)


def _mark(clock: StartupClock | None, phase: str) -> None:
    if clock is not None:
        clock.mark(phase)
