"""The ``packfeed`` command: one entry point, one subcommand per job.

    packfeed pack INPUT... --tokenizer T --seq-len L --output DIR   # pack to Parquet
    packfeed serve INPUT... --tokenizer T --seq-len L --port P      # stream over gRPC
    packfeed train --config run.toml                                # pack and train (Ray Train)

Subcommands live in their own modules and are imported only when chosen, so ``packfeed pack``
never imports torch. The data flags are defined once here (``add_data_arguments``) and shared
by every subcommand that reads data. A config file (``--config``, TOML or JSON, with a
``[data]`` table holding DataConfig fields) gives the base; flags override it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Callable

from packfeed.service.config import FORMATS, LOSS_MODES, OVERLONG_POLICIES, STRATEGIES, TOKENIZER_BACKENDS, DataConfig

# name -> (module, help). A module provides add_arguments(parser) and run(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "pack": ("packfeed.service.cli", "tokenize and pack inputs into Parquet rows"),
    "serve": ("packfeed.service.serve", "stream packed batches over gRPC to any training loop"),
    "train": ("packfeed.trainer.cli", "pack and train a causal LM on the packed rows (Ray Train, DDP)"),
}


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The data flags of every subcommand that reads inputs (pack, serve, train)."""
    g = parser.add_argument_group("data")
    g.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="JSONL, Parquet, Arrow/Feather, .txt files, directories of them, or HF save_to_disk dirs")
    g.add_argument("--config", type=Path, help="TOML or JSON file whose [data] table gives the base settings")
    g.add_argument("--tokenizer", help="local tokenizer directory or Hugging Face id")
    g.add_argument("--tokenizer-backend", choices=TOKENIZER_BACKENDS,
                   help="auto (default): the fast exact encoder where it proves identical ids, else HF; hf; fast")
    g.add_argument("--seq-len", type=int, help="tokens per packed row")
    g.add_argument("--strategy", choices=STRATEGIES, help="bfd: whole samples (SFT); concat: full rows (pretraining)")
    g.add_argument("--overlong", choices=OVERLONG_POLICIES, help="what to do with samples longer than seq-len")
    g.add_argument("--format", choices=FORMATS, help="sample format; auto-detected per input by default")
    g.add_argument("--loss", choices=LOSS_MODES, help="auto: completions/assistant turns only, all tokens for text")
    g.add_argument("--add-eos", action=argparse.BooleanOptionalAction, default=None,
                   help="append EOS to every sample (default on)")
    g.add_argument("--seed", type=int, help="shuffles window order and row order within windows")
    g.add_argument("--strict", action="store_true", default=None, help="the first bad row is an error")
    g.add_argument("--window-samples", type=int, help="samples packed together (default 8192)")
    r = parser.add_argument_group("ray")
    r.add_argument("--address", help="Ray cluster to join (default: $RAY_ADDRESS, else an embedded local Ray)")
    r.add_argument("--num-workers", type=int, help="packing actors (default: one per CPU)")
    r.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs per packing actor (fractional ok)")


def load_config_file(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else tomllib.loads(text)


def data_config_from_args(args: argparse.Namespace, base: dict[str, Any] | None = None) -> DataConfig:
    """DataConfig from the config file's [data] table, overridden by the flags given."""
    data = dict((base or {}).get("data", {}))
    overrides = {
        "inputs": args.inputs or None,
        "tokenizer": args.tokenizer,
        "tokenizer_backend": args.tokenizer_backend,
        "seq_len": args.seq_len,
        "strategy": args.strategy,
        "overlong": args.overlong,
        "format": args.format,
        "loss": args.loss,
        "add_eos": args.add_eos,
        "seed": args.seed,
        "strict": args.strict,
        "window_samples": args.window_samples,
    }
    data.update({k: v for k, v in overrides.items() if v is not None})
    for required in ("inputs", "tokenizer", "seq_len"):
        if required not in data:
            flag = "INPUT..." if required == "inputs" else "--" + required.replace("_", "-")
            raise ValueError(f"missing {flag} (or `{required}` in the config file's [data] table)")
    return DataConfig.from_dict(data)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--output", type=Path, required=True, help="directory for part-*.parquet and stats.json")
    out.add_argument("--overwrite", action="store_true", help="replace packed output already in --output")
    out.add_argument("--validate", action="store_true", help="check every row against the row convention")


def run(args: argparse.Namespace) -> int:
    """``packfeed pack``: stream the packed rows into Parquet and print the stats."""
    from tqdm import tqdm

    from packfeed.client.rows import check_rows
    from packfeed.service.pipeline import PackedStream, Scaling, init_ray
    from packfeed.service.sources import expand_inputs
    from packfeed.service.stats import format_summary
    from packfeed.service.tokenizer_backend import check_fast_backend
    from packfeed.service.writer import ParquetRowWriter

    config = data_config_from_args(args, load_config_file(args.config))
    expand_inputs(config.inputs)  # a missing input fails here, before Ray starts
    check_fast_backend(config)  # and so does a tokenizer that --tokenizer-backend fast cannot reproduce
    writer = ParquetRowWriter(args.output, seq_len=config.seq_len, overwrite=args.overwrite)
    start = time.perf_counter()
    print(init_ray(args.address), file=sys.stderr)
    ray_init_seconds = time.perf_counter() - start
    stream = PackedStream(config, scaling=Scaling(num_workers=args.num_workers, cpus_per_worker=args.cpus_per_worker))
    print(f"packing {stream.num_samples:,} samples in {len(stream.windows)} windows "
          f"on {stream.num_workers} workers -> {args.output}", file=sys.stderr)
    rows_written = tokens = 0
    first_row_seconds = None
    timeline: list[tuple[float, int]] = []  # (seconds, tokens so far) after each block
    with tqdm(total=stream.num_samples, unit="samples", disable=None, file=sys.stderr) as bar:
        for rows in stream.iter_rows():
            if args.validate:
                check_rows(rows, config.seq_len)
            writer.write(rows)
            if first_row_seconds is None:
                first_row_seconds = time.perf_counter() - start
            rows_written += rows.num_rows
            tokens += rows.num_real_tokens
            timeline.append((time.perf_counter() - start, tokens))
            bar.update(stream.samples_started - bar.n)
            bar.set_postfix(rows=rows_written, fill=f"{tokens / max(1, rows_written * config.seq_len):.1%}")
        bar.update(stream.num_samples - bar.n)
    total = stream.stats()
    total.check_accounting()
    stats = total.to_dict(seq_len=config.seq_len, seconds=time.perf_counter() - start)
    stats["first_row_seconds"] = round(first_row_seconds or 0.0, 3)
    stats["steady_tokens_per_second"] = _steady_rate(timeline, stream.num_workers)
    stats["ray_init_seconds"] = round(ray_init_seconds, 3)
    stats["num_workers"] = stream.num_workers
    writer.close(config={"data": config.to_dict(), "config_hash": config.config_hash()}, stats=stats)
    print(format_summary(stats))
    print(f"wrote {stats['rows']:,} rows in {writer.num_files} file(s) and stats.json to {args.output}")
    return 0


def _steady_rate(timeline: list[tuple[float, int]], num_workers: int) -> float:
    """Tokens/s once every worker has delivered its first block (start-up excluded).

    The workers start together, so their first blocks arrive together; the rate is measured
    from the num_workers-th block to the last. 0.0 when the run is too short to tell.
    """
    if len(timeline) <= 2 * num_workers:
        return 0.0
    (t0, n0), (t1, n1) = timeline[num_workers - 1], timeline[-1]
    return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


def root_cause(exc: BaseException) -> BaseException:
    """Unwrap Ray's task errors to the exception the user's data raised."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None) or exc.__cause__
        if inner is None:
            break
        exc = inner
    return exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="packfeed", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    runners: dict[str, Callable[[argparse.Namespace], int]] = {}
    argv = sys.argv[1:] if argv is None else argv
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if argv and argv[0] == name:  # import only the chosen subcommand's module
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            runners[name] = module.run
    args = parser.parse_args(argv)
    try:
        return runners[args.command](args)
    except (ValueError, FileExistsError, FileNotFoundError) as exc:
        print(f"packfeed {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # Ray wraps errors raised inside actors
        cause = root_cause(exc)
        if isinstance(cause, (ValueError, FileNotFoundError)):
            print(f"packfeed {args.command}: error: {cause}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
