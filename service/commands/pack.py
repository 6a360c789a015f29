"""``packfeed pack``: tokenize and pack a data config into a Parquet dataset directory.

    packfeed pack INPUT... --tokenizer T --seq-len L --output DIR [data flags]
    packfeed pack --config data.toml --output DIR
    packfeed pack 's3://bucket/corpus/*.jsonl' --tokenizer T --seq-len L --output s3://bucket/packed

The flags (and the config file) make a DataConfig and the packing actors' PackingScaling;
``service/packjob/pack_run.py`` (``run_pack``) does the rest. Before Ray starts: the config, the
output location (never over an input), the plan (every input scanned, or the scan the output
kept reused), the tokenizer, and a probe of every input's first rows (formats detected, a
source with no valid sample refused); a previous output is removed (``--overwrite``) only once
all of them passed. DIR may be a URI: the rows and metadata are written to the store. Then the rows stream into DIR with
progress, and the run ends with the packing report. It exits non-zero, saying why, when
nothing was packed, when a source delivered nothing, or when more than
``--max-skip-fraction`` of the samples read was bad. An output of fewer than ``FEW_ROWS`` rows
(a long --seq-len on a small corpus) is said in a warning naming the --seq-len that gives more;
an --output holding a pack that never finished is named as such (refused without --overwrite).
"""

from __future__ import annotations

import argparse
import logging

from packfeed.service.commands.args import (
    add_data_arguments,
    data_config_from_args,
    load_config_file,
    packing_from_args,
    positive_number,
    resolve_output,
)

HELP = "tokenize and pack inputs into a Parquet dataset directory"
ORDER = 0
# Fewer rows than this and a data-parallel run has too few for one step on one 8-GPU node (a
# row per rank per step): the output is said to be small, with the --seq-len that would do.
FEW_ROWS = 8
logger = logging.getLogger("packfeed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--output", required=True,
                     help="directory or URI (s3://bucket/prefix, gs://...) for part-*.parquet (and .packfeed/ metadata)")
    out.add_argument("--overwrite", action="store_true",
                     help="replace a previous packfeed output in --output: a finished one, or one a killed or failed "
                          "pack left (a pack does not resume; it starts again)")
    out.add_argument("--validate", action="store_true", help="check every row against the row convention")
    out.add_argument("--progress-seconds", type=float, default=10.0, help="seconds between progress lines (no TTY)")
    out.add_argument("--head-start", action=argparse.BooleanOptionalAction, default=True,
                     help="the driver packs from the end of its checks, and an embedded Ray starts only if its "
                          "packing actors would finish sooner (default on; off: Ray starts at once and every window "
                          "is packed on the actors)")


def run(args: argparse.Namespace) -> int:
    # the pipeline, imported when it runs: `packfeed` imports every subcommand module to build its parser
    from packfeed.service.packjob.pack_run import run_pack

    positive_number("--progress-seconds", args.progress_seconds)
    base = load_config_file(args.config)
    config = data_config_from_args(args, base)
    scaling = packing_from_args(args, base)
    output = resolve_output(args.output)
    stats = run_pack(config, output, scaling=scaling, address=args.address, overwrite=args.overwrite,
                     validate=args.validate, progress_seconds=args.progress_seconds, head_start=args.head_start)
    notice = few_rows_notice(int(stats.get("rows", 0)), config.seq_len, int(stats.get("tokens", 0)))
    if notice:
        logger.warning(notice)
    return 0


def few_rows_notice(rows: int, seq_len: int, tokens: int) -> str | None:
    """A warning when the whole output is fewer than ``FEW_ROWS`` rows (a long ``seq_len`` on a
    small corpus: 1M-token rows of a 400k-token corpus make one row), naming the ``seq_len``
    that gives ``FEW_ROWS``; None otherwise (and for an empty output, which the run refused)."""
    if not 0 < rows < FEW_ROWS:
        return None
    fits = max(1, tokens // FEW_ROWS)
    return (f"the whole output is {rows} row(s) of {seq_len:,} tokens ({tokens:,} tokens packed): a data-parallel "
            f"run takes a row per rank and step, so {FEW_ROWS} ranks would get less than one step; for "
            f"{FEW_ROWS} rows or more pack with --seq-len {fits} or less")
