"""Train a Hugging Face causal LM on a ``packfeed serve`` stream from a plain PyTorch loop.

    packfeed serve service/assets/corpus/*.jsonl --tokenizer service/assets/tokenizer --seq-len 512 &
    python examples/custom_loop.py --target 127.0.0.1:50051 --output runs/custom --steps 20
    python examples/custom_loop.py --target 127.0.0.1:50051 --output runs/custom --steps 40 --resume

No Ray on the trainer: packfeed.client, torch and transformers are all it needs. In order:

1. ``PackedStream`` yields this rank's batches of packed rows (several samples per row).
2. ``to_model_inputs`` turns them into model kwargs with block-causal attention: position_ids
   restart at every sample, no attention_mask, use_cache=False (on CPU, SDPA builds the mask).
3. The loss is the mean over the batch's trained tokens (labels != -100, after the shift).
4. A checkpoint holds the model, the optimizer, the step AND ``stream.state_dict()``, written
   together: ``--resume`` continues the stream exactly where the model stopped learning.

Under --output: ``checkpoints/step_000010/`` (model/ from save_pretrained, optimizer.pt,
state.json) and ``trained.jsonl``, one line per step: loss, global row indices, sample ids.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig

from packfeed.client import IGNORE_INDEX, PackedStream, StreamInfo, num_trained_tokens, to_model_inputs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a tiny causal LM on a packfeed stream.")
    parser.add_argument("--target", required=True, help="HOST:PORT of `packfeed serve`")
    parser.add_argument("--output", type=Path, required=True, help="checkpoints and trained.jsonl go here")
    parser.add_argument("--steps", type=int, default=20, help="stop when this many steps are done (resumes included)")
    parser.add_argument("--batch-rows", type=int, default=4, help="packed rows per step")
    parser.add_argument("--save-every", type=int, default=10, help="checkpoint every K steps (and at the end)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0, help="seeds the model's random init")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output")
    parser.add_argument("--token", default=None, help="the server's bearer token (default $PACKFEED_AUTH_TOKEN)")
    parser.add_argument("--tls-ca", type=Path, default=None, help="PEM of the CA that signed the server's certificate")
    return parser.parse_args(argv)


def new_model(info: StreamInfo, seed: int) -> torch.nn.Module:
    """A tiny random Llama (~0.3M parameters) sized for the stream's tokenizer and rows."""
    torch.manual_seed(seed)  # same seed, same initial weights: runs are reproducible
    config = LlamaConfig(
        vocab_size=info.vocab_size, max_position_embeddings=info.seq_len, pad_token_id=info.pad_id,
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def token_mean_loss(model: torch.nn.Module, inputs: dict) -> tuple[torch.Tensor, int]:
    """(mean loss over the trained tokens of the batch, number of those tokens).

    Token t predicts ``labels[t + 1]`` within its row (Hugging Face's shift, written out as
    packfeed.trainer.objective.step does). Sample starts, prompts and padding are labelled -100 and count
    for nothing, so the mean does not depend on how the samples were packed into rows.
    """
    labels = inputs["labels"]
    logits = model(**{key: value for key, value in inputs.items() if key != "labels"}).logits
    loss_sum = F.cross_entropy(
        logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    tokens = num_trained_tokens(labels)
    return loss_sum / max(tokens, 1), tokens


def latest_checkpoint(output: Path) -> Path | None:
    found = sorted((output / "checkpoints").glob("step_*"))  # zero-padded: name order is step order
    return found[-1] if found else None


def save_checkpoint(output: Path, step: int, model, optimizer, stream: PackedStream) -> None:
    """Model, optimizer, step and stream position, written together; the rename makes it atomic."""
    final = output / "checkpoints" / f"step_{step:06d}"
    partial = final.with_name(f".{final.name}.partial")  # a crash mid-save leaves only this behind
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial / "model")
    torch.save(optimizer.state_dict(), partial / "optimizer.pt")
    (partial / "state.json").write_text(json.dumps({"step": step, "stream": stream.state_dict()}, indent=1))
    partial.rename(final)
    print(f"saved {final}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    latest = latest_checkpoint(args.output)
    if latest is not None and not args.resume:
        raise SystemExit(f"{args.output} already has checkpoints: pass --resume, or another --output")
    checkpoint = latest if args.resume else None
    state = json.loads((checkpoint / "state.json").read_text()) if checkpoint else {"step": 0, "stream": None}
    step = state["step"]

    # The stream resumes from the saved cursor: the first batch is the one after the last trained.
    stream = PackedStream(args.target, batch_rows=args.batch_rows, state=state["stream"],
                          token=args.token, tls_ca=args.tls_ca)
    info = stream.describe()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if checkpoint:
        model = AutoModelForCausalLM.from_pretrained(checkpoint / "model", attn_implementation="sdpa")
    else:
        model = new_model(info, args.seed)
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    if checkpoint:
        optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", weights_only=True))
        print(f"resumed from {checkpoint} (step {step}, stream cursor {state['stream']['cursor']})", flush=True)

    # Steps trained after the checkpoint (before a crash) are trained again: forget them.
    log_path = args.output / "trained.jsonl"
    old = log_path.read_text().splitlines() if checkpoint and log_path.exists() else []
    args.output.mkdir(parents=True, exist_ok=True)
    log_path.write_text("".join(line + "\n" for line in old if json.loads(line)["step"] <= step))

    saved_at = step
    with stream, log_path.open("a") as log:
        # islice stops BEFORE pulling a batch it would not train on: state_dict() stays exact.
        for batch in itertools.islice(stream, max(args.steps - step, 0)):
            inputs = to_model_inputs(batch.rows, device=device)
            loss, tokens = token_mean_loss(model, inputs)
            if tokens:  # the flagged all-padding rows at the very end of the data train nothing
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1

            record = {
                "step": step,
                "loss": loss.item(),
                "trained_tokens": tokens,
                "row_index": batch.row_index.tolist(),
                "sample_ids": [batch.rows.row_sample_ids(r).tolist() for r in range(batch.num_rows)],
            }
            log.write(json.dumps(record) + "\n")
            log.flush()
            print(f"step {step:5d}  loss {record['loss']:.4f}  trained tokens {tokens}", flush=True)
            if step % args.save_every == 0:
                save_checkpoint(args.output, step, model, optimizer, stream)
                saved_at = step
        if step < args.steps:
            print(f"the stream ended after step {step}", flush=True)
        if saved_at != step:
            save_checkpoint(args.output, step, model, optimizer, stream)


if __name__ == "__main__":
    main()
