"""StreamState: where a consumer of the packed stream is, the record a checkpoint keeps to resume.

One record for every consumer: ``PackedStream.state_dict()``, ``PackedIterableDataset``'s and
the ``"stream"`` entry of a ``packfeed train`` checkpoint are all ``StreamState.to_dict()``::

    {"version": 1, "cursor": 48, "step": 6, "config_hash": "9f3c...", "seq_len": 4096}

and, once the stream's mixture was changed during the run (``PackedStream.set_mixture``),
``"mixture"``: the changes made (client/mixture_record.py records), in order. A resumed client sends
them, and the server refuses to continue a stream that did not make them (its cursor would
point into another stream). Records without it (every record saved before) load unchanged.

``cursor``: rows of the global stream consumed (a step boundary: resuming there neither skips
nor repeats a row, with the same or another world size and batch size). ``step``: steps
consumed, counted across resumes. ``config_hash`` and ``seq_len``: the stream the rows came
from, None until it is known (a state saved before the first batch); a resume on another
stream is refused (``check_matches`` here, FAILED_PRECONDITION from a server), since its
cursor would point at other rows.

Standard library only (and client/mixture_record.py).
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Any, Mapping

from packfeed.client.mixture_record import check_change, with_change

STATE_VERSION = 1  # the record's format; a record of another version is refused


@dataclass(frozen=True)
class StreamState:
    """A consumer's position in one stream (see the module docstring); the default is its start."""

    cursor: int = 0
    step: int = 0
    config_hash: str | None = None
    seq_len: int | None = None
    mixture: tuple[dict, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "cursor", _integer("cursor", self.cursor, 0))
        object.__setattr__(self, "step", _integer("step", self.step, 0))
        if self.seq_len is not None:
            object.__setattr__(self, "seq_len", _integer("seq_len", self.seq_len, 1))
        if self.config_hash is not None and not isinstance(self.config_hash, str):
            raise ValueError(f"stream state field 'config_hash' must be a string or None, got {self.config_hash!r}")
        if isinstance(self.mixture, (str, bytes, dict)) or not isinstance(self.mixture, (list, tuple)):
            raise ValueError(f"stream state field 'mixture' must be a list of mixture changes, got {self.mixture!r}")
        try:
            object.__setattr__(self, "mixture", tuple(check_change(c) for c in self.mixture))
        except ValueError as exc:
            raise ValueError(f"stream state field 'mixture': {exc}") from None

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> StreamState:
        """The state ``to_dict()`` wrote; ValueError naming the field at fault (a missing or
        other version, a field this version does not have, a value of the wrong type or range).
        Missing fields take their defaults: records saved by hand often hold the cursor only."""
        if not isinstance(record, Mapping):
            raise ValueError(f"a stream state is a dict (a state_dict()), got {type(record).__name__}")
        if record.get("version") != STATE_VERSION:
            raise ValueError(f"unknown stream state version {record.get('version')!r}, expected {STATE_VERSION}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(record) - fields - {"version"})
        if unknown:
            raise ValueError(f"unknown stream state field(s) {unknown}; a version {STATE_VERSION} state holds "
                             f"{sorted(fields | {'version'})}")
        return cls(**{name: record[name] for name in fields if name in record})

    @classmethod
    def resume_from(cls, state: StreamState | Mapping[str, Any] | None) -> StreamState:
        """The state to start a stream at: ``state`` itself, parsed from its dict, or the start
        of the stream for None or an empty dict."""
        if isinstance(state, StreamState):
            return state
        return cls() if not state else cls.from_dict(state)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able record: the format checkpoints keep (``from_dict`` reads it back)."""
        record = {"version": STATE_VERSION, "cursor": self.cursor, "step": self.step,
                  "config_hash": self.config_hash, "seq_len": self.seq_len}
        if self.mixture:
            record["mixture"] = [dict(c, weights=dict(c["weights"])) for c in self.mixture]
        return record

    def after_step(self, cursor: int) -> StreamState:
        """The state once one more step, ending at ``cursor``, is consumed."""
        return dataclasses.replace(self, cursor=cursor, step=self.step + 1)

    def pinned(self, config_hash: str, seq_len: int) -> StreamState:
        """This state with the stream's config hash and seq_len where it has none yet: once a
        batch is consumed, only the same stream may continue it."""
        return dataclasses.replace(self, config_hash=self.config_hash if self.config_hash is not None else config_hash,
                                   seq_len=self.seq_len if self.seq_len is not None else seq_len)

    def with_mixture(self, changes: Any) -> StreamState:
        """This state with the mixture changes ``changes`` (records) it does not hold yet."""
        mixture = self.mixture
        for change in changes:
            mixture = with_change(mixture, change)
        return dataclasses.replace(self, mixture=mixture)

    def check_matches(self, config_hash: str, seq_len: int, *, fix: str = "start a new run") -> None:
        """ValueError saying what differs, and ``fix``, unless this state can continue on a stream
        of ``config_hash`` and ``seq_len`` (a field still None matches any stream)."""
        if self.config_hash is not None and self.config_hash != config_hash:
            raise ValueError(f"the checkpoint was trained on data config {self.config_hash}, this run's is "
                             f"{config_hash}: resume with the same data config (the same inputs, tokenizer, seq_len, "
                             f"packing and seed), or {fix}")
        if self.seq_len is not None and self.seq_len != seq_len:
            raise ValueError(f"the checkpoint was trained on rows of {self.seq_len} tokens, this run's seq_len is "
                             f"{seq_len}: resume with the same seq_len, or {fix}")


def _integer(name: str, value: Any, low: int) -> int:
    """``value`` as an int >= ``low`` (numpy integers included; bools, floats and strings refused)."""
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < low:
        raise ValueError(f"stream state field {name!r} must be an integer >= {low}, got {value!r}")
    return number
