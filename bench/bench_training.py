"""Training throughput on packed rows against padded batches and DataCollatorWithFlattening.

    .venv/bin/python bench/bench_training.py                          # CPU, ~2 minutes on 2 cores
    .venv/bin/python bench/bench_training.py --device cuda --dtype bf16   # GPU: larger model, real lengths

The same samples (a FLAN-like length mix, ``synthetic_lengths("flan")``, random token ids),
the same number of samples per optimizer step and the same initial weights for all three:

* packed: the step's samples packed by packfeed (``pack``'s default strategy, exactfit, into
  rows of ``--seq-len``, ``assemble_rows``) and fed through ``to_model_inputs`` (block-causal,
  no mask);
* padded: the step's samples padded to the longest of them, with an ``attention_mask``;
* flattening: transformers' ``DataCollatorWithFlattening`` (one [1, total] row with restarting
  ``position_ids``; with the flash kwargs on CUDA).

Timed: forward + backward + AdamW step, after warm-up steps, ``--repeats`` passes over the
same ``--steps`` steps, methods interleaved in each pass, the minimum pass kept. Real
tokens/s counts sample tokens only (no padding). Peak memory: on CUDA
``torch.cuda.max_memory_allocated`` over the method's warm-up steps, less what was allocated
before them, plus the method's own weights (the three models share the GPU); on CPU torch has
no allocator statistics, so each method runs its steps again in a fresh process and the peak
RSS growth over the process's RSS before its first step is reported (weights, gradients, AdamW
state, activations).

On CPU the lengths are scaled by ``--length-scale`` (0.125: medians ~5 / 44 / 310 tokens) so
a small model finishes in minutes; attention is SDPA with the dense masks transformers builds
from position_ids, which is the CPU path, not a fast one. On CUDA the attention back-end of
packed and flattening is ``select_attention(--attn)`` (flash-attn 2/4 or PyTorch's varlen
kernel), padded uses SDPA.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

GOAL = ("GPU goals (issue 3): packed >= 2x padded tokens/s, no slower than DataCollatorWithFlattening, "
        "lower peak memory than padded. Run there with --device cuda --dtype bf16.")
METHODS = ("packed", "padded", "flattening")
PAD_ID = 0


@dataclass(frozen=True)
class Sizes:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    seq_len: int
    samples_per_step: int
    length_scale: float


CPU = Sizes(hidden=128, layers=2, heads=4, intermediate=344, seq_len=512, samples_per_step=16, length_scale=0.125)
CUDA = Sizes(hidden=1024, layers=8, heads=16, intermediate=2816, seq_len=4096, samples_per_step=32, length_scale=1.0)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--attn", default="auto", help="back-end of packed and flattening on CUDA (select_attention)")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--samples-per-step", type=int)
    p.add_argument("--length-scale", type=float)
    p.add_argument("--steps", type=int, default=3, help="timed steps per pass")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-of", choices=METHODS, help=argparse.SUPPRESS)  # child process mode
    args = p.parse_args(argv)
    sizes = CUDA if args.device == "cuda" else CPU
    args.sizes = Sizes(
        **{**sizes.__dict__, **{k: v for k, v in (("seq_len", args.seq_len), ("samples_per_step", args.samples_per_step),
                                                 ("length_scale", args.length_scale)) if v is not None}}
    )
    return args


def make_samples(args: argparse.Namespace) -> list[list[np.ndarray]]:
    """Per step, the token ids of its samples (FLAN-like lengths, scaled, truncated to L)."""
    from packfeed.service.packing.synthetic import synthetic_lengths

    s = args.sizes
    n = s.samples_per_step * (args.warmup + args.steps)
    lengths = synthetic_lengths("flan", n, seed=args.seed) * s.length_scale
    lengths = np.clip(np.round(lengths), 2, s.seq_len).astype(np.int64)
    rng = np.random.default_rng(args.seed)
    samples = [rng.integers(3, args.vocab, size=int(k)).astype(np.int32) for k in lengths]
    return [samples[i : i + s.samples_per_step] for i in range(0, n, s.samples_per_step)]


def packed_inputs(samples: list[np.ndarray], seq_len: int) -> dict:
    from packfeed.client.model_inputs import to_model_inputs
    from packfeed.client.offsets import offsets_of
    from packfeed.service.packing import assemble_rows, pack

    lengths = np.array([len(x) for x in samples])
    tokens = np.concatenate(samples)
    offsets = offsets_of(lengths)
    rows = assemble_rows(pack(lengths, seq_len), tokens, tokens.copy(), offsets, np.arange(len(samples)),
                         seq_len=seq_len, pad_id=PAD_ID)
    return to_model_inputs(rows)


def padded_inputs(samples: list[np.ndarray]) -> dict:
    import torch

    longest = max(len(x) for x in samples)
    ids = torch.full((len(samples), longest), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, x in enumerate(samples):
        ids[i, : len(x)] = torch.from_numpy(x.astype(np.int64))
        mask[i, : len(x)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 0] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "use_cache": False}


def flattening_inputs(samples: list[np.ndarray], cuda: bool) -> dict:
    from transformers import DataCollatorWithFlattening

    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=cuda)
    batch = collator([{"input_ids": x.tolist(), "labels": x.tolist()} for x in samples])
    return {**batch, "use_cache": False}


def build_inputs(method: str, samples: list[np.ndarray], args: argparse.Namespace) -> dict:
    if method == "packed":
        inputs = packed_inputs(samples, args.sizes.seq_len)
    elif method == "padded":
        inputs = padded_inputs(samples)
    else:
        inputs = flattening_inputs(samples, args.device == "cuda")
    return {k: v.to(args.device) if hasattr(v, "to") else v for k, v in inputs.items()}


def build_models(args: argparse.Namespace, methods: tuple[str, ...] = METHODS) -> dict:
    """One model per method, same weights; padded runs SDPA, the others the chosen back-end."""
    import torch
    from packfeed.trainer.model.attention import select_attention
    from packfeed.trainer.model.tiny import tiny_config
    from transformers import AutoModelForCausalLM

    s = args.sizes
    fields = {
        "hidden_size": s.hidden, "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
        "num_key_value_heads": s.heads, "intermediate_size": s.intermediate,
        "max_position_embeddings": max(s.seq_len, 1024), "head_dim": s.hidden // s.heads,
    }
    varlen = select_attention(args.attn, torch.device(args.device)) if args.device == "cuda" else "sdpa"
    models, state = {}, None
    for method in methods:
        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_config(tiny_config("llama", args.vocab, **fields),
                                                 attn_implementation="sdpa" if method == "padded" else varlen)
        if state is None:
            state = model.state_dict()
        model.load_state_dict(state)
        models[method] = model.to(args.device).train()
    return models


def train_step(model, optimizer, inputs: dict, args: argparse.Namespace) -> float:
    import torch

    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    with autocast:
        loss = model(**inputs).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def sync(args: argparse.Namespace) -> None:
    if args.device == "cuda":
        import torch

        torch.cuda.synchronize()


def run_method_for_memory(args: argparse.Namespace) -> None:
    """Child process: RSS growth of one method's steps (CPU has no allocator statistics)."""
    import psutil
    import torch

    method = args.memory_of
    steps = make_samples(args)[: args.warmup + 1]
    model = build_models(args, (method,))[method]
    batches = [build_inputs(method, samples, args) for samples in steps]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for inputs in batches:
        train_step(model, optimizer, inputs, args)
    done.set()
    sampler.join()
    print(json.dumps({"peak_bytes": max(peak[0], proc.memory_info().rss) - base}))


def peak_memory_cpu(method: str, argv: list[str]) -> int:
    out = subprocess.run([sys.executable, __file__, *argv, "--memory-of", method],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_of:
        run_method_for_memory(args)
        return 0
    s = args.sizes
    steps = make_samples(args)
    models = build_models(args)
    optimizers = {m: torch.optim.AdamW(models[m].parameters(), lr=1e-4) for m in METHODS}
    batches = {m: [build_inputs(m, samples, args) for samples in steps] for m in METHODS}
    warm, timed = args.warmup, steps[args.warmup :]
    real_tokens = sum(len(x) for samples in timed for x in samples)
    slots = {m: sum(int(b["input_ids"].numel()) for b in batches[m][warm:]) for m in METHODS}
    params = sum(p.numel() for p in models["packed"].parameters())
    print(f"device {args.device}, {args.dtype}, torch threads {torch.get_num_threads()}; llama {params / 1e6:.2f}M params "
          f"(hidden {s.hidden}, {s.layers} layers, vocab {args.vocab}); seq_len {s.seq_len}; "
          f"{s.samples_per_step} samples/step, FLAN-like lengths x{s.length_scale} (mean {real_tokens / len(timed) / s.samples_per_step:.0f} tokens)")
    print(f"timed: {len(timed)} steps ({real_tokens} real tokens) x {args.repeats} passes after {warm} warm-up steps; min pass kept")

    peak_cuda = {}
    for m in METHODS:
        if args.device == "cuda":
            # All three models (and the AdamW state of the methods warmed up before) share the
            # GPU: count this method's weights plus what its steps allocate on top of that.
            sync(args)
            held = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        for inputs in batches[m][:warm]:
            train_step(models[m], optimizers[m], inputs, args)
        sync(args)
        if args.device == "cuda":
            own = sum(t.numel() * t.element_size() for t in (*models[m].parameters(), *models[m].buffers()))
            peak_cuda[m] = torch.cuda.max_memory_allocated() - held + own
    best = {m: float("inf") for m in METHODS}
    for _ in range(args.repeats):
        for m in METHODS:
            sync(args)
            start = time.perf_counter()
            for inputs in batches[m][warm:]:
                train_step(models[m], optimizers[m], inputs, args)
            sync(args)
            best[m] = min(best[m], time.perf_counter() - start)
    if args.device == "cuda":
        peak = peak_cuda
    else:
        child = [a for a in argv if a != "--memory-of"]
        peak = {m: peak_memory_cpu(m, child) for m in METHODS}

    rate = {m: real_tokens / best[m] for m in METHODS}
    mem_label = "peak CUDA alloc" if args.device == "cuda" else "peak RSS delta"
    print()
    print(f"| method | real tokens/s | vs padded | step ms | slots/step (real share) | {mem_label} MiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for m in METHODS:
        print(f"| {m} | {rate[m]:,.0f} | {rate[m] / rate['padded']:.2f}x | {1000 * best[m] / len(timed):.0f} | "
              f"{slots[m] / len(timed):,.0f} ({real_tokens / slots[m]:.0%}) | {peak[m] / 2**20:,.0f} |")
    print()
    print(f"packed vs flattening: {rate['packed'] / rate['flattening']:.2f}x tokens/s; "
          f"packed/padded peak memory: {peak['packed'] / max(peak['padded'], 1):.2f}")
    print(f"note: {GOAL}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
