"""The chunked loss head against the full logits: peak memory and seconds of forward + backward.

    .venv/bin/python bench/bench_loss_head.py                     # CPU, ~2 minutes on 2 cores
    .venv/bin/python bench/bench_loss_head.py --chunks 0 256 1024 4096 --seq-len 8192

One tiny random-init Llama (hidden 64, 2 layers: the decoder costs next to nothing, so the head
is what is measured) with a Qwen-size vocabulary (151,665), one packed row of ``--seq-len``
random tokens, every token trained. Each chunk size runs in a fresh process (peak RSS is per
process): ``token_loss_sum(model, inputs, chunk_tokens=c)`` then ``backward()``, one warm-up
pass then ``--passes`` timed ones (the minimum is kept). Chunk 0 is the full logits (the
reference, in the same run): 4096 x 151,665 float32 logits are 2.5 GB, and their log-softmax
and gradients as much again each.

Columns: peak RSS of the process (interpreter, libraries and weights included: the "before"
column, the same for every chunk), its growth over the step (what the loss costs), the ratio of
that growth to the reference's, seconds per forward + backward and their ratio, and the loss's
relative difference from the reference (float rounding only).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from report import table

VOCAB = 151_665
REFERENCE = 0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--chunks", type=int, nargs="+", default=[0, 1024, 4096], help="chunk_tokens (0: full logits)")
    p.add_argument("--passes", type=int, default=2, help="timed forward + backward passes (after one warm-up)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--chunk", type=int, help=argparse.SUPPRESS)  # child mode: one chunk size, one JSON line
    return p.parse_args(argv)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def run_chunk(args: argparse.Namespace) -> dict:
    """One chunk size in this (fresh) process."""
    import numpy as np
    import torch

    from packfeed.client.model_inputs import num_trained_tokens, to_model_inputs
    from packfeed.client.rows import IGNORE_INDEX
    from packfeed.trainer.run_config import ModelConfig
    from packfeed.trainer.model.builder import build_model
    from packfeed.trainer.objective.step import token_loss_sum

    torch.set_num_threads(args.threads)
    overrides = {"max_position_embeddings": max(args.seq_len, 1024)}
    model = build_model(ModelConfig(name="tiny-llama", attn="sdpa", overrides=overrides), vocab_size=VOCAB, seed=0)
    ids = torch.from_numpy(np.random.default_rng(0).integers(3, VOCAB, size=(1, args.seq_len)))
    labels = ids.clone()
    labels[:, 0] = IGNORE_INDEX
    inputs = to_model_inputs({"input_ids": ids, "labels": labels, "position_ids": torch.arange(args.seq_len)[None]})

    def step() -> float:
        model.zero_grad(set_to_none=True)
        loss = token_loss_sum(model, inputs, chunk_tokens=args.chunk)
        loss.backward()
        return float(loss.detach())

    before = peak_rss_bytes()
    loss = step()  # warm-up; the peak of the step is the same in every pass
    seconds = []
    for _ in range(args.passes):
        started = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - started)
    return {"chunk": args.chunk, "tokens": num_trained_tokens(inputs), "loss": loss, "before_bytes": before,
            "peak_bytes": peak_rss_bytes(), "seconds": min(seconds)}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.chunk is not None:
        print("RESULT " + json.dumps(run_chunk(args)), flush=True)
        return 0
    chunks = args.chunks if REFERENCE in args.chunks else [REFERENCE, *args.chunks]
    results = {}
    for chunk in chunks:
        cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--chunk", str(chunk)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            results[chunk] = {"chunk": chunk, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:160]}
            continue
        results[chunk] = json.loads(lines[-1][len("RESULT "):])
    ref = results[REFERENCE]
    gib = 2**30
    rows = []
    for chunk in chunks:
        r = results[chunk]
        if "error" in r:
            rows.append([str(chunk), "failed: " + r["error"], "", "", "", "", "", ""])
            continue
        growth = r["peak_bytes"] - r["before_bytes"]
        ok = "error" not in ref
        rows.append([
            "0 (full logits)" if chunk == 0 else f"{chunk:,}",
            f"{r['before_bytes'] / gib:.2f}", f"{r['peak_bytes'] / gib:.2f}", f"{growth / gib:.2f}",
            f"{growth / (ref['peak_bytes'] - ref['before_bytes']):.2f} x" if ok else "",
            f"{r['seconds']:.2f}", f"{r['seconds'] / ref['seconds']:.2f} x" if ok else "",
            f"{abs(r['loss'] - ref['loss']) / abs(ref['loss']):.1e}" if ok else "",
        ])
    tokens = next((r["tokens"] for r in results.values() if "tokens" in r), 0)
    table(f"loss head on CPU ({args.threads} threads): tiny Llama (hidden 64, 2 layers), vocabulary {VOCAB:,}, "
          f"one row of {args.seq_len:,} tokens, {tokens:,} trained; forward + backward; reference chunk 0",
          ["chunk tokens", "RSS before GiB", "peak RSS GiB", "growth GiB", "growth vs ref", "seconds",
           "seconds vs ref", "loss rel. diff"], rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "chunk"}, "results": results}, f, indent=1)
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
