"""RowFeeder: a training run's one reader of the packed stream, on the serve contract; and
StreamFeeder, the RowFeeder a run's actor builds over the run's own stream. ``packfeed train``
uses both (Ray's feeder actor, torchrun's packed-directory rows); they hold no torch and no
trainer code.

Ray Train's own dataset sharding (``streaming_split``) hands blocks to whichever worker asks
first, so which rank trains on which row is not reproducible. packfeed instead reads the
ordered stream in ONE place, this actor, through the same ``RowHub`` as ``packfeed serve``,
and hands out rows with the same function (``service/delivery/steps.py``, the rule of
``service/delivery/assign.py``): at step s, rank k of N gets the B = grad_accum x
micro_batch_rows rows of the step whose global index is k mod N, the last step filled with
flagged padding rows. Rank k's micro-batch m is rows m*M .. (m+1)*M - 1 of its B. With
``balance = "compute"`` the step's same N*B rows are given out by service/delivery/balance.py
instead, so that every micro-batch's ranks hold the same attention work. The answer
is a function of the stream only, so an interrupted-then-resumed run, a run whose worker group
Ray Train restarted, and an uninterrupted run train on the same rows.

The resume record is the client's ``StreamState`` (client/state.py: ``{"version", "cursor",
"step", "config_hash", "seq_len"}``, cursor = rows of the stream consumed after the step), plus
the manifest of window first rows (service/delivery/manifest.py), so a resumed run packs from
the window holding the cursor, not from the start, also with another world size or batch size.

Mixture changes: ``set_mixture(step, weights)`` (the training loop's hook, trainer/loop/mixture_hook.py) changes
the weights from the first window no rank has received (what was packed ahead is packed again;
service/delivery/mixture_changes.py), once
per step whichever rank asks; the change is recorded in the manifest, so in every checkpoint
taken after it, and a resumed run replays the checkpoint's changes (``load_manifest``).

Stopping: ``request_stop()`` (the driver, on SIGTERM/SIGINT) fixes the stop step at one past
the highest step any rank has asked for so far; ``get_step`` answers ``STOP`` for that step and
every later one and rows for every earlier one, so all ranks finish the steps they may already
hold and stop after the same step (a rank that stopped alone would hang the others in DDP's
collectives).

Cost: every row passes through this actor once (one copy into the object store per
micro-batch: ~0.4 MB for 8 rows of 4096 tokens); a request blocks only until the packers have
produced the step's rows. The actor asks for no CPU.

``StreamFeeder`` (the class the driver, trainer/launch/ray_driver.py, makes the actor of) opens the run's
stream inside the actor (``service/delivery/row_stream.open_stream``: the packing pipeline of
the data config, or a packed directory as it is) and its manifest (``load_manifest``), then is
a RowFeeder over it; ``packed_dir_feeder`` is the same over a packed directory in the calling
process (torchrun's ranks).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from packfeed.client.rows import PackedRows
from packfeed.client.state import StreamState
from packfeed.service.delivery.assign import check_request, split_micro_batches
from packfeed.service.delivery.balance import check_balance
from packfeed.service.delivery.hub import OpenReader, RowHub
from packfeed.service.delivery.manifest import Manifest
from packfeed.service.delivery.mixture_changes import MixtureControl, MixtureRefused, apply_change
from packfeed.service.delivery.row_stream import PackedDir, open_stream, packed_dir_stream
from packfeed.service.delivery.steps import rank_batch
from packfeed.service.faults import adopt as adopt_faults
from packfeed.service.cluster.ray_noise import quiet_ray
from packfeed.service.tokenize.samples import SampleTokenizer

logger = logging.getLogger(__name__)

STOP = "stop"  # get_step's answer from the stop step on (request_stop)


class RowFeeder:
    """Plain class (tests drive it directly); ``ray.remote(num_cpus=0, max_concurrency=...)``
    in a run. ``open_reader``: the hub's reader (tests inject one; a run's ``StreamFeeder``
    uses its ``service.delivery.row_stream.RowStream``'s). ``state``: the stream state of the
    checkpoint to resume from (a ``StreamState`` or its record; None: the start); its step is
    the global step the run starts at."""

    def __init__(
        self,
        open_reader: OpenReader,
        manifest: Manifest,
        *,
        world_size: int,
        grad_accum: int,
        micro_rows: int,
        seq_len: int,
        pad_id: int,
        config_hash: str,
        state: StreamState | dict | None = None,
        capacity: int | None = None,
        stats: Any = None,
        mixture: MixtureControl | None = None,
        balance: str = "off",
    ) -> None:
        """``stats``: the RunStats the reader folds its windows into (None in tests);
        ``mixture``: the stream's MixtureControl, attached to ``manifest`` (None: a packed
        directory, whose mixture cannot change); ``balance``: "off" or "compute" (each rank's
        micro-batch m the same attention work as the others', balance.py)."""
        start = StreamState.resume_from(state)
        start.check_matches(config_hash, seq_len)
        self.world_size, self.grad_accum, self.micro_rows = world_size, grad_accum, micro_rows
        self.batch_rows = grad_accum * micro_rows
        self.seq_len, self.pad_id, self.config_hash = seq_len, pad_id, config_hash
        self.balance = check_balance(balance)
        self.cursor0, self.first_step = start.cursor, start.step
        check_request(0, world_size, self.batch_rows, self.cursor0)
        per_step = world_size * self.batch_rows
        self.hub = RowHub(open_reader, manifest, capacity=capacity or max(2048, 4 * per_step))
        self._consumers = [self.hub.consumer() for _ in range(world_size)]
        self._stats = stats  # the pipeline's RunStats, read at the end (None in tests)
        self.mixture = mixture
        self._started = time.perf_counter()
        # The actor answers several ranks at once (max_concurrency): the highest step asked for
        # and the stop step change together, under this lock.
        self._lock = threading.Lock()
        self._highest = self.first_step - 1  # the highest step any rank has asked for
        self._stop_step: int | None = None
        # Pack while Ray Train starts its workers (seconds of process start and imports): the
        # first step's rows are ready when the ranks first ask, not packed only then.
        self.hub.start(self.cursor0)

    def get_step(self, rank: int, step: int) -> list[PackedRows] | str | None:
        """Rank ``rank``'s micro-batches of global ``step`` (each exactly ``micro_rows`` rows,
        padding included), None when the stream ended before this step, or ``STOP`` when the
        run stops before this step (``request_stop``)."""
        if step < self.first_step:
            raise ValueError(f"step {step} is before this run's first step {self.first_step}")
        with self._lock:
            if self._stop_step is not None and step >= self._stop_step:
                return STOP
            self._highest = max(self._highest, step)
        batch = rank_batch(self._consumers[rank], rank=rank, world_size=self.world_size, batch_rows=self.batch_rows,
                           cursor=self.cursor0, step=step - self.first_step, seq_len=self.seq_len, pad_id=self.pad_id,
                           balance=self.balance, grad_accum=self.grad_accum)
        return None if batch is None else split_micro_batches(batch.rows, self.grad_accum)

    def set_mixture(self, step: int, weights: dict[str, float]) -> dict:
        """The mixture change of global ``step`` (made by the first rank asking; see the module
        docstring), from the first window no rank has received: the rows of every step asked for
        so far stay, what the reader packed beyond them with the old weights is packed again.
        Its record (client/mixture_record.py), ``schedule_index``, ``consumer_window`` (the window
        holding the ranks' cursor) and ``lag_samples`` (at most one window). ValueError for bad
        weights (nothing changes), MixtureRefused when the stream cannot change."""
        if self.mixture is None:
            raise MixtureRefused("the run trains on a packed directory as it is: its mixture cannot change (pack it "
                                 "again with [[data.schedule]] entries, or train on the data config)")
        made = len(self.mixture.changes)
        with self._lock:  # no step past the highest asked for is handed out meanwhile
            cursor = self.cursor0 + (self._highest + 1 - self.first_step) * self.world_size * self.batch_rows
            answer = apply_change(self.mixture, self.hub, step, weights, cursor)
        change = answer.change
        if len(self.mixture.changes) > made:
            logger.info("mixture changed at step %d: from sample %s (window %d; the ranks are in window %d) the weights "
                        "are %s", step, f"{change.from_sample:,}", change.window, answer.consumer_window,
                        dict(change.weights))
        return {**change.to_dict(), "schedule_index": self.mixture.index_of(change),
                "consumer_window": answer.consumer_window, "lag_samples": change.from_sample - answer.consumer_sample}

    def request_stop(self) -> int:
        """Stop the run as soon as every rank can: returns the stop step, the count of completed
        steps every rank stops at (the same for all: one past the highest step any rank has asked
        for, so no rank is refused a step another one may already train). Asking again returns
        the same step."""
        with self._lock:
            if self._stop_step is None:
                self._stop_step = self._highest + 1
            return self._stop_step

    def state(self, step: int) -> dict:
        """The resume record after global ``step`` (1-based count of completed steps)."""
        s = step - self.first_step
        cursor = self.cursor0 + s * self.world_size * self.batch_rows
        total = self.hub.total_rows
        if total is not None:
            cursor = min(cursor, total)
        stream = StreamState(cursor=cursor, step=step, config_hash=self.config_hash, seq_len=self.seq_len)
        return {"stream": stream.to_dict(), "manifest": self.hub.manifest.to_dict()}

    def total_rows(self) -> int | None:
        return self.hub.total_rows

    def packing_stats(self) -> dict:
        """Packing totals of the windows the reader has packed so far (empty in tests), and how
        often the reader was started again (``reader_restarts``: one per jump back to rows the
        feeder no longer held, 0 in a run without one)."""
        if self._stats is None:
            return {"reader_restarts": self.hub.restarts}
        stats = self._stats.to_dict(seq_len=self.seq_len, seconds=time.perf_counter() - self._started)
        return {**stats, "reader_restarts": self.hub.restarts}


def load_manifest(key: str, path: str | Path | None, saved: dict | None) -> Manifest:
    """The run's manifest: the file under the run's output, merged with a checkpoint's copy.
    The checkpoint's mixture changes are the run's: a file that recorded others (made after the
    checkpoint, by the run that resumed from it) is started again from the checkpoint's copy."""
    manifest = Manifest(key, path)
    if saved and saved.get("key") == key and manifest.mixture != list(saved.get("mixture") or []):
        manifest.reset(list(saved.get("mixture") or []))
    if saved and saved.get("key") == key:
        for w, r in saved.get("first_row", {}).items():
            manifest.record(int(w), int(r))
        if saved.get("total_rows") is not None:
            manifest.record_end(int(saved["total_rows"]))
    return manifest


def over_stream(stream: Any, *, manifest_path: str | Path | None, saved_manifest: dict | None) -> dict[str, Any]:
    """RowFeeder's arguments that come from a RowStream (``open_stream``: a packing pipeline's
    or a packed directory's): its reader, its manifest (``load_manifest``: the run's file at
    ``manifest_path``, or none, merged with a checkpoint's copy), its seq_len, config hash,
    stats and mixture control (attached to the manifest: the checkpoint's changes, then the
    loop's new ones)."""
    manifest = load_manifest(stream.manifest_key, manifest_path, saved_manifest)
    stream.seed_manifest(manifest)
    if stream.mixture is not None:
        stream.mixture.attach(manifest)
    return {"open_reader": stream.open_reader, "manifest": manifest, "seq_len": stream.seq_len,
            "config_hash": stream.config_hash, "stats": stream.stats, "mixture": stream.mixture}


def stream_sources(stream: Any) -> list[tuple[str, int]]:
    """(name, first global sample id) of every source of a RowStream, in config order: the
    mixture hook's."""
    return [(s["name"], int(s.get("first_sample_id", 0))) for s in stream.sources]


def packed_dir_feeder(packed: PackedDir, *, saved_manifest: dict | None, **layout: Any) -> tuple[RowFeeder, list]:
    """(a RowFeeder over the packed directory ``packed`` in this process, as Ray's feeder actor
    has over it, its sources as ``stream_sources``). ``layout``: RowFeeder's ``world_size``,
    ``grad_accum``, ``micro_rows``, ``pad_id``, ``state``, ``capacity``, ``balance``."""
    stream = packed_dir_stream(packed.path, packed.info)
    feeder = RowFeeder(**over_stream(stream, manifest_path=None, saved_manifest=saved_manifest), **layout)
    return feeder, stream_sources(stream)


class StreamFeeder(RowFeeder):
    """The run's RowFeeder, built inside its actor over the run's stream (``open_stream``): the
    packing pipeline of the data config (``packed_or_plan`` a StreamPlan) or a PackedDir.
    ``tokenizer``: the driver's ``SampleTokenizer.ship()``, for the catch-up path and the
    packing actors (none of them imports transformers or proves steps 1-3 again)."""

    def __init__(self, config: Any, packed_or_plan: Any, scaling: Any, *, manifest_path: str, state: dict | None,
                 saved_manifest: dict | None, pad_id: int, tokenizer: Any, faults_env: dict | None = None,
                 **layout: Any) -> None:
        quiet_ray()
        adopt_faults(faults_env)
        loaded = SampleTokenizer(tokenizer, loss=config.loss, add_eos=config.add_eos, backend=config.tokenizer_backend)
        stream = open_stream(packed_or_plan, config, tokenizer=loaded, scaling=scaling)
        self._sources = stream_sources(stream)
        super().__init__(**over_stream(stream, manifest_path=manifest_path, saved_manifest=saved_manifest),
                         pad_id=pad_id, state=state, **layout)

    def sources(self) -> list[tuple[str, int]]:
        """(name, first global sample id) of every source, in config order: the mixture hook's."""
        return self._sources
