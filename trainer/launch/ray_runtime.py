"""What a rank's training loop asks of the launcher it runs under: its rows, its checkpoints.

The loop (trainer/loop/rank.py ``train_rank``) is the same under every launcher; a ``Runtime``
gives it, for this rank:

* ``rank``, ``world_size``, ``device``;
* ``request_rows(step)`` / ``rows(step)``: the rank's micro-batches of a global step by the
  serve contract (``RowFeeder.get_step``: None when the stream ended before it, ``STOP`` when
  the run stops before it); the loop requests the next step before it trains this one, so
  rows are read while the model computes;
* ``stream_state(step)``: the resume record after a step (stream cursor + manifest), written
  into the checkpoint by rank 0; ``sources()`` and ``set_mixture(step, weights)`` for the
  mixture hook;
* ``restore()``: the checkpoint directory to start from, or None;
* ``report(step, metrics, directory)``: every rank calls it at a checkpoint (a collective),
  with the directory it wrote its part of the checkpoint into (None: it wrote nothing).

``RayRuntime`` (here) is Ray Train's: the rows come from the run's ``RowFeeder`` actor, a
checkpoint is ``ray.train.report``ed (Ray Train uploads every rank's files into one checkpoint
directory and registers it), a restarted worker group restores Ray Train's latest checkpoint.
``trainer/launch/torchrun.py`` has the one for torchrun and SLURM, without Ray.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Protocol

from packfeed.service.face import MixtureRefused
from packfeed.trainer.state.checkpoint import checkpoint_name, local_copy


class Runtime(Protocol):
    rank: int
    world_size: int
    device: Any

    def request_rows(self, step: int) -> None: ...

    def rows(self, step: int) -> Any: ...

    def sources(self) -> list[tuple[str, int]]: ...

    def set_mixture(self, step: int, weights: dict[str, float]) -> dict: ...

    def stream_state(self, step: int) -> dict: ...

    def restore(self) -> contextlib.AbstractContextManager[Path | None]: ...

    def report(self, step: int, metrics: dict, directory: Path | None) -> None: ...


class RayRuntime:
    """A Ray Train worker's runtime: ``feeder`` the run's RowFeeder actor handle,
    ``resume_from`` the checkpoint of ``--resume`` (used when Ray Train has none of its own)."""

    def __init__(self, feeder: Any, *, resume_from: str | None) -> None:
        import ray.train
        import ray.train.torch

        context = ray.train.get_context()
        self.rank, self.world_size = context.get_world_rank(), context.get_world_size()
        self.device = ray.train.torch.get_device()
        self._feeder, self._resume_from = feeder, resume_from
        self._pending: dict[int, Any] = {}

    def request_rows(self, step: int) -> None:
        self._pending[step] = self._feeder.get_step.remote(self.rank, step)

    def rows(self, step: int) -> Any:
        import ray

        pending = self._pending.pop(step, None)
        return ray.get(pending if pending is not None else self._feeder.get_step.remote(self.rank, step))

    def sources(self) -> list[tuple[str, int]]:
        import ray

        return ray.get(self._feeder.sources.remote())

    def set_mixture(self, step: int, weights: dict[str, float]) -> dict:
        """The feeder's answer; its refusal (MixtureRefused, ValueError) raised as itself, not
        as Ray's wrapper, whose message carries the actor's whole traceback (the hook's one-line
        warning was a screenful)."""
        import ray

        try:
            return ray.get(self._feeder.set_mixture.remote(step, weights))
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, (MixtureRefused, ValueError)):
                raise exc.cause from None
            raise

    def stream_state(self, step: int) -> dict:
        import ray

        return ray.get(self._feeder.state.remote(step))

    @contextlib.contextmanager
    def restore(self) -> Iterator[Path | None]:
        """Ray Train's latest checkpoint (a restarted worker group), else ``--resume``'s."""
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as directory:
                yield Path(directory)
        elif self._resume_from:
            with local_copy(self._resume_from) as directory:
                yield Path(directory)
        else:
            yield None

    def report(self, step: int, metrics: dict, directory: Path | None) -> None:
        import ray.train

        if directory is None:
            ray.train.report(metrics)
        else:
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(directory)),
                             checkpoint_dir_name=checkpoint_name(step))
