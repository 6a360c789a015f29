"""``packfeed pack``: tokenize and pack a data config into a Parquet dataset directory.

    packfeed pack INPUT... --tokenizer T --seq-len L --output DIR [data flags]
    packfeed pack --config data.toml --output DIR
    packfeed pack 's3://bucket/corpus/*.jsonl' --tokenizer T --seq-len L --output s3://bucket/packed

The flags (and the config file) make a DataConfig and the packing actors' PackingScaling;
``service/pipeline/pack.py`` (``run_pack``) does the rest. Before Ray starts: the config, the
output location (never over an input), the plan (every input scanned, or the scan the output
kept reused), the tokenizer, and a probe of every input's first rows (formats detected, a
source with no valid sample refused); a previous output is removed (``--overwrite``) only once
all of them passed. DIR may be a URI: the rows and metadata are written to the store. Then the rows stream into DIR with
progress, and the run ends with the packing report. It exits non-zero, saying why, when
nothing was packed, when a source delivered nothing, or when more than
``--max-skip-fraction`` of the samples read was bad.
"""

from __future__ import annotations

import argparse

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--output", required=True,
                     help="directory or URI (s3://bucket/prefix, gs://...) for part-*.parquet (and .packfeed/ metadata)")
    out.add_argument("--overwrite", action="store_true", help="replace a previous packfeed output in --output")
    out.add_argument("--validate", action="store_true", help="check every row against the row convention")
    out.add_argument("--progress-seconds", type=float, default=10.0, help="seconds between progress lines (no TTY)")
    out.add_argument("--head-start", action=argparse.BooleanOptionalAction, default=True,
                     help="the driver packs from the end of its checks, and an embedded Ray starts only if its "
                          "packing actors would finish sooner (default on; off: Ray starts at once and every window "
                          "is packed on the actors)")


def run(args: argparse.Namespace) -> int:
    from packfeed.service.pipeline.pack import run_pack

    positive_number("--progress-seconds", args.progress_seconds)
    base = load_config_file(args.config)
    config = data_config_from_args(args, base)
    scaling = packing_from_args(args, base)
    run_pack(config, resolve_output(args.output), scaling=scaling, address=args.address, overwrite=args.overwrite,
             validate=args.validate, progress_seconds=args.progress_seconds, head_start=args.head_start)
    return 0
