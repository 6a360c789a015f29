"""``packfeed train``: pack and train in one command, on an embedded Ray or a cluster.

    packfeed train --config examples/train_demo.toml [INPUT...] [--model M] [--max-steps N]
                   [--num-workers N] [--output DIR] [--resume [auto] | --overwrite] [--address ADDR]

The config file (TOML or JSON) holds ``[data]`` (the DataConfig of ``packfeed pack``),
``[model]``, ``[train]`` and ``[scaling]`` (see ``packfeed.trainer.run_config``); the data flags
of ``packfeed pack`` and the flags below override it. SIGTERM or SIGINT stop the run after a
checkpoint (exit 143 / 130; ``packfeed.trainer.launch.ray_driver``): continue it with ``--resume``.

``--launcher torchrun`` runs this process as one rank of a torchrun (or srun) job, without Ray,
on a packed directory or a ``packfeed serve`` (``--server``): ``packfeed.trainer.launch.torchrun``.

``--plan`` prints the per-GPU memory estimate of the run (``packfeed.trainer.model.memory_plan``) and
exits 0 when it fits, 2 when not, reading only the model's config.json: no Ray, no data. A run
checks the same plan before Ray starts (``--no-memory-check`` starts it anyway).
"""

from __future__ import annotations

import argparse

from packfeed.service.face import (
    add_data_arguments,
    data_config_from_args,
    load_config_file,
    parse_pairs,
    resolve_output,
)
from packfeed.trainer.model.memory_plan import plan_memory
from packfeed.trainer.launch.prechecks import context_warning
from packfeed.trainer.launch.ray_driver import train
from packfeed.trainer.launch.torchrun import train_torchrun
from packfeed.trainer.run_config import RunConfig

HELP = "pack and train a causal LM on the packed rows (Ray Train or torchrun; DDP or FSDP2)"
ORDER = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser)  # data flags, --config, --address and the packing flags
    flags = parser._option_string_actions
    flags["--num-workers"].help = "train workers (default from [scaling], 2)"
    flags["--cpus-per-worker"].help = "CPUs per train worker (default from [scaling], 0.5)"
    t = parser.add_argument_group("training")
    t.add_argument("--model", help="HF id, local save_pretrained dir, or tiny-<family> (random weights)")
    t.add_argument("--attn", help="attention back-end: auto, sdpa, eager, flash_attention_2, flash_attention_4, "
                                  "varlen (the flash ones and varlen need a CUDA GPU: refused before Ray starts when "
                                  "the train workers run on the CPU)")
    t.add_argument("--max-steps", type=int, help="optimizer steps (the schedule's length)")
    t.add_argument("--micro-batch-rows", type=int, help="packed rows per micro-batch per worker")
    t.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step")
    t.add_argument("--lr", type=float, help="peak learning rate")
    t.add_argument("--log-every", type=int, help="steps between metric lines")
    t.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (0: at the end only)")
    t.add_argument("--stop-at-step", type=int, help="stop this run early (resume later with --resume)")
    t.add_argument("--packing-workers", type=int, help="packing actors (default from [scaling], 1)")
    t.add_argument("--max-failures", type=int, help="worker-group restarts from the last checkpoint (default 1)")
    m = parser.add_argument_group("memory")
    m.add_argument("--sharding", choices=("ddp", "fsdp"),
                   help="ddp: whole model on every worker; fsdp: weights, gradients and AdamW states sharded (FSDP2)")
    m.add_argument("--activation-checkpointing", choices=("off", "full", "offload"),
                   help="recompute each decoder layer in backward (full), its saved input in host memory (offload)")
    m.add_argument("--loss-chunk-tokens", type=int,
                   help="tokens projected onto the vocabulary at a time by the loss head (0: the full logits)")
    m.add_argument("--gpu-memory-gb", type=float, help="one train worker's GPU memory, for the memory plan")
    m.add_argument("--plan", action="store_true",
                   help="print the per-GPU memory estimate of this run and exit (0 fits, 2 does not); starts no Ray")
    m.add_argument("--no-memory-check", action="store_true",
                   help="start a run whose memory plan does not fit (the estimate may be pessimistic)")
    launch = parser.add_argument_group("launcher")
    launch.add_argument("--launcher", choices=("ray", "torchrun"), default="ray",
                        help="ray: Ray Train workers, packing actors beside them (default); torchrun: this process is "
                             "one rank of a torchrun/srun job, no Ray, rows from a packed directory or --server")
    launch.add_argument("--server", metavar="HOST:PORT",
                        help="--launcher torchrun: read the rows from this `packfeed serve` (each rank a client)")
    launch.add_argument("--token", help="--server's bearer token (default $PACKFEED_AUTH_TOKEN)")
    launch.add_argument("--tls-ca", help="--server: PEM of the CA that signed the server's certificate (TLS)")
    launch.add_argument("--tls-server-name", help="--server: the name on the server's certificate, if not its host")
    o = parser.add_argument_group("output")
    o.add_argument("--output",
                   help="directory or URI (s3://bucket/prefix) for checkpoints, metrics.jsonl, loss.png, final/ "
                        "(default: [output] dir, else runs/train)")
    mode = o.add_mutually_exclusive_group()
    mode.add_argument("--resume", nargs="?", const="yes", choices=("yes", "auto"), default=None,
                      help="continue from the latest checkpoint in --output (a finished run is left as it is, exit 0); "
                           "`--resume auto`: continue if there is one, else start (a job that may be retried or "
                           "re-applied)")
    mode.add_argument("--overwrite", action="store_true", help="discard a previous run in --output")


SERVER_INPUT = "packfeed-serve://{}"  # the input a run from --server records when [data] names none


def run_config_from_args(args: argparse.Namespace, base: dict | None = None):
    """RunConfig from the config file (``base``, read from --config when None) overridden by
    the flags given."""
    base = load_config_file(args.config) if base is None else base
    data = data_config_from_args(args, _server_inputs(args, base))
    model = dict(base.get("model", {}))
    if args.model:
        if args.model != model.get("name"):
            model.pop("overrides", None)  # overrides belong to the config's own model
        model["name"] = args.model
    if args.attn:
        model["attn"] = args.attn
    if "name" not in model:
        raise ValueError("missing --model (or `name` in the config file's [model] table)")
    train = dict(base.get("train", {}))
    for flag in ("max_steps", "micro_batch_rows", "grad_accum", "lr", "log_every", "checkpoint_every", "stop_at_step",
                 "max_failures", "sharding", "activation_checkpointing", "loss_chunk_tokens"):
        if getattr(args, flag) is not None:
            train[flag] = getattr(args, flag)
    scaling = dict(base.get("scaling", {}))
    for flag, key in (("num_workers", "num_workers"), ("cpus_per_worker", "cpus_per_worker"),
                      ("packing_workers", "packing_workers"), ("max_workers", "packing_max_workers"),
                      ("gpu_memory_gb", "gpu_memory_gb")):
        if getattr(args, flag) is not None:
            scaling[key] = getattr(args, flag)
    if args.packer_label:
        scaling["packer_labels"] = parse_pairs(args.packer_label, "--packer-label", str)
    if args.packer_resource:
        scaling["packer_resources"] = parse_pairs(args.packer_resource, "--packer-resource", float)
    optional = {table: base[table] for table in ("eval", "lora") if table in base}  # tables without flags
    return RunConfig.from_dict({"data": data.to_dict(), "model": model, "train": train, "scaling": scaling, **optional})


def _server_inputs(args: argparse.Namespace, base: dict) -> dict:
    """``base`` with, for rows from ``--server`` and a ``[data]`` that names no inputs (the
    server has them), the server as the run's one input (``SERVER_INPUT``): the config then
    records where the rows came from, and needs only the tokenizer and seq_len."""
    data = base.get("data", {})
    if getattr(args, "server", None) is None or args.inputs or "inputs" in data or "sources" in data:
        return base
    return {**base, "data": {**data, "inputs": [SERVER_INPUT.format(args.server)]}}


def run(args: argparse.Namespace) -> int:
    base = load_config_file(args.config)
    config = run_config_from_args(args, base)  # names the inputs, reads none of them
    if args.plan:  # [model], [train], [scaling] and seq_len only: no Ray, no data read
        plan = plan_memory(config)
        longer = context_warning(plan.shape.config, seq_len=config.data.seq_len, name=config.model.name)
        if longer:
            print(f"WARNING {longer}", flush=True)
        print(plan.format(), flush=True)  # its last line is the verdict
        return 0 if plan.fits else 2
    directory = base.get("output", {}).get("dir", "runs/train")
    if not isinstance(directory, str) or not directory:
        raise ValueError(f"[output] dir must be a directory path, got {directory!r}")
    output = resolve_output(args.output or directory)  # a path or a URI (s3://bucket/runs/x)
    if args.launcher == "torchrun":  # this process is one rank; Ray is not imported
        train_torchrun(config, output=output, resume=args.resume, overwrite=args.overwrite, server=args.server,
                       token=args.token, tls_ca=args.tls_ca, tls_server_name=args.tls_server_name,
                       no_memory_check=args.no_memory_check)
        return 0
    if args.server is not None:
        raise ValueError("--server is for --launcher torchrun (under Ray, packfeed train packs its own rows)")
    train(config, output=output, address=args.address, resume=args.resume, overwrite=args.overwrite,
          no_memory_check=args.no_memory_check)  # the memory plan is checked before Ray starts
    return 0
