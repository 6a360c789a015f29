"""The trainer's memory layouts: peak memory and tokens/s of sharding, checkpointing, the loss head.

    .venv/bin/python bench/bench_memory.py                        # CPU, ~3 minutes on 2 cores
    .venv/bin/python bench/bench_memory.py --device cuda          # GPU: ~1.3B Llama, seq_len 32,768, bf16
    .venv/bin/python bench/bench_memory.py --world 2 --only fsdp-full-chunked   # 2 ranks (gloo / NCCL)

Every layout trains the same random-init Llama on the same packed rows (random token ids in
samples of lognormal lengths, packed by packfeed, every token trained) from the same weights,
through the trainer's own functions (``build_model``, ``apply_activation_checkpointing``,
``apply_sharding``, ``train_step`` with ``loss_chunk_tokens``). The reference, measured in the
same run, is the layout a naive trainer has: DDP, no activation checkpointing, the loss over
the full logits. Each layout runs in a fresh process (peak memory is per process): one warm-up
step, then ``--steps`` timed steps of ``--rows`` rows of ``--seq-len``.

Columns: peak memory (CUDA ``max_memory_allocated``; on CPU the process's peak RSS, which
includes the interpreter and libraries, ~0.5 GiB, the same in every layout), tokens/s of
forward + backward + AdamW, MFU (GPU: 6N + attention FLOPs per token against the GPU's dense
bf16 peak), and the largest relative difference of the step losses from the reference's (the
layouts compute the same loss: it must stay at float rounding).

CPU sizes: hidden 256, 4 layers, a Qwen-size vocabulary (151,665), seq_len 4096: the logits
(4096 x 151,665 x 4 B = 2.5 GB, their upcast and their gradient) dominate, as they do for a 7B
model at 64k. CUDA sizes: hidden 2048, 16 layers, MLP 5632, 16 heads, 4 kv heads, the same
vocabulary (~1.3B parameters), seq_len 32,768, bf16, ``--attn`` (varlen by default).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from report import table

# name -> (sharding, activation checkpointing, loss chunk tokens)
LAYOUTS = {
    "ddp-off-full-logits": ("ddp", "off", 0),
    "ddp-off-chunked": ("ddp", "off", 1024),
    "ddp-full-chunked": ("ddp", "full", 1024),
    "fsdp-full-chunked": ("fsdp", "full", 1024),
    "fsdp-offload-chunked": ("fsdp", "offload", 1024),
}
REFERENCE = "ddp-off-full-logits"
VOCAB = 151_665


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--world", type=int, default=1, help="ranks (processes) per layout")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--rows", type=int, default=1, help="rows per micro-batch (one micro-batch per step)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--vocab", type=int, default=VOCAB,
                   help="vocabulary size (the logits' width; smaller only to try the script quickly)")
    p.add_argument("--attn", default=None, help="attention back-end (CPU: sdpa; CUDA: varlen)")
    p.add_argument("--only", action="append", choices=sorted(LAYOUTS), help="run only these layouts (repeatable)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--layout", help=argparse.SUPPRESS)  # child mode: run one layout, print one JSON line
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    args.seq_len = args.seq_len or (32_768 if cuda else 4096)
    args.attn = args.attn or ("varlen" if cuda else "sdpa")
    return args


def model_overrides(device: str) -> dict:
    if device == "cuda":
        return {"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16,
                "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 65_536}
    return {"hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 688, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 8192}


def packed_rows(args: argparse.Namespace, rank: int, step: int):
    """``args.rows`` rows of random samples (lognormal lengths, every token trained), packed."""
    from packfeed.service.packing import assemble_rows, pack

    rng = np.random.default_rng([rank, step])
    lengths = []
    while sum(lengths) < args.rows * args.seq_len * 0.97:
        lengths.append(int(np.clip(rng.lognormal(np.log(args.seq_len / 8), 1.0), 16, args.seq_len)))
    lengths = np.array(lengths)
    tokens = rng.integers(3, args.vocab, size=int(lengths.sum())).astype(np.int32)
    labels = tokens.copy()
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    rows = assemble_rows(pack(lengths, args.seq_len), tokens, labels, offsets, np.arange(len(lengths)),
                         seq_len=args.seq_len, pad_id=0)
    from packfeed.client.rows import select_rows

    return select_rows(rows, np.arange(min(args.rows, rows.num_rows)))


def run_layout(rank: int, args: argparse.Namespace, out: str) -> None:
    """One layout on one rank: warm-up, timed steps; rank 0 writes the figures to ``out``."""
    import functools

    import torch
    import torch.distributed as dist

    from packfeed.client.model_inputs import to_model_inputs
    from packfeed.trainer.run_config import ModelConfig, TrainConfig
    from packfeed.trainer.loop.interval import peak_flops
    from packfeed.trainer.model.builder import build_model, flops_per_token
    from packfeed.trainer.loop.optim import build_optimizer
    from packfeed.trainer.model.parallelize import apply_activation_checkpointing, apply_sharding, memory_figures
    from packfeed.trainer.objective.step import accumulate_gradients, train_step

    sharding, checkpointing, chunk = LAYOUTS[args.layout]
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=args.world)
    try:
        bf16 = torch.bfloat16 if cuda else None
        model = build_model(ModelConfig(name="tiny-llama", attn=args.attn, overrides=model_overrides(args.device)),
                            vocab_size=args.vocab, device=device, seed=0)
        fpt = flops_per_token(model, args.seq_len)
        apply_activation_checkpointing(model, checkpointing)
        model = apply_sharding(model, sharding, param_dtype=bf16, device=device)
        optimizer, scheduler = build_optimizer(model, TrainConfig(max_steps=args.steps + 1, warmup_steps=1, lr=1e-4))
        accumulate = functools.partial(accumulate_gradients, chunk_tokens=chunk)
        autocast = bf16 if sharding == "ddp" else None
        batches = [to_model_inputs(packed_rows(args, rank, step), device=device) for step in range(args.steps + 1)]
        losses, tokens = [], 0
        for step, batch in enumerate(batches):
            if step == 1:
                if cuda:
                    torch.cuda.synchronize()
                started = time.perf_counter()
            result = train_step(model, optimizer, scheduler, [batch], grad_clip=1.0, autocast_dtype=autocast,
                                accumulate=accumulate)
            losses.append(result.loss)
            if step >= 1:
                tokens += result.trained_tokens
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        figures = memory_figures(model, optimizer, device)
        peaks = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(args.world)]
        dist.all_gather(peaks, torch.tensor([figures["peak_bytes"]], dtype=torch.float64, device=device))
        if rank == 0:
            per_gpu = tokens / seconds / args.world
            peak = peak_flops(torch.cuda.get_device_name(device)) if cuda else None
            with open(out, "w") as f:
                json.dump({"layout": args.layout, "peak_bytes": max(float(p) for p in peaks), "losses": losses,
                           "tokens_per_s": tokens / seconds, "mfu": fpt * per_gpu / peak if peak else None,
                           "param_bytes": figures["param_bytes"], "optimizer_bytes": figures["optimizer_bytes"],
                           "device": torch.cuda.get_device_name(device) if cuda else "cpu"}, f)
    finally:
        dist.destroy_process_group()


def child(args: argparse.Namespace) -> None:
    import tempfile

    import torch.multiprocessing as mp

    os.environ["MASTER_PORT"] = str(29500 + os.getpid() % 1000)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        if args.world == 1:
            run_layout(0, args, out.name)
        else:
            mp.spawn(run_layout, args=(args, out.name), nprocs=args.world, join=True)
        print("RESULT " + open(out.name).read(), flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.layout:
        child(args)
        return 0
    names = args.only or list(LAYOUTS)
    if REFERENCE not in names:
        names = [REFERENCE, *names]
    results = {}
    for name in names:
        cmd = [sys.executable, __file__, "--layout", name, *(argv if argv is not None else sys.argv[1:])]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            results[name] = {"layout": name, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:160]}
            continue
        results[name] = json.loads(lines[-1][len("RESULT "):])
    ref = results[REFERENCE]
    rows = []
    for name in names:
        r = results[name]
        if "error" in r:
            rows.append([name, "failed: " + r["error"], "", "", "", "", ""])
            continue
        drift = (max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ref["losses"]))
                 if "losses" in ref else float("nan"))
        rows.append([
            name, f"{r['peak_bytes'] / 2**30:.2f}",
            f"{r['peak_bytes'] / ref['peak_bytes']:.2f} x" if "peak_bytes" in ref else "",
            f"{r['tokens_per_s']:,.0f}", f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f} x" if "tokens_per_s" in ref else "",
            f"{r['mfu']:.1%}" if r.get("mfu") else "-", f"{drift:.1e}",
        ])
    device = next((r["device"] for r in results.values() if "device" in r), args.device)
    table(f"memory layouts on {device}: seq_len {args.seq_len}, {args.rows} row(s) per step, {args.world} rank(s), "
          f"vocabulary {args.vocab:,}; reference {REFERENCE}",
          ["layout", "peak GiB", "peak vs ref", "tokens/s", "tokens/s vs ref", "MFU", "loss rel. diff"], rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "layout"}, "results": results}, f, indent=1)
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
