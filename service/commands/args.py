"""What the subcommands that read data share: data flags, the config file, the packing actors,
output paths, logging.

A config file (``--config``, TOML or JSON) gives the base; flags override it. Its tables:
``[data]`` (``DataConfig``: sources, epochs, tokenization, packing), ``[scaling]`` (packing
actors and where they run; train workers for ``packfeed train``), and for ``packfeed train``
``[model]``, ``[train]``, ``[output]``. One file serves pack, serve and train alike: each
command reads the tables it needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

from packfeed.service.data.config import (
    DEFAULT_BLOCK_SAMPLES,
    FORMATS,
    LOSS_MODES,
    MAX_SEQ_LEN,
    MIN_ROW_TOKENS,
    OVERLONG_POLICIES,
    STRATEGIES,
    TOKENIZER_BACKENDS,
    DataConfig,
    check_row_length,
    close_match,
)
from packfeed.service.cluster.scaling import LABELS_NAME, RESOURCES_NAME, TABLE_KEYS, PackingScaling
from packfeed.service.storage import is_remote

CONFIG_TABLES = ("data", "scaling", "model", "train", "eval", "lora", "output")
# [scaling] keys of train's workers and feeder; the packing actors' are scaling.TABLE_KEYS (pack, serve, train)
TRAIN_SCALING_KEYS = ("num_workers", "cpus_per_worker", "use_gpu", "trainer_labels", "trainer_resources",
                      "driver_labels")
SUBMIT_DIR_ENV = "PACKFEED_SUBMIT_DIR"  # set by deploy/local/submit.sh: where `ray job submit` ran


class HelpFormatter(argparse.HelpFormatter):
    """Shows a flag's default when it has one worth showing (not None or False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" not in text and action.default not in (None, False, argparse.SUPPRESS) and action.option_strings:
            text += " (default: %(default)s)"
        return text


class CommandParser(argparse.ArgumentParser):
    """The ``packfeed`` parser (its subcommands' too): a flag the subcommand does not know is an
    error of that subcommand, with the flag it is closest to, as a config file's typo is
    (``check_known_keys``): ``packfeed pack: error: unrecognized arguments: --seq_len (did you
    mean --seq-len?)``, exit 2, also when the typo left a required flag missing (``--ouput``).
    argparse alone says ``packfeed: error: unrecognized arguments: --seq_len 2048``."""

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        for sub in _subcommand_parsers(self).values():
            sub._top = self  # its error names the other subcommands that have a flag
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            sub = _subcommand_parsers(self)
            command = sub.get(getattr(parsed, "command", None) or "", self)
            command.error(unrecognized_message(extras, command, {n: p for n, p in sub.items() if p is not command}))
        return parsed

    def error(self, message: str):  # exits 2
        if message.startswith("the following arguments are required") and not _subcommand_parsers(self):
            unknown = [a for a in _options(getattr(self, "_given", [])) if not self._knows(a)]
            if unknown:  # the typo of a required flag (--ouput) is the error, not the flag it left missing
                message = unrecognized_message(unknown, self, _subcommand_parsers(getattr(self, "_top", self)))
        super().error(message)

    def _knows(self, flag: str) -> bool:
        name = flag.split("=", 1)[0]
        if name in self._option_string_actions:
            return True
        return self.allow_abbrev and name.startswith("--") and sum(
            o.startswith(name) for o in self._option_string_actions) == 1


def _options(argv: list[str]) -> list[str]:
    """The flag-like items of ``argv`` before a ``--`` (negative numbers are values)."""
    out = []
    for item in argv:
        if item == "--":
            break
        if item.startswith("-") and len(item) > 1 and not item[1:].replace(".", "", 1).isdigit():
            out.append(item)
    return out


def _subcommand_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: p for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name, p in action.choices.items()}


def unrecognized_message(extras: list[str], parser: argparse.ArgumentParser,
                         others: dict[str, argparse.ArgumentParser] | None = None) -> str:
    """What argparse left over, named flag by flag with the closest flag of ``parser``
    (``--seq_len`` -> ``--seq-len``), else the other subcommands that have it (``pack --port``:
    a flag of ``packfeed serve``). The values after an unknown flag are not repeated; without
    any flag, argparse's own words."""
    flags = _options(extras)
    if not flags:
        return f"unrecognized arguments: {' '.join(extras)}"
    known = [o for action in parser._actions for o in action.option_strings]
    named = []
    for flag in flags:
        name = flag.split("=", 1)[0]
        dashed = name.replace("_", "-")
        owners = [f"packfeed {n}" for n, p in (others or {}).items()
                  if p is not parser and name in p._option_string_actions]
        match = dashed if dashed in known else None if owners else close_match(name, known)
        hint = f" (did you mean {match}?)" if match else f" ({name} is a flag of {', '.join(owners)})" if owners else ""
        named.append(f"{name}{hint}")
    return f"unrecognized arguments: {', '.join(named)}"  # argparse's words, which tools and tests grep


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The data flags of every subcommand that reads inputs (pack, serve, train)."""
    g = parser.add_argument_group("data (flags override the config file's [data] table)")
    g.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="JSONL, Parquet, Arrow/Feather, .txt files, directories, globs or HF save_to_disk dirs: one "
                        "source of repeat 1 (instead of [[data.sources]])")
    g.add_argument("--config", type=Path, help="TOML or JSON file with [data] (sources, epochs, ...) and [scaling]")
    g.add_argument("--tokenizer", help="local tokenizer directory or Hugging Face id (cached)")
    g.add_argument("--tokenizer-backend", choices=TOKENIZER_BACKENDS,
                   help="auto (default): the exact fast encoder (quicktok) where it proves identical ids and masks "
                        "on the tokenizer and the first window, else HF's with one log line; hf; fast (refuses "
                        "with the reason)")
    g.add_argument("--seq-len", type=int, help=f"tokens per packed row ({MIN_ROW_TOKENS} to {MAX_SEQ_LEN:,})")
    g.add_argument("--epochs", type=int, help="passes over the whole mixture (default 1)")
    g.add_argument("--strategy", choices=STRATEGIES,
                   help="exactfit: whole samples, rows closed exactly (SFT; default); bfd: plain best-fit decreasing; "
                        "concat: full rows, samples cut at row ends and long ones split across rows (pretraining)")
    g.add_argument("--overlong", choices=OVERLONG_POLICIES,
                   help="samples longer than seq-len: truncate (keep the first seq-len tokens), split (into pieces "
                        "across rows) or drop (default: split with --strategy concat, else truncate)")
    g.add_argument("--format", choices=FORMATS, help="sample format (default auto: detected for every row)")
    g.add_argument("--loss", choices=LOSS_MODES, help="auto: completions/assistant turns only, all tokens for text "
                   "(default auto)")
    g.add_argument("--add-eos", action=argparse.BooleanOptionalAction, default=None,
                   help="append EOS to every sample (default on)")
    g.add_argument("--seed", type=int, help="shuffles sources, windows and rows (default 0)")
    g.add_argument("--strict", action="store_true", default=None, help="the first bad row is an error")
    g.add_argument("--window-samples", type=int, help="samples packed together (default: 8192, fewer for small data)")
    g.add_argument("--block-samples", type=int,
                   help=f"rows read together when shuffling a source; 0: file order (default {DEFAULT_BLOCK_SAMPLES})")
    g.add_argument("--max-skip-fraction", type=float,
                   help="fail when more than this fraction of the samples read is bad (default: never)")
    r = parser.add_argument_group("ray (flags override the config file's [scaling] table)")
    r.add_argument("--address", help="Ray cluster to join (default: $RAY_ADDRESS, else an embedded local Ray)")
    r.add_argument("--num-workers", type=int, help="packing actors (default: one per CPU of the packer nodes)")
    r.add_argument("--cpus-per-worker", type=float, help="CPUs per packing actor, fractional ok (default 1)")
    r.add_argument("--max-workers", type=int, help="let the packing pool autoscale up to this many actors")
    r.add_argument("--packer-label", action="append", metavar="KEY=VALUE",
                   help="node label packing actors need (repeatable; default packfeed/role=packer on labelled clusters)")
    r.add_argument("--packer-resource", action="append", metavar="NAME=AMOUNT",
                   help="custom resource each packing actor asks for (repeatable)")


def load_config_file(path: Path | None) -> dict[str, Any]:
    """The config file's tables, with one clear error for a missing file or a syntax error."""
    if path is None:
        return {}
    try:
        text = (user_dir() / path).read_text(encoding="utf-8")  # an absolute path stays as it is
    except OSError as e:
        raise ValueError(f"--config {path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"--config {path}: byte {e.start} is not UTF-8 (is it a text file?)") from None
    try:
        config = json.loads(text) if Path(path).suffix == ".json" else tomllib.loads(text)
    except ValueError as e:  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
        raise ValueError(f"--config {path}: not valid {'JSON' if Path(path).suffix == '.json' else 'TOML'} ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"--config {path}: expected tables like [data], got a {type(config).__name__}")
    unknown = sorted(set(config) - set(CONFIG_TABLES))
    if unknown:
        raise ValueError(f"--config {path}: unknown tables {unknown}; known: {', '.join(CONFIG_TABLES)}")
    for name, table in config.items():
        if not isinstance(table, dict):
            raise ValueError(f"--config {path}: [{name}] must be a table of keys, got a {type(table).__name__}")
    return config


def data_config_from_args(args: argparse.Namespace, base: dict[str, Any] | None = None) -> DataConfig:
    """DataConfig from the config file's [data] table, overridden by the flags given."""
    data = dict((base or {}).get("data", {}))
    overrides = {
        "tokenizer": args.tokenizer,
        "tokenizer_backend": args.tokenizer_backend,
        "seq_len": args.seq_len,
        "epochs": args.epochs,
        "strategy": args.strategy,
        "overlong": args.overlong,
        "format": args.format,
        "loss": args.loss,
        "add_eos": args.add_eos,
        "seed": args.seed,
        "strict": args.strict,
        "window_samples": args.window_samples,
        "block_samples": args.block_samples,
        "max_skip_fraction": args.max_skip_fraction,
    }
    data.update({k: v for k, v in overrides.items() if v is not None})
    if args.inputs:  # INPUT... replaces the file's sources: one source of repeat 1
        data.pop("sources", None)
        data.pop("samples_per_epoch", None)
        data["inputs"] = list(args.inputs)
    DataConfig.check_keys(data)  # a typo ([[data.source]]) is named, not reported as missing inputs
    if "inputs" not in data and "sources" not in data:
        raise ValueError("missing INPUT... (or `inputs` / [[data.sources]] in the config file's [data] table)")
    for required in ("tokenizer", "seq_len"):
        if required not in data:
            raise ValueError(f"missing --{required.replace('_', '-')} (or `{required}` in the config file's [data] table)")
    if isinstance(data["seq_len"], int) and data["seq_len"] > 0:  # 0 and below: DataConfig's own message
        check_row_length(data["seq_len"], "--seq-len" if args.seq_len is not None else "[data] seq_len")
    return absolute_paths(DataConfig.from_dict(data))


def absolute_paths(config: DataConfig) -> DataConfig:
    """The config with its local paths (inputs, a tokenizer directory) made absolute, from
    ``user_dir()``: actors on other nodes, and workers that do not share this process's
    directory, read them as given, and ``.packfeed/config.json`` records them."""
    base = user_dir()

    def local(path: str) -> str:
        if is_remote(path):  # a URI (s3://b/x/*.jsonl) is read as given
            return path
        full = os.path.abspath(base / path)  # an absolute path stays as it is
        return full if not os.path.isabs(path) and (os.path.exists(full) or glob_like(path)) else path

    sources = tuple(dataclasses.replace(s, paths=tuple(local(p) for p in s.paths)) for s in config.sources)
    tokenizer = os.path.abspath(base / config.tokenizer) if os.path.isdir(base / config.tokenizer) else config.tokenizer
    return dataclasses.replace(config, sources=sources, tokenizer=tokenizer)


def user_dir() -> Path:
    """Where the user's relative paths start: the current directory, or in a Ray job submitted
    by deploy/local/submit.sh (which runs in Ray's temporary copy of the working directory) the
    directory submit.sh ran from, which it passes as $PACKFEED_SUBMIT_DIR."""
    return Path(os.environ.get(SUBMIT_DIR_ENV) or os.getcwd())


def glob_like(path: str) -> bool:
    return any(c in path for c in "*?[")


def packing_from_args(args: argparse.Namespace, base: dict[str, Any] | None = None):
    """The packing actors' PackingScaling from [scaling] and the flags, checked here, before Ray
    starts (labels None: the role default, resolved once Ray is up)."""
    table = dict((base or {}).get("scaling", {}))
    unknown = sorted(set(table) - set(TABLE_KEYS) - set(TRAIN_SCALING_KEYS))
    if unknown:
        raise ValueError(f"unknown [scaling] keys {unknown}; known: {sorted((*TABLE_KEYS, *TRAIN_SCALING_KEYS))}")
    flags = {
        "num_workers": ("--num-workers", args.num_workers),
        "cpus_per_worker": ("--cpus-per-worker", args.cpus_per_worker),
        "max_workers": ("--max-workers", args.max_workers),
        "labels": (LABELS_NAME, args.packer_label and parse_pairs(args.packer_label, "--packer-label", str)),
        "resources": (RESOURCES_NAME,
                      args.packer_resource and parse_pairs(args.packer_resource, "--packer-resource", float)),
    }
    return PackingScaling.from_table(table, {f: given for f, given in flags.items() if given[1] is not None})


def positive_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def parse_pairs(items: list[str], flag: str, cast: Any) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} takes KEY=VALUE, got {item!r}")
        try:
            out[key] = cast(value)
        except ValueError:
            raise ValueError(f"{flag} {item!r}: {value!r} is not a number") from None
    return out


def resolve_output(path: str | Path, flag: str = "--output") -> str | Path:
    """An absolute output path, or a URI as it is (``s3://bucket/prefix``). A relative path is
    taken from where the user ran the command: the current directory, or in a Ray job (where the
    current directory is Ray's temporary copy of the working dir) the submitting directory that
    deploy/local/submit.sh passes; without it, a relative path in a Ray job is refused (its
    files would vanish with the copy)."""
    if is_remote(os.fspath(path)):
        return os.fspath(path)
    path = Path(path).expanduser()
    if path.is_absolute():
        return path
    submit_dir = os.environ.get(SUBMIT_DIR_ENV)
    if submit_dir:
        return Path(submit_dir) / path
    if os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"):  # set by Ray for a job's entrypoint
        raise ValueError(
            f"{flag} {path} is relative, and this runs as a Ray job in a temporary copy of the working directory: "
            f"give an absolute path (or submit with deploy/local/submit.sh, which passes ${SUBMIT_DIR_ENV})"
        )
    return Path.cwd() / path


def configure_logging(command: str, debug: bool = False) -> None:
    """packfeed's own messages (``logging.getLogger("packfeed")``) on stderr, each ONE whole
    line written at once and flushed (``packfeed serve: listening on ...`` is grepped by
    tools; two threads' lines never share a line)."""
    logger = logging.getLogger("packfeed")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(_LevelFormatter(command))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.INFO)


class _StderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each line, not as it was when logging was set up:
    a command run in-process (tests, a notebook) leaves no handler on a stream since closed
    (a test's captured stderr) for the client's lines that follow."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class _LevelFormatter(logging.Formatter):
    def __init__(self, command: str) -> None:
        super().__init__()
        self.command = command

    def format(self, record: logging.LogRecord) -> str:
        prefix = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        text = f"packfeed {self.command}: {prefix}{record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text
