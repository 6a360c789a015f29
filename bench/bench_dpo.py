"""DPO training throughput and peak memory: packed pairs against padded pairs (TRL's layout).

    .venv/bin/python bench/bench_dpo.py                                # CPU, ~3 minutes on 2 busy cores
    .venv/bin/python bench/bench_dpo.py --device cuda --dtype bf16     # GPU: larger model, real lengths

The same preference pairs (UltraFeedback-like lengths: prompts lognormal with median 160
tokens, answers median 240, clipped so a pair fits a row; random token ids), the same pairs per
optimizer step and the same initial weights (policy and reference) for both:

* packed: the step's pairs packed whole by packfeed (``pack(..., pairs=...)``, exactfit, into
  rows of ``--seq-len``; ``assemble_rows`` writes each pair as its chosen and rejected
  segments), ``dpo_micro_batch`` and ``accumulate_dpo_gradients`` (block-causal, no mask);
* padded: TRL's ``DataCollatorForPreference`` layout: 2P rows, prompt + chosen then prompt +
  rejected, padded to the longest, an ``attention_mask``; log-probs summed under the
  completion mask, the same sigmoid loss.

Each step: the reference forward (no gradients), the policy forward and backward, AdamW. Timed
after warm-up steps, ``--repeats`` passes, methods interleaved, the minimum pass kept. Real
tokens/s counts the pairs' tokens (2 x prompt + chosen + rejected), no padding. Peak memory: on
CUDA ``max_memory_allocated`` over the method's steps less what was held before; on CPU the peak
RSS growth of a fresh process running the method's steps (torch has no CPU allocator figures).
On CPU the lengths are scaled by ``--length-scale`` and attention is SDPA with dense masks
built from position_ids (correct, not fast): the ratio there is the padding saved, not a kernel.
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
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import table  # noqa: E402

METHODS = ("packed", "padded")
PAD_ID = 0


@dataclass(frozen=True)
class Sizes:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    seq_len: int
    pairs_per_step: int
    length_scale: float


CPU = Sizes(hidden=128, layers=2, heads=4, intermediate=344, seq_len=512, pairs_per_step=16, length_scale=0.25)
CUDA = Sizes(hidden=1024, layers=8, heads=16, intermediate=2816, seq_len=4096, pairs_per_step=32, length_scale=1.0)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--attn", default="auto", help="packed's back-end on CUDA (select_attention); padded runs SDPA")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--pairs-per-step", type=int)
    p.add_argument("--length-scale", type=float)
    p.add_argument("--steps", type=int, default=3, help="timed steps per pass")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-of", choices=METHODS, help=argparse.SUPPRESS)  # child process mode
    args = p.parse_args(argv)
    base = CUDA if args.device == "cuda" else CPU
    given = {"seq_len": args.seq_len, "pairs_per_step": args.pairs_per_step, "length_scale": args.length_scale}
    args.sizes = Sizes(**{**base.__dict__, **{k: v for k, v in given.items() if v is not None}})
    return args


def make_steps(args: argparse.Namespace) -> list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Per step, its pairs as (prompt, chosen, rejected) token ids; every pair fits a row."""
    s = args.sizes
    rng = np.random.default_rng(args.seed)
    n = s.pairs_per_step * (args.warmup + args.steps)

    def lengths(median: float, cap: int) -> np.ndarray:
        drawn = rng.lognormal(np.log(median * s.length_scale), 0.8, size=n)
        return np.clip(np.round(drawn), 1, cap).astype(np.int64)

    prompts = lengths(160, s.seq_len // 4)
    chosen, rejected = lengths(240, s.seq_len // 4), lengths(240, s.seq_len // 4)
    pairs = [tuple(rng.integers(3, args.vocab, size=int(k)) for k in ks) for ks in zip(prompts, chosen, rejected)]
    return [pairs[i : i + s.pairs_per_step] for i in range(0, n, s.pairs_per_step)]


def packed_batch(pairs, seq_len: int, device) -> dict:
    from packfeed.client.offsets import offsets_of
    from packfeed.client.rows import IGNORE_INDEX
    from packfeed.service.packing import assemble_rows, pack
    from packfeed.trainer.objective.dpo import dpo_micro_batch

    tokens, labels, chosen_lens = [], [], []
    for prompt, chosen, rejected in pairs:
        for answer in (chosen, rejected):
            tokens += [prompt, answer]
            labels += [np.full(len(prompt), IGNORE_INDEX), answer]
        chosen_lens.append(len(prompt) + len(chosen))
    lengths = np.array([2 * len(p) + len(c) + len(r) for p, c, r in pairs])
    flat = np.concatenate(tokens).astype(np.int32)
    rows = assemble_rows(pack(lengths, seq_len, pairs=np.ones(len(pairs), bool)), flat,
                         np.concatenate(labels).astype(np.int32), offsets_of(lengths), np.arange(len(pairs)),
                         seq_len=seq_len, pad_id=PAD_ID, pair_chosen_lens=np.array(chosen_lens))
    return dpo_micro_batch(rows, device=device)


def padded_batch(pairs, device) -> dict:
    """TRL's layout: the chosen sides, then the rejected ones, right-padded to the longest."""
    import torch

    sides = [(p, c) for p, c, _ in pairs] + [(p, r) for p, _, r in pairs]
    longest = max(len(p) + len(a) for p, a in sides)
    ids = torch.full((len(sides), longest), PAD_ID, dtype=torch.long)
    mask, completion = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (prompt, answer) in enumerate(sides):
        n = len(prompt) + len(answer)
        ids[i, :n] = torch.from_numpy(np.concatenate([prompt, answer]).astype(np.int64))
        mask[i, :n] = 1
        completion[i, len(prompt) : n] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "completion": completion.to(device)}


def padded_logps(model, batch: dict):
    import torch

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    logps = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    sums = (logps * batch["completion"][:, 1:]).sum(-1)
    return sums.chunk(2)


def step(method: str, policy, reference, optimizer, batch: dict, args: argparse.Namespace) -> float:
    import torch
    import torch.nn.functional as F

    from packfeed.trainer.objective.dpo import accumulate_dpo_gradients
    from packfeed.trainer.objective.dpo_loss import DpoLoss

    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    loss = DpoLoss(beta=0.1)
    if method == "packed":
        value = accumulate_dpo_gradients(policy, [batch], reference=reference, loss=loss,
                                         autocast_dtype=torch.bfloat16 if args.dtype == "bf16" else None).loss
    else:
        with autocast:
            with torch.no_grad():
                ref_chosen, ref_rejected = padded_logps(reference, batch)
            chosen, rejected = padded_logps(policy, batch)
            losses = -F.logsigmoid(loss.beta * ((chosen - ref_chosen) - (rejected - ref_rejected)))
        losses.mean().backward()
        value = float(losses.mean().detach())
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return value


def build_models(args: argparse.Namespace, method: str):
    """(policy, reference) of one method: the same weights for every method."""
    import torch
    from transformers import AutoModelForCausalLM

    from packfeed.trainer.model.attention import select_attention
    from packfeed.trainer.model.tiny import tiny_config

    s = args.sizes
    fields = {"hidden_size": s.hidden, "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
              "num_key_value_heads": s.heads, "intermediate_size": s.intermediate,
              "max_position_embeddings": max(s.seq_len, 1024), "head_dim": s.hidden // s.heads}
    attn = "sdpa" if method == "padded" or args.device == "cpu" else select_attention(args.attn, torch.device("cuda"))
    models = []
    for seed in (args.seed, args.seed + 1):  # the reference: other weights, a loss away from ln 2
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_config("llama", args.vocab, **fields), attn_implementation=attn)
        models.append(model.to(args.device))
    policy, reference = models
    return policy.train(), reference.eval().requires_grad_(False)


def batches_of(method: str, steps, args: argparse.Namespace) -> list[dict]:
    if method == "packed":
        return [packed_batch(pairs, args.sizes.seq_len, args.device) for pairs in steps]
    return [padded_batch(pairs, args.device) for pairs in steps]


def slots_of(method: str, batch: dict) -> int:
    return int(batch["input_ids"].numel())


def run_method_for_memory(args: argparse.Namespace) -> None:
    """Child process: the RSS growth of one method's steps."""
    import psutil
    import torch

    method = args.memory_of
    batches = batches_of(method, make_steps(args)[: args.warmup + 1], args)
    policy, reference = build_models(args, method)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak, done = [base], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for batch in batches:
        step(method, policy, reference, optimizer, batch, args)
    done.set()
    sampler.join()
    print(json.dumps({"peak_bytes": max(peak[0], proc.memory_info().rss) - base}))


def peak_memory_cpu(method: str, argv: list[str]) -> int:
    out = subprocess.run([sys.executable, __file__, *argv, "--memory-of", method], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"]


def sync(args: argparse.Namespace) -> None:
    if args.device == "cuda":
        import torch

        torch.cuda.synchronize()


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
    steps = make_steps(args)
    warm, timed = args.warmup, steps[args.warmup :]
    real_tokens = sum(2 * len(p) + len(c) + len(r) for pairs in timed for p, c, r in pairs)
    models = {m: build_models(args, m) for m in METHODS}
    optimizers = {m: torch.optim.AdamW(models[m][0].parameters(), lr=1e-4) for m in METHODS}
    batches = {m: batches_of(m, steps, args) for m in METHODS}
    slots = {m: sum(slots_of(m, b) for b in batches[m][warm:]) for m in METHODS}
    print(f"device {args.device}, {args.dtype}, torch threads {torch.get_num_threads()}; llama hidden {s.hidden}, "
          f"{s.layers} layers, vocab {args.vocab}; seq_len {s.seq_len}; {s.pairs_per_step} pairs/step, lengths "
          f"x{s.length_scale} (mean pair {real_tokens / len(timed) / s.pairs_per_step:.0f} tokens)")

    peak_cuda, first_loss = {}, {}
    for m in METHODS:
        policy, reference = models[m]
        if args.device == "cuda":
            sync(args)
            held = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        for batch in batches[m][:warm]:
            first_loss[m] = step(m, policy, reference, optimizers[m], batch, args)
        sync(args)
        if args.device == "cuda":
            own = sum(t.numel() * t.element_size() for model in models[m] for t in (*model.parameters(), *model.buffers()))
            peak_cuda[m] = torch.cuda.max_memory_allocated() - held + own
    best = {m: float("inf") for m in METHODS}
    for _ in range(args.repeats):
        for m in METHODS:
            sync(args)
            start = time.perf_counter()
            for batch in batches[m][warm:]:
                step(m, *models[m], optimizers[m], batch, args)
            sync(args)
            best[m] = min(best[m], time.perf_counter() - start)
    peak = peak_cuda if args.device == "cuda" else {m: peak_memory_cpu(m, argv) for m in METHODS}

    rate = {m: real_tokens / best[m] for m in METHODS}
    memory = "peak CUDA alloc MiB" if args.device == "cuda" else "peak RSS growth MiB"
    table(f"DPO steps, {len(timed)} timed x {args.repeats} passes (min kept), first warm-up loss "
          f"packed {first_loss['packed']:.4f} / padded {first_loss['padded']:.4f}",
          ["method", "real tokens/s", "vs padded", "step ms", "slots/step (real share)", memory, "memory vs padded"],
          [[m, f"{rate[m]:,.0f}", f"{rate[m] / rate['padded']:.2f}x", f"{1000 * best[m] / len(timed):.0f}",
            f"{slots[m] / len(timed):,.0f} ({real_tokens / slots[m]:.0%})", f"{peak[m] / 2**20:,.0f}",
            f"{peak[m] / max(peak['padded'], 1):.2f}"] for m in METHODS])
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
