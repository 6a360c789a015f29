"""``packfeed train --launcher torchrun``: the trainer without Ray, one process per rank.

::

    torchrun --nproc-per-node 8 --no-python packfeed train --config run.toml --launcher torchrun runs/packed
    torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HEAD:29400 --no-python \\
        packfeed train --config run.toml --launcher torchrun --server PACKER:50051

Each process is one rank (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` from torchrun; NCCL on GPUs,
gloo on CPU) and runs the loop every Ray Train worker runs (loop/rank.py ``train_rank``): the same
step, attention choice, objectives, sharding, checkpoints, metrics. What Ray gave it comes from
a ``TorchrunRuntime`` instead:

* rows: from a packed directory (``INPUT``; each rank reads the directory itself, through the
  same RowFeeder and serve contract as Ray's feeder actor, and keeps only its own rows of each
  step) or from a running ``packfeed serve`` (``--server``; each rank is one client of rank k of
  N, its exactly-once stream state saved in every checkpoint). Data that would need packing is
  refused before training starts: pack it first, or serve it.
* checkpoints: every rank writes its part into ``<output>/checkpoints/.partial-checkpoint_N``
  (a shared filesystem, as every multi-node torchrun job has); after a barrier rank 0 renames
  it ``checkpoint_N`` (so a checkpoint that exists is whole) and keeps ``keep_checkpoints``.
* stop: SIGTERM or SIGINT (``scancel``, Kubernetes, Ctrl-C, torchrun forwarding them) sets a
  flag; before each step the ranks agree (an all_reduce of one number) and all stop after the
  same step, checkpoint it, and exit 143 / 130. torchrun gives its workers 30 s after forwarding
  a signal, SLURM ``KillWait`` (30 s by default): a step and a checkpoint must fit.
* the driver's duties fall to rank 0: the checks before training (output, resume, tokenizer,
  model, memory plan), the summary, ``final/`` with the tokenizer. A process torchrun restarts
  (``--max-restarts``) resumes from the latest checkpoint by itself.

Ray is not imported in this mode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import grpc

from packfeed.client.rows import PackedRows
from packfeed.client.stream import PackedStream, StreamError
from packfeed.service.face import (
    STOP,
    MixtureRefused,
    display,
    find_packed_dir,
    is_remote,
    packed_dir_feeder,
    split_micro_batches,
    write_json,
)
from packfeed.trainer.launch.finish import RunEnd, finish_run
from packfeed.trainer.launch.prechecks import Opened, Prechecked, check_run, open_output, training_line
from packfeed.trainer.launch.signals import StopSignals, stop_exception
from packfeed.trainer.loop.interval import PACKED_OUTPUT, packing_figures
from packfeed.trainer.loop.rank import train_rank
from packfeed.trainer.model.attention import check_attention
from packfeed.trainer.run_config import RunConfig
from packfeed.trainer.state.checkpoint import partial_checkpoint, publish_checkpoint
from packfeed.trainer.state.resume import check_packed_dir
from packfeed.trainer.state.run_dir import RunDir
from packfeed.trainer.state.train_state import TrainState

logger = logging.getLogger(__name__)

# How long the ranks of an attempt wait for each other before training (a rank that never
# starts: one line), and the process group's timeout for a collective (torch's own for NCCL).
ARRIVE_S = 300.0
GROUP_S = 600.0


class DirectoryRows:
    """A packed directory's rows for one rank, read in this process by the serve contract
    (``packed_dir_feeder``: a RowFeeder over the directory's stream, as Ray's feeder actor is;
    the rows of rank k of step s are the actor's). ``state``: the checkpoint's trainer state
    (None: the start)."""

    def __init__(self, packed: Any, run: RunConfig, *, world_size: int, rank: int, pad_id: int,
                 state: TrainState | None) -> None:
        self.rank = rank
        self.feeder, self.sources_ = packed_dir_feeder(
            packed, saved_manifest=None if state is None else state.manifest, world_size=world_size,
            grad_accum=run.train.grad_accum, micro_rows=run.train.micro_batch_rows, pad_id=pad_id,
            state=None if state is None else state.stream, capacity=run.feeder_buffer_rows, balance=run.train.balance)

    def get(self, step: int) -> list[PackedRows] | None:
        return self.feeder.get_step(self.rank, step)

    def state(self, step: int) -> dict:
        return self.feeder.state(step)

    def set_mixture(self, step: int, weights: dict[str, float]) -> dict:
        return self.feeder.set_mixture(step, weights)

    def figures(self) -> dict[str, Any]:
        """The summary's stream figures (finish.py ``RunEnd``), as Ray's feeder actor gives them."""
        return {"stream_rows": self.feeder.total_rows(), "reader_restarts": self.feeder.hub.restarts}

    def close(self) -> None:
        self.feeder.hub.close()


class ServerRows:
    """A running ``packfeed serve``'s rows for one rank: a client of rank k of N whose batches
    are the rank's rows of consecutive steps (``grad_accum x micro_batch_rows`` rows each);
    ``state``: the checkpoint's stream state (the client's exactly-once record)."""

    def __init__(self, target: str, run: RunConfig, *, world_size: int, rank: int, state: TrainState | None,
                 token: str | None, tls_ca: str | None, tls_server_name: str | None) -> None:
        self.grad_accum = run.train.grad_accum
        self.stream = PackedStream(target, rank=rank, world_size=world_size,
                                   batch_rows=run.train.grad_accum * run.train.micro_batch_rows,
                                   state=None if state is None else state.stream, token=token, tls_ca=tls_ca,
                                   tls_server_name=tls_server_name)
        info = self.stream.describe()
        if info.seq_len != run.data.seq_len:
            raise ValueError(f"the server at {target} streams rows of {info.seq_len} tokens, the run's seq_len is "
                             f"{run.data.seq_len}: set seq_len = {info.seq_len}")
        self.sources_ = [(s.name, int(s.first_sample_id)) for s in info.sources]

    def get(self, step: int) -> list[PackedRows] | None:
        batch = next(self.stream, None)
        if batch is None:
            return None
        return split_micro_batches(batch.rows, self.grad_accum)

    def state(self, step: int) -> dict:
        return {"stream": self.stream.state_dict(), "manifest": None}

    def set_mixture(self, step: int, weights: dict[str, float]) -> dict:
        """The server's answer; FAILED_PRECONDITION (a stream that cannot change, or has no
        window left to change) is the hook's MixtureRefused, as with the feeder: the run goes on."""
        try:
            return self.stream.set_mixture(weights, step=step)
        except StreamError as exc:
            if exc.code == grpc.StatusCode.FAILED_PRECONDITION:
                raise MixtureRefused(exc.details) from None
            raise

    def figures(self) -> dict[str, Any]:
        """The summary's stream figures: the server's stream has no end this client knows of."""
        return {"stream_rows": None, "reader_restarts": 0}

    def close(self) -> None:
        self.stream.close()


class TorchrunRuntime:
    """One torchrun rank's runtime (trainer/launch/ray_runtime.py): ``source`` its rows (``DirectoryRows``
    or ``ServerRows``), checkpoints under ``<output>/checkpoints``, the stop agreed by all ranks."""

    def __init__(self, source: Any, *, output: Path, resume_from: Path | None, keep: int, stop: StopSignals,
                 rank: int, world_size: int, device: Any) -> None:
        self.source, self.output, self.resume_from, self.keep, self.stop = source, output, resume_from, keep, stop
        self.rank, self.world_size, self.device = rank, world_size, device
        self.stopped_by: str | None = None  # the signal the ranks stopped on (any rank's: SIGTERM first)

    def request_rows(self, step: int) -> None:
        """Nothing to ask: both sources read ahead by themselves."""

    def rows(self, step: int) -> Any:
        import torch
        import torch.distributed as dist

        # this rank's signal number (0: none); the highest any rank got is the group's stop, so a
        # signal that reached one rank alone (a `kill` of one process) stops every rank
        flag = torch.tensor([float(self.stop.received[0]) if self.stop.requested else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            self.stopped_by = signal.Signals(int(flag.item())).name
            return STOP
        return self.source.get(step)

    def sources(self) -> list[tuple[str, int]]:
        return self.source.sources_

    def set_mixture(self, step: int, weights: dict[str, float]) -> dict:
        return self.source.set_mixture(step, weights)

    def stream_state(self, step: int) -> dict:
        return self.source.state(step)

    @contextlib.contextmanager
    def restore(self) -> Iterator[Path | None]:
        yield self.resume_from

    def report(self, step: int, metrics: dict, directory: Path | None) -> None:
        """Every rank's files of the checkpoint of ``step`` into one directory; rank 0 publishes
        it once all have written (a barrier), then drops the oldest beyond ``keep``."""
        import torch.distributed as dist

        root = self.output / RunDir.CHECKPOINTS
        partial = partial_checkpoint(root, step)
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)  # a previous attempt's, cut short
        dist.barrier()
        if directory is not None:
            shutil.copytree(directory, partial, dirs_exist_ok=True)
        dist.barrier()
        if self.rank == 0:
            publish_checkpoint(root, step, keep=self.keep)
        dist.barrier()


def join_group(backend: str, *, rank: int, world: int, arrive_s: float = ARRIVE_S) -> None:
    """The job's process group, on torchrun's store under this attempt's own prefix.

    torchrun keeps its store across the restarts of ``--max-restarts``: the addresses the ranks
    of the previous attempt published there are still in it, and a restarted rank that read one
    would connect to a process that no longer exists until the backend's timeout (gloo's: 30
    minutes, without a word). Every attempt (``TORCHELASTIC_RESTART_COUNT``) therefore keys its
    own. The ranks first wait ``arrive_s`` at most for each other: a group that cannot form
    (a rank that never starts) is one line naming how many arrived, not a silent wait."""
    import torch.distributed as dist

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    address, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"])
    try:
        base = dist.TCPStore(address, port, world, is_master=False, timeout=timedelta(seconds=arrive_s),
                             wait_for_workers=False)
    except (RuntimeError, dist.DistStoreError) as exc:
        raise ValueError(f"rank {rank}: torchrun's store at {address}:{port} did not answer in {arrive_s:.0f} s "
                         f"({exc.__class__.__name__})") from None
    store = dist.PrefixStore(f"packfeed/attempt-{attempt}", base)
    arrived = store.add("arrived", 1)
    deadline = time.monotonic() + arrive_s
    while arrived < world:
        if time.monotonic() > deadline:
            raise ValueError(f"rank {rank}: {arrived} of {world} ranks joined the group of attempt {attempt} in "
                             f"{arrive_s:.0f} s; the others did not start (see their logs)")
        time.sleep(0.2)
        arrived = store.add("arrived", 0)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=GROUP_S))


def distributed_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; ValueError outside torchrun."""
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    except KeyError:
        raise ValueError("--launcher torchrun: RANK and WORLD_SIZE are not set; start it with `torchrun "
                         "--nproc-per-node N --no-python packfeed train ... --launcher torchrun`") from None


def refuse_what_needs_ray(run: RunConfig, *, server: str | None, output: str) -> Any:
    """The packed directory the run trains on (None with ``server``); ValueError, one line with
    the fix, for what only the Ray launcher can do: data to pack, placement, an object-store
    output. Reads the packed directory's metadata only."""
    placement = [name for name in ("trainer_labels", "driver_labels") if getattr(run.scaling, name) is not None]
    placement += ["trainer_resources"] if run.scaling.trainer_resources else []
    if placement:
        raise ValueError(f"[scaling] {', '.join(placement)} place Ray Train workers; under torchrun the launcher "
                         "(srun, the job's nodes) places the ranks: remove them")
    if is_remote(output):
        raise ValueError(f"--launcher torchrun writes checkpoints from every rank into --output: give a shared "
                         f"filesystem path, not {display(output)}")
    if server is not None:
        return None
    packed = find_packed_dir(run.data.inputs)
    if packed is None:
        raise ValueError("--launcher torchrun trains on packed rows and does not start Ray to pack: pack the data "
                         "first (`packfeed pack ... --output DIR`, then train on DIR) or run `packfeed serve` on "
                         "the CPU nodes and pass --server HOST:PORT")
    if run.train.mixture_hook is not None:
        raise ValueError("[train] mixture_hook changes the mixture, and a packed directory's rows are fixed: train "
                         "from `packfeed serve --config` (--server) to change it during the run")
    return packed


def device_for(run: RunConfig, local_rank: int) -> Any:
    """CUDA device ``local_rank`` when the node has GPUs and ``[scaling] use_gpu`` allows, else the CPU."""
    import torch

    if run.scaling.use_gpu != "no" and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if run.scaling.use_gpu == "yes":
        raise ValueError("[scaling] use_gpu = yes, but this node has no CUDA GPU")
    return torch.device("cpu")


def train_torchrun(run: RunConfig, *, output: str | Path, resume: bool | str = False, overwrite: bool = False,
                   server: str | None = None, token: str | None = None, tls_ca: str | None = None,
                   tls_server_name: str | None = None, no_memory_check: bool = False) -> dict[str, Any] | None:
    """This process's rank of a torchrun job (see the module docstring); rank 0 returns the
    summary, the others None. ``[scaling] num_workers`` is the launcher's world size. Raises
    ValueError (every rank, the same line) for what rank 0's checks refuse, ``Terminated`` /
    ``KeyboardInterrupt`` after a stop's checkpoint."""
    import torch.distributed as dist  # torch: ~1 s to import, not for the module's importers

    rank, world, local_rank = distributed_env()
    packed = refuse_what_needs_ray(run, server=server, output=os.fspath(output))
    output = Path(output)
    if run.scaling.num_workers != world:
        run = dataclasses.replace(run, scaling=dataclasses.replace(run.scaling, num_workers=world))
    device = device_for(run, local_rank)
    check_attention(run.model.attn, device)  # every rank the same line, before the process group and any row
    join_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world=world)
    try:
        with StopSignals(forwarded=True) as stop:
            opened, verdict = _checks(run, output, packed=packed, server=server, resume=resume, overwrite=overwrite,
                                      no_memory_check=no_memory_check) if rank == 0 else (None, None)
            shared = [verdict]  # rank 0's Prechecked, or the line of what its checks refused
            dist.broadcast_object_list(shared, src=0)
            checked = shared[0]
            if isinstance(checked, str):
                raise ValueError(checked)
            if checked.done is not None:
                return checked.done if rank == 0 else None
            if server is None:
                source = DirectoryRows(packed, run, world_size=world, rank=rank, pad_id=checked.pad_id,
                                       state=checked.state)
            else:
                source = ServerRows(server, run, world_size=world, rank=rank, state=checked.state, token=token,
                                    tls_ca=tls_ca, tls_server_name=tls_server_name)
            resume_from = None if checked.resume_from is None else Path(checked.resume_from)
            runtime = TorchrunRuntime(source, output=output, resume_from=resume_from, keep=run.train.keep_checkpoints,
                                      stop=stop, rank=rank, world_size=world, device=device)
            started = time.perf_counter()
            try:
                train_rank(run, runtime, output=str(output), vocab_size=checked.vocab_size, pad_id=checked.pad_id)
                figures = source.figures()
            finally:
                source.close()
            summary = None
            if rank == 0:
                packing = None if packed is None else packing_figures(packed.info.get("stats"), origin=PACKED_OUTPUT)
                summary = finish_run(run, output, opened.tokenizer, RunEnd(
                    launcher="torchrun", started=started, packing=packing, **figures,
                    stopped_by=runtime.stopped_by))
            dist.barrier()
            if runtime.stopped_by is not None:
                raise stop_exception(runtime.stopped_by)
            return summary
    finally:
        dist.destroy_process_group()


def _checks(run: RunConfig, output: Path, *, packed: Any, server: str | None, resume: bool | str, overwrite: bool,
            no_memory_check: bool) -> tuple[Opened | None, Prechecked | str]:
    """Rank 0's checks before any rank builds a model, the Ray driver's (launch/prechecks.py):
    (what it opened, the ``Prechecked`` every rank receives) or (None, the line of what they
    refused). A process torchrun restarted resumes from the latest checkpoint."""
    try:
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
            resume, overwrite = "auto", False  # torchrun started the job again after a rank died
        opened = open_output(run, output, resume=resume, overwrite=overwrite)
        if packed is not None:
            check_packed_dir(display(packed.path), packed.info, run.data.seq_len, opened.tokenizer)
        checked = check_run(run, opened, output=output, packed_or_plan=packed, no_memory_check=no_memory_check)
        if checked.done is None:
            if opened.clear_previous is not None:
                opened.clear_previous()
            output.mkdir(parents=True, exist_ok=True)
            write_json(RunDir(output).config, run.to_dict())
            where = f"the packed directory {packed.path}" if packed is not None else f"the server at {server}"
            print(training_line(run, on=f"{run.scaling.num_workers} rank(s) (torchrun) from {where}",
                                start_step=0 if checked.state is None else checked.state.step, output=output),
                  flush=True)
        return opened, checked
    except ValueError as exc:
        return None, str(exc)
