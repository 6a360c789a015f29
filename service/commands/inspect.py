"""``packfeed inspect DIR``: what a packed directory holds, and what the model will see.

    packfeed inspect runs/demo-pack                 # the report: config, totals, sources, epochs
    packfeed inspect runs/demo-pack --row 3         # row 3 decoded, segment by segment
    packfeed inspect s3://bucket/packed/demo        # an output ``pack`` wrote to a store

DIR is whatever the storage layer takes (service/storage/: a path, s3://, gs://, ...), as for
``pack --output`` and ``serve``: passed on as given (a ``Path`` would fold ``s3://b/p`` into
``s3:/b/p``, a local path that does not exist). A row is read from its
row group alone (on a store: the part's footer and that group's ranged GETs).

A decoded row shows every segment on its own line with its sample id and length; tokens the
loss trains on are in ``[[ ]]``, the rest (prompts, the first token of each sample, padding)
plain, so a user sees exactly which text is learned. Example (chat sample, loss on the
assistant turn)::

    segment 0: sample 112, 23 tokens
      <|im_start|>user
      What is 2+2?<|im_end|>
      <|im_start|>assistant
      [[4.<|im_end|>]]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID
from packfeed.service import storage
from packfeed.service.packed.writer import open_parquet, packed_dir_info, part_files
from packfeed.service.pipeline.summary import format_summary, upgrade_stats
from packfeed.service.tokenize.samples import load_tokenizer

HELP = "show a packed directory's stats and decode rows (segments, trained tokens)"
ORDER = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="a `packfeed pack --output` directory or URI (s3://bucket/prefix, ...)")
    parser.add_argument("--row", type=int, action="append", help="decode this row (repeatable)")
    parser.add_argument("--tokenizer", help="tokenizer to decode with (default: the one the directory was packed with)")
    parser.add_argument("--json", action="store_true", help="print the stats as JSON")


def run(args: argparse.Namespace) -> int:
    shown = storage.display(args.directory)  # a URI's credentials are never printed
    info = packed_dir_info(args.directory)  # an unfinished pack: ValueError saying what is there
    if info is None:
        raise ValueError(f"{shown} is not a packfeed output directory (no .packfeed/config.json)")
    stats, config = upgrade_stats(info["stats"]), info["config"]
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        data = config["data"]
        print(f"{shown}: {stats['rows']:,} rows of {data['seq_len']} tokens, stream {config['config_hash']}, "
              f"tokenizer {data['tokenizer']}, strategy {data['strategy']}, {data.get('epochs', 1)} epoch(s)")
        print(format_summary(stats))
    for r in args.row or []:
        print(decode_row(args.directory, r, args.tokenizer or config["data"]["tokenizer"]))
    return 0


def decode_row(directory: str, index: int, tokenizer_name: str) -> str:
    """Row ``index`` of the directory (a path or URI) as text, segment by segment, trained
    tokens in [[ ]]."""
    table, first = None, 0
    for f in part_files(directory):
        part = open_parquet(f)
        for group in range(part.metadata.num_row_groups):
            num_rows = part.metadata.row_group(group).num_rows
            if index < first + num_rows:
                table = part.read_row_group(group).slice(index - first, 1)
                break
            first += num_rows
        if table is not None:
            break
    else:
        raise ValueError(f"{storage.display(directory)} has {first:,} rows; row {index} does not exist")
    tok = load_tokenizer(tokenizer_name).tokenizer
    ids = np.asarray(table.column("input_ids")[0].as_py())
    labels = np.asarray(table.column("labels")[0].as_py())
    lens = table.column("seq_lens")[0].as_py()
    sids = table.column("sample_ids")[0].as_py()
    roles = table.column("pair_roles")[0].as_py() if "pair_roles" in table.column_names else [-1] * len(lens)
    lines = [f"row {index} (stream row {table.column('row_index')[0].as_py()}): {len(lens)} segment(s)"]
    start = 0
    for k, (n, sid, role) in enumerate(zip(lens, sids, roles)):
        seg_ids, trained = ids[start:start + n], labels[start:start + n] != IGNORE_INDEX
        start += n
        if sid == PAD_SAMPLE_ID:
            lines.append(f"segment {k}: padding, {n} tokens")
            continue
        side = {1: " (pair: chosen)", 0: " (pair: rejected)"}.get(role, "")
        lines.append(f"segment {k}: sample {sid}{side}, {n} tokens, {int(trained.sum())} trained")
        lines.append("  " + _marked(tok, seg_ids, trained).replace("\n", "\n  "))
    return "\n".join(lines)


def _marked(tok, ids: np.ndarray, trained: np.ndarray) -> str:
    """Decode runs of equal trainedness; trained runs wrapped in [[ ]]."""
    out, k = [], 0
    while k < len(ids):
        j = k
        while j < len(ids) and trained[j] == trained[k]:
            j += 1
        text = tok.decode([int(t) for t in ids[k:j]], skip_special_tokens=False)
        out.append(f"[[{text}]]" if trained[k] else text)
        k = j
    return "".join(out)
