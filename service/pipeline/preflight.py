"""What every command checks before Ray, in one order (``packfeed pack``, ``serve``, ``train``).

::

    join a cluster (when asked: its nodes scan) -> plan -> the command's own checks of the plan
      -> tokenizer -> probe (every input's first rows, the chat template on them) -> start Ray

A mistake in a config, an input or the tokenizer is then one line before an embedded Ray
starts (seconds). Each command passes only what differs:

* how its Ray starts and what it says (``RayStart``): serve's logs Ray's line; train's prints
  it, with the dashboard, and acts on a signal meanwhile instead of raising it
  (trainer/launch/ray_driver.py); pack's starts it beside the checks, in the main thread while the checks
  run in another, with the driver's head start (ray_beside.py);
* its own checks of the plan (``check_plan``: pack's output, train's resume, model and memory
  plan), which may end the command there (a finished run resumed: no probe, no Ray);
* a tokenizer it loaded already (train, which needs one for a packed directory too), and the
  start-up clock (pack: the phases ``plan``, ``tokenizer_load`` and ``probe``);
* where a probe that passed is recorded (``probe_record``: serve's state dir), so that a restart
  on the same inputs does not read their first rows again (``probe_once``).

The probe's requests to a store are added to the plan's (``plan.scan_storage``): stats.json's
``storage`` then counts every input byte the run read, as the store saw them.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Callable

from packfeed.service import storage
from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import StreamPlan, build_plan
from packfeed.service.data.probe import check_inputs, describe
from packfeed.service.cluster import raycluster
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
              check_plan: Callable[[StreamPlan], bool] | None = None, clock: StartupClock | None = None,
              probe_record: str | None = None) -> Checked | None:
    """Join (``ray.join``), then the checks (the plan, ``check_plan``, ``tokenizer`` or the
    config's, the probe) and Ray around them (``ray.around``): what passed, or None when
    ``check_plan`` said there is nothing more to do (no probe, no Ray). ``scan_cache``: where
    the plan keeps the inputs' scan manifest; ``probe_record``: see ``probe_once``. Raises the
    first check that fails, before Ray starts (or, where Ray starts beside the checks, having
    shut it down)."""
    joined = ray.join()

    def checks() -> Checked | None:
        plan = build_plan(config, scan_cache=scan_cache)
        _mark(clock, "plan")
        if check_plan is not None and not check_plan(plan):
            return None
        loaded = tokenizer if tokenizer is not None else load_tokenizer_for(config)
        _mark(clock, "tokenizer_load")
        probe_once(plan, loaded, config, probe_record)
        _mark(clock, "probe")
        return Checked(plan, loaded, joined)

    return ray.around(checks)


def probe_once(plan: StreamPlan, tokenizer: Any, config: DataConfig, record: str | None = None) -> None:
    """The probe (``check_inputs``: every input's first rows), its requests to a store added to
    ``plan.scan_storage``; with ``record`` (a path or URI), only when ``record`` does not say
    that a probe of these very inputs passed already, and said there when it passes.

    "These very inputs": ``probe_digest`` (the config's hash, the plan's fingerprint and every
    file's version: size, mtime, ETag), so a changed file or config is probed again. A restarted
    ``serve`` on another node thus reads nothing before its consumers' cursor: on a store the
    probe reads up to 32 files per source, each from its start (a JSONL seek stretch, a Parquet
    footer and first row group: up to a row group's size per file). The tokenizer's back-end is
    checked either way (no I/O). A record that cannot be read or written costs a probe, never
    the start."""
    digest = probe_digest(config, plan)
    if record is not None and _read_record(record) == digest:
        for line in describe({}, plan):  # the sources and the schedule, as a probe says them
            logger.info(line)
        logger.info("the inputs' first rows were probed by an earlier start on these same files (%s): not read again",
                    storage.display(record))
        tokenizer.check_backend()
        return
    before = storage.COUNTERS.snapshot()
    try:
        check_inputs(plan, tokenizer)
    finally:
        plan.scan_storage = plan.scan_storage + (storage.COUNTERS.snapshot() - before)
    if record is not None:
        try:
            storage.write_bytes_atomic(record, f"{digest}\n".encode())
        except (storage.StorageError, OSError) as exc:
            logger.warning("could not record the probe in %s (%s): a restart probes the inputs again",
                           storage.display(record), exc)


def probe_digest(config: DataConfig, plan: StreamPlan) -> str:
    """Digest of what a probe judged: the config, the plan, every input file's version."""
    h = hashlib.sha256(f"{config.config_hash()}|{plan.fingerprint()}".encode())
    for s in plan.sources:
        for f in s.files:
            h.update(f"|{f.path}|{f.size}|{f.mtime_ns}|{f.etag}".encode())
    return h.hexdigest()


def _read_record(record: str) -> str | None:
    """The digest a probe record holds, or None (none yet, or unreadable: then probe)."""
    try:
        return storage.read_bytes(record).decode(errors="replace").strip()
    except (storage.StorageError, OSError):
        return None


def _mark(clock: StartupClock | None, phase: str) -> None:
    if clock is not None:
        clock.mark(phase)
