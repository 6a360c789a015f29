"""Typed, validated configuration of the data plane: sources, epochs, tokenization, packing.

Runtime objects (the tokenizer, Ray handles, rank, world size) are arguments, not config. The
config is everything the packed stream is a deterministic function of, so its hash names the
stream (the gRPC service uses it to refuse a client that expects another stream). A few fields
change how a run behaves but not one byte of the rows (``UNHASHED``); they stay out of the hash.

A config is a mixture of sources (``[[data.sources]]`` in a TOML file, see docs/design.md,
"Mixtures and epochs"); the plain form ``inputs = [...]`` (``DataConfig.from_inputs``, or
``packfeed pack INPUT...``) is one source of repeat 1. A schedule (``[[data.schedule]]``,
schedule.py) changes the sources' weights at given positions of the stream.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from packfeed.service.data.mixture import check_share
from packfeed.service.data.schedule import ScheduleEntry, check_schedule, check_schedule_weights

__all__ = ["DataConfig", "ScheduleEntry", "SourceConfig", "check_schedule_weights"]

STRATEGIES = ("bfd", "concat", "exactfit")
OVERLONG_POLICIES = ("truncate", "split", "drop")
FORMATS = ("auto", "text", "prompt_completion", "messages", "preference")
LOSS_MODES = ("auto", "all", "completion")
MAX_SEQ_LEN = 1 << 20  # a row of 2^20 tokens; beyond that no model trains and numpy would try TiBs
# The shortest row the commands (flags, config files) accept. DataConfig itself takes 2, for toy
# rows in tests (``seq_len=4`` golden cases); a user's row of 4 tokens holds a word or two of one
# sample and its EOS: nothing to train on, and almost every sample truncated.
MIN_ROW_TOKENS = 8
# The overlong policy of a strategy when none is given: concat cuts samples at row ends by
# definition (concat-and-split), so a document longer than a row flows on into the next rows
# rather than losing its tail; whole-sample strategies truncate (an SFT sample cut in two trains
# its second half without its prompt).
DEFAULT_OVERLONG = {"concat": "split"}
MAX_SAMPLES_PER_EPOCH = 1 << 40  # ~1.1e12; sample ids and counts stay far from int64's end
MAX_WINDOWS = 1 << 22  # windows in one run (epochs x windows per epoch): the plan lists them all
DEFAULT_WINDOW_SAMPLES = 8192
DEFAULT_BLOCK_SAMPLES = 256
TOKENIZER_BACKENDS = ("auto", "hf", "fast")  # see tokenize/fast/backend.py
# Fields that change how a run behaves or how rows are computed, not the rows themselves
# (the tokenizer back-ends give identical rows): left out of config_hash().
UNHASHED = ("max_skip_fraction", "tokenizer_backend", "strict")  # strict: a run fails instead of skipping; rows equal


@dataclass(frozen=True, kw_only=True)
class SourceConfig:
    """One source of a mixture: files read as one sequence of rows.

    ``paths``: files, directories or globs (as INPUT accepts). Per epoch the source gives
    round(``repeat`` x its rows) samples, or, when every source has a ``weight``, a share
    weight / sum(weights) of ``DataConfig.samples_per_epoch``. ``format``/``loss``/
    ``block_samples``: None means the data config's (a Parquet source with large row groups
    reads faster with larger blocks: bench/bench_shuffle.py).
    """

    name: str
    paths: tuple[str, ...]
    repeat: float | None = None
    weight: float | None = None
    format: str | None = None
    loss: str | None = None
    block_samples: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a source name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "paths", check_paths(f"source {self.name!r}: paths", self.paths))
        if self.repeat is not None and self.weight is not None:
            raise ValueError(f"source {self.name!r}: give repeat or weight, not both")
        if self.repeat is not None:
            object.__setattr__(self, "repeat", check_share(self.repeat, "repeat", self.name))
        if self.weight is not None:
            object.__setattr__(self, "weight", check_share(self.weight, "weight", self.name))
        if self.format is not None:
            _check_choice(f"source {self.name!r}: format", self.format, FORMATS)
        if self.loss is not None:
            _check_choice(f"source {self.name!r}: loss", self.loss, LOSS_MODES)
        if self.block_samples is not None:
            _check_int(f"source {self.name!r}: block_samples", self.block_samples, 0)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["paths"] = list(self.paths)
        return d


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """What to read, how to mix and tokenize it, and how to pack it.

    ``window_samples``: samples packed together (bounded memory, parallel, deterministic).
    Larger windows pack tighter and take longer to the first row (bench/bench_packing.py:
    SFT-like lengths at L=4096 pack to 1.001x the bound with 4k samples per window). None
    (default) picks ``auto_window(samples per epoch)``: 8192, fewer for small data so that
    several packing workers have work. ``block_samples``: rows read together when a source
    is shuffled (see mixture.py); 0 reads every source in file order.
    ``max_skip_fraction``: fail the run when more than this fraction of the samples read is
    skipped as bad (None: never; a run that packs nothing always fails).
    ``overlong``: what happens to a sample longer than ``seq_len``; None (the default) is the
    strategy's: ``split`` for concat, else ``truncate`` (``DEFAULT_OVERLONG``). The resolved
    policy is what the config holds, hashes and records.
    ``schedule``: weights that replace the sources' shares from given positions of the stream
    (schedule.py); each entry names every source. With ``repeat`` sources an epoch keeps its
    size (the sum of the repeats' counts) and the weights share it out from the entry on.
    Empty (the default) leaves ``to_dict`` and the hash as they were before schedules existed.
    """

    sources: tuple[SourceConfig, ...]
    tokenizer: str
    seq_len: int
    epochs: int = 1
    samples_per_epoch: int | None = None
    strategy: str = "exactfit"
    overlong: str | None = None  # None: DEFAULT_OVERLONG of the strategy
    format: str = "auto"
    loss: str = "auto"
    add_eos: bool = True
    seed: int = 0
    strict: bool = False
    window_samples: int | None = None
    block_samples: int = DEFAULT_BLOCK_SAMPLES
    max_skip_fraction: float | None = None
    tokenizer_backend: str = "auto"
    schedule: tuple[ScheduleEntry, ...] = ()
    # Preference pairs under overlong="truncate": an overlong pair's prompt is cut from the left, but
    # not below this many tokens, before its answers are cut (packing/truncate_pairs.py). None: seq_len // 4
    # (the prompt is in both segments: prompts then fill at most half the row).
    max_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        sources = tuple(self.sources)
        if not sources:
            raise ValueError("no data: give INPUT... (or `inputs` / [[data.sources]] in the config's [data] table)")
        object.__setattr__(self, "sources", sources)
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"source names must be unique, {dup} appear more than once: set `name` on each source")
        weighted = [s.weight is not None for s in sources]
        if any(weighted) and not all(weighted):
            repeated = [s.name for s in sources if s.repeat is not None]
            if repeated:
                raise ValueError(
                    f"sources {repeated} set repeat and {[s.name for s in sources if s.weight is not None]} weight: "
                    "use one or the other on every source (repeat: passes per epoch; weight: shares of "
                    "samples_per_epoch)"
                )
            missing = [s.name for s, w in zip(sources, weighted) if not w]
            raise ValueError(f"sources {missing} have no weight: with weights, every source needs one (or use repeat everywhere)")
        if all(weighted) and self.samples_per_epoch is None:
            raise ValueError("sources with weight need [data] samples_per_epoch (how many samples one epoch holds)")
        if not all(weighted) and self.samples_per_epoch is not None:
            raise ValueError("samples_per_epoch applies to sources with weight; with repeat, an epoch's size follows the sources")
        if self.samples_per_epoch is not None:
            _check_int("samples_per_epoch", self.samples_per_epoch, 1)
            if self.samples_per_epoch > MAX_SAMPLES_PER_EPOCH:
                raise ValueError(f"samples_per_epoch must be at most {MAX_SAMPLES_PER_EPOCH:,}, got {self.samples_per_epoch:,}")
        if not self.tokenizer or not isinstance(self.tokenizer, str):
            raise ValueError("tokenizer must name a local directory or a Hugging Face id")
        _check_int("seq_len", self.seq_len, 2)
        if self.seq_len > MAX_SEQ_LEN:
            raise ValueError(f"seq_len must be at most {MAX_SEQ_LEN:,} tokens per row, got {self.seq_len:,}")
        _check_int("epochs", self.epochs, 1)
        _check_choice("strategy", self.strategy, STRATEGIES)
        if self.overlong is None:
            object.__setattr__(self, "overlong", DEFAULT_OVERLONG.get(self.strategy, "truncate"))
        _check_choice("overlong", self.overlong, OVERLONG_POLICIES)
        _check_choice("format", self.format, FORMATS)
        _check_choice("loss", self.loss, LOSS_MODES)
        _check_choice("tokenizer_backend", self.tokenizer_backend, TOKENIZER_BACKENDS)
        if self.window_samples is not None:
            _check_int("window_samples", self.window_samples, 1)
        _check_int("block_samples", self.block_samples, 0)
        _check_int("seed", self.seed, 0)
        for name in ("add_eos", "strict"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.max_skip_fraction is not None:
            f = self.max_skip_fraction
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1:
                raise ValueError(f"max_skip_fraction must be a number in [0, 1], got {f!r}")
        object.__setattr__(self, "schedule", check_schedule(self.schedule, names))
        if self.max_prompt_tokens is not None:
            _check_int("max_prompt_tokens", self.max_prompt_tokens, 0)

    @classmethod
    def from_inputs(cls, inputs: Sequence[str], **fields: Any) -> "DataConfig":
        """The plain form: ``inputs`` as one source of repeat 1 (``packfeed pack INPUT...``)."""
        inputs = check_paths("inputs", inputs)
        return cls(sources=(SourceConfig(name=default_source_name(inputs), paths=inputs),), **fields)

    @property
    def inputs(self) -> tuple[str, ...]:
        """Every source's paths, in order."""
        return tuple(p for s in self.sources for p in s.paths)

    @property
    def weighted(self) -> bool:
        return self.sources[0].weight is not None

    def source_format(self, source: SourceConfig) -> str:
        return source.format or self.format

    def source_loss(self, source: SourceConfig) -> str:
        return source.loss or self.loss

    @property
    def prompt_budget(self) -> int:
        """Prompt tokens a truncated preference pair keeps at least (if it has them):
        ``max_prompt_tokens``, else a quarter of a row."""
        return self.seq_len // 4 if self.max_prompt_tokens is None else self.max_prompt_tokens

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["sources"] = [s.to_dict() for s in self.sources]
        if self.schedule:
            d["schedule"] = [e.to_dict() for e in self.schedule]
        else:  # configs without a schedule keep the dict, and so the hash, they had before schedules
            del d["schedule"]
        if self.max_prompt_tokens is None:  # likewise: the default leaves the hash as it was
            del d["max_prompt_tokens"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DataConfig":
        """From a config file's [data] table (``inputs`` or ``sources``), with clear errors."""
        cls.check_keys(d)
        d = dict(d)
        if "inputs" in d and "sources" in d:
            raise ValueError("give inputs or sources, not both")
        if "sources" in d:
            if not isinstance(d["sources"], (list, tuple)):
                raise ValueError("sources must be a list of tables ([[data.sources]] in TOML)")
            built: list[SourceConfig] = []
            for i, s in enumerate(d["sources"]):
                built.append(_source_from_dict(s, i, [b.name for b in built]))
            d["sources"] = tuple(built)
        if "inputs" in d:
            return cls.from_inputs(d.pop("inputs"), **d)
        return cls(**d)

    @classmethod
    def check_keys(cls, d: Mapping[str, Any]) -> None:
        """ValueError naming the keys of a [data] table that are not config fields (``source``
        for ``sources``, from a ``[[data.source]]`` typo), each with the key it is closest to.
        Called before any other check, so a typo is named, not reported as what it left missing."""
        check_known_keys("unknown data config keys", d, {f.name for f in dataclasses.fields(cls)} | {"inputs"})

    def config_hash(self) -> str:
        """Stable hex digest of every field the stream depends on (not ``UNHASHED`` ones)."""
        d = {k: v for k, v in self.to_dict().items() if k not in UNHASHED}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def check_row_length(seq_len: int, what: str = "seq_len") -> None:
    """ValueError, for a user's ``seq_len`` (a flag, a config file), when a row is too short to
    hold anything worth training on (``MIN_ROW_TOKENS``). The upper bound is DataConfig's own
    (``MAX_SEQ_LEN``: 1M-token rows are legal); a long row on a small corpus is said after the
    pack, when the rows are counted (commands/pack.py)."""
    if isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len < MIN_ROW_TOKENS:
        raise ValueError(f"{what} {seq_len}: a row of fewer than {MIN_ROW_TOKENS} tokens holds a word or two of one "
                         f"sample and its EOS, nothing to train on; give {MIN_ROW_TOKENS} or more (rows of 2048 to "
                         "8192 tokens are usual)")


def check_paths(what: str, paths: Any) -> tuple[str, ...]:
    """A non-empty list of file, directory or glob paths, as a tuple of str."""
    if (isinstance(paths, (str, bytes)) or not isinstance(paths, (list, tuple)) or not paths
            or not all(isinstance(p, (str, os.PathLike)) for p in paths)):
        raise ValueError(f"{what} must be a non-empty list of files, directories or globs, got {paths!r}")
    return tuple(os.fspath(p) for p in paths)


def default_source_name(paths: Sequence[str]) -> str:
    """A name from the paths: one path ``data/chat/`` -> chat, ``web.parquet`` -> web,
    ``corpus/*.jsonl`` -> corpus; several paths -> their common directory (``corpus/a.jsonl``
    and ``corpus/b.jsonl`` -> corpus)."""
    paths = [os.fspath(p) for p in paths]
    if len(paths) > 1:
        parents = [os.path.dirname(os.path.normpath(p)) for p in paths]
        common = os.path.basename(os.path.commonpath(parents)) if all(parents) else ""
        if common and not any(c in common for c in "*?["):
            return common
    parts = [p for p in re.split(r"[\\/]", paths[0]) if p and p != "."]
    plain = [p for p in parts if not any(c in p for c in "*?[")]
    if not plain:
        return "data"
    last = plain[-1]
    return (os.path.splitext(last)[0] if last == parts[-1] else last) or "data"


def _source_from_dict(d: Any, index: int, taken: Sequence[str]) -> SourceConfig:
    if isinstance(d, SourceConfig):
        return d
    if not isinstance(d, Mapping):
        raise ValueError(f"[[data.sources]] entry {index} must be a table, got {type(d).__name__}")
    label = repr(d.get("name")) if d.get("name") else f"#{index + 1}"
    check_known_keys(f"source {label}: unknown keys", d, {f.name for f in dataclasses.fields(SourceConfig)})
    if "paths" not in d:
        raise ValueError(f"source {label}: missing `paths` (files, directories or globs)")
    paths = check_paths(f"source {label}: paths", [d["paths"]] if isinstance(d["paths"], str) else d["paths"])
    d = {**d, "paths": paths}
    if not d.get("name"):
        name = default_source_name(paths)
        d["name"] = name if name not in taken else f"{name}-{index + 1}"
    return SourceConfig(**d)


def check_known_keys(what: str, given: Iterable[str], known: Iterable[str]) -> None:
    """ValueError ``what`` (e.g. "unknown data config keys") for the keys ``given`` that are not
    in ``known``, each with the known key it is closest to: ``unknown data config keys ['epoch']
    (did you mean 'epochs'?); known keys: [...]``."""
    known = sorted(known)
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    guesses = [(k, close_match(k, known)) for k in unknown]
    hints = [f"{k!r} -> {m!r}" if len(unknown) > 1 else repr(m) for k, m in guesses if m]
    hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
    raise ValueError(f"{what} {unknown}{hint}; known keys: {known}")


def close_match(word: str, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The choice ``word`` is most likely a typo of (difflib's ratio >= ``cutoff``), or None:
    ("epoch", [...]) -> "epochs"; ("source", [...]) -> "sources"; ("tiny-lama", [...]) -> "tiny-llama"."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return found[0] if found else None


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
