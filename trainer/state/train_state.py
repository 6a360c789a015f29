"""TrainState: the trainer state a checkpoint keeps (``trainer_state.json``), as a typed record.

One record, read and written in one place::

    {"step": 6,                                   completed optimizer steps
     "stream": {"version": 1, "cursor": 48, ...}, the client's StreamState record after the step
     "manifest": {"key": ..., "first_row": {...}, "total_rows": ..., "mixture": [...]},
     "config": {"data": ..., "model": ..., "train": ..., "scaling": ...}}   RunConfig.to_dict()

``to_dict`` gives the keys in that order (the order the worker's checkpoint has always written
them, so ``json.dumps`` of it is byte-identical); ``from_dict`` reads it back, ValueError
naming the damaged field. Checkpoints written before ``manifest`` or ``config`` existed load
with them None, and ``to_dict`` leaves them out again.

Standard library and ``packfeed.client`` only (no torch, no Ray): the driver, the worker and
checkpoint.py all import it. Cost: ``from_dict`` validates the stream record and the fields
the accessors read, O(1) plus one ``StreamState`` parse; the records are held as given, not
copied (treat them as read-only).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Mapping

from packfeed.client.state import StreamState

FIELDS = ("step", "stream", "manifest", "config")  # to_dict's key order
DEFAULT_OBJECTIVE = "sft"  # what a checkpoint from before [train] objective existed trained


@dataclass(frozen=True, kw_only=True)
class TrainState:
    """A checkpoint's trainer state (see the module docstring). ``stream``: the StreamState
    record after ``step`` (``{}``: the stream's start); ``manifest``: the window first rows
    (service/delivery/manifest.py), None in old checkpoints; ``config``: the run's
    ``RunConfig.to_dict()``, None in old checkpoints."""

    step: int
    stream: dict
    manifest: dict | None = None
    config: dict | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "step", _integer("step", self.step))
        if not isinstance(self.stream, dict):
            raise ValueError(f"trainer state field 'stream' must be a stream state record (a dict), got "
                             f"{_kind(self.stream)}")
        try:
            StreamState.resume_from(self.stream)
        except ValueError as exc:
            raise ValueError(f"trainer state field 'stream': {exc}") from None
        _optional_table("manifest", self.manifest)
        if self.manifest is not None:
            key = self.manifest.get("key")
            if key is not None and not isinstance(key, str):
                raise ValueError(f"trainer state field 'manifest.key' must be a string, got {key!r}")
            if self.manifest.get("total_rows") is not None:
                _integer("manifest.total_rows", self.manifest["total_rows"])
        _optional_table("config", self.config)
        if self.config is not None:
            _optional_table("config.model", self.config.get("model"))
            train = self.config.get("train")
            _optional_table("config.train", train)
            if train is not None and not isinstance(train.get("objective", DEFAULT_OBJECTIVE), str):
                raise ValueError(f"trainer state field 'config.train.objective' must be a string, got "
                                 f"{train['objective']!r}")

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> TrainState:
        """The state ``to_dict()`` (or the worker's checkpoint) wrote; ValueError naming the
        field at fault: missing (``step``, ``stream``), unknown, or of the wrong type or range."""
        if not isinstance(record, Mapping):
            raise ValueError(f"a trainer state is a dict, got {_kind(record)}")
        unknown = sorted(set(record) - set(FIELDS))
        if unknown:
            raise ValueError(f"unknown trainer state field(s) {unknown}; a trainer state holds {list(FIELDS)}")
        for name in ("step", "stream"):
            if name not in record:
                raise ValueError(f"trainer state field {name!r} is missing")
        stream, manifest, config = record["stream"], record.get("manifest"), record.get("config")
        return cls(step=record["step"], stream=dict(stream) if isinstance(stream, Mapping) else stream,
                   manifest=dict(manifest) if isinstance(manifest, Mapping) else manifest,
                   config=dict(config) if isinstance(config, Mapping) else config)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able record, keys in ``FIELDS`` order; ``manifest`` and ``config`` only when
        not None (an old checkpoint's record comes back as it was)."""
        record: dict[str, Any] = {"step": self.step, "stream": self.stream}
        if self.manifest is not None:
            record["manifest"] = self.manifest
        if self.config is not None:
            record["config"] = self.config
        return record

    @property
    def stream_state(self) -> StreamState:
        """The stream position after ``step``, parsed (the start of the stream for ``{}``)."""
        return StreamState.resume_from(self.stream)

    @property
    def cursor(self) -> int:
        """Rows of the stream consumed after ``step``."""
        return self.stream_state.cursor

    @property
    def total_rows(self) -> int | None:
        """Rows of the whole stream (all epochs), when the reader had reached its end; else None."""
        total = (self.manifest or {}).get("total_rows")
        return None if total is None else int(total)

    @property
    def manifest_key(self) -> str | None:
        """The manifest's key, ``<config hash>-<inputs' fingerprint>`` (None: none recorded)."""
        return (self.manifest or {}).get("key")

    @property
    def model_config(self) -> dict | None:
        """The checkpointed run's ``[model]`` table (``ModelConfig`` as a dict), None if unknown."""
        return (self.config or {}).get("model")

    @property
    def objective(self) -> str | None:
        """The objective the checkpoint trained ("sft" where its ``[train]`` table names none),
        None when it recorded no ``[train]`` table."""
        train = (self.config or {}).get("train")
        return None if train is None else train.get("objective", DEFAULT_OBJECTIVE)


def _integer(name: str, value: Any) -> int:
    """``value`` as an int >= 0 (bools, floats and strings refused)."""
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < 0:
        raise ValueError(f"trainer state field {name!r} must be an integer >= 0, got {value!r}")
    return number


def _optional_table(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, Mapping):
        raise ValueError(f"trainer state field {name!r} must be a dict or absent, got {_kind(value)}")


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:80]
