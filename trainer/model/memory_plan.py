"""One train worker's peak GPU memory, by term, before anything starts: ``packfeed train --plan``.

``plan_memory(run)`` reads the model's config only (``config.json``; a tiny model's from
``tiny_config``), counts its parameters exactly on the meta device, and adds up what one worker
holds at its peak for the run's ``[train] sharding``, ``activation_checkpointing``,
``loss_chunk_tokens``, ``precision``, ``micro_batch_rows``, ``[scaling] num_workers``, ``[data]
seq_len`` and ``[lora]`` (frozen weights at 2 B/param in bf16, states for the adapter only).
``MemoryPlan.format()`` prints the table and one last line, ``fits: yes:
...`` or ``fits: no: ...; try <the cheapest change that fits>``. ``check_memory_plan`` is the
same check before a run starts: a ValueError when the plan does not fit.

Worked example (the public arithmetic the terms reproduce), Qwen2.5-7B (7.62B parameters, 28
layers, hidden 3,584, intermediate 18,944, 4 kv heads of 128, vocabulary 152,064) at seq_len
65,536, one row a micro-batch, 8 x 80 GB, bf16, fsdp, full checkpointing, loss chunk 1,024:

    sharded states             16 B x 7.62B / 8                         15.2 GB
    checkpointed layer inputs  28 x 65,536 x 3,584 x 2 B                13.2 GB
    one layer's recompute      65,536 x 2 B x (8 x 3,584 + 2 x 512 + 4 x 18,944)   13.8 GB
    gathered parameters        (2 x 233M + 1.09B) x 2 B                  3.1 GB
    loss chunk                 3 x 1,024 x 152,064 x 4 B                 1.9 GB
    overhead                   5% + 1 GB                                 3.4 GB
    total                                                               50.5 GB: fits 80 GB

Without checkpointing the activations are 28 x 13.8 = 387 GB; the full logits instead of a
chunk 65,536 x 152,064 x (2 + 4 + 4) B = 100 GB (the public 40 GB of fp32 logits, 40 GB of
their gradient, and the bf16 logits they are upcast from); ddp 16 B x 7.62B = 122 GB of
states, plus 4 B of gradient buckets and 2 B of autocast copies a parameter. None fits.

GB here is 10^9 bytes, as ``[scaling] gpu_memory_gb`` (an "80 GB" GPU holds 85.0e9 bytes: the
user's 80 is on the safe side). The estimate is an upper-ish bound for dense decoder-only
models with flash/varlen attention (no L x L matrix is saved); a mixture-of-experts model's
``intermediate_size`` is per expert and its activations are not modelled. Cost: the meta model
of a 7B builds in ~1.5 s on one core; the arithmetic is microseconds.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from itertools import product

from packfeed.service.face import load_tokenizer
from packfeed.trainer.model.lora import adapter_parameters, check_targets
from packfeed.trainer.run_config import DEFAULT_LOSS_CHUNK_TOKENS, INITIAL_REFERENCE, ModelConfig, RunConfig
from packfeed.trainer.model.shape import ModelShape, model_shape

logger = logging.getLogger(__name__)

GB = 10**9
STATE_BYTES = 16  # per parameter: fp32 weight 4 + fp32 gradient 4 + AdamW's exp_avg 4 + exp_avg_sq 4
# DDP copies every gradient into its all-reduce buckets (gradient_as_bucket_view is off): a
# second fp32 gradient, whole on every rank; a single worker is not wrapped in DDP (parallelize.py).
DDP_BUCKET_BYTES = 4
# ddp + bf16 runs under torch.autocast, which caches a bf16 copy of every weight for the whole
# forward (and without checkpointing autograd keeps them for backward): 2 B per parameter.
AUTOCAST_COPY_BYTES = 2
GATHERED_LAYERS = 2  # fsdp: the layer running and the next one, prefetched
LOSS_CHUNK_COPIES = 3  # a chunk's fp32 logits, their log-softmax and their gradient
FP32 = 4
# The CUDA context with cuBLAS/NCCL workspaces takes ~0.5-1 GB per process before any tensor,
# and PyTorch's caching allocator holds a few percent more than the live tensors (blocks split
# between sizes that change every micro-batch); the same figure covers small transients the
# terms leave out (the gradient flowing between layers, a layer's unsharded gradient before
# its reduce-scatter, attention's log-sum-exp).
OVERHEAD_FRACTION = 0.05
OVERHEAD_BYTES = 1 * GB
ASSUMED_GPU_GB = 80.0  # use_gpu = "yes", no [scaling] gpu_memory_gb and no GPU on this machine
HOST_SOURCE = "host memory / workers"
MAX_WORKERS_TRIED = 4096


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How one worker runs the model: the settings the terms are a function of."""

    sharding: str
    activation_checkpointing: str
    loss_chunk_tokens: int  # 0: full logits
    micro_batch_rows: int
    grad_accum: int
    seq_len: int
    num_workers: int
    bf16: bool
    objective: str = "sft"
    reference_params: int = 0  # dpo: the frozen reference's parameters
    lora_params: int = 0  # [lora]: the adapter's (the only trained) parameters; 0: every weight trains

    @property
    def tokens(self) -> int:
        """One micro-batch's tokens: only one micro-batch is alive at a time."""
        return self.micro_batch_rows * self.seq_len

    @property
    def activation_bytes(self) -> int:
        return 2 if self.bf16 else FP32

    @property
    def chunked(self) -> bool:
        """Whether the loss head projects chunks (SFT's loss and DPO's log-probs alike)."""
        return self.loss_chunk_tokens > 0


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """One train worker's estimated peak: ``terms`` ((name, bytes) in order, ``notes`` the
    arithmetic of each), their ``total_bytes`` and the memory it is compared with
    (``gpu_memory_bytes``, from ``gpu_memory_source``: "[scaling] gpu_memory_gb",
    "detected: <device>", or "host memory / workers" for a CPU run). ``advice``: the cheapest
    change that fits, "" when the plan fits."""

    model: str
    shape: ModelShape
    layout: Layout
    terms: tuple[tuple[str, int], ...]
    notes: tuple[str, ...]
    total_bytes: int
    gpu_memory_bytes: int
    gpu_memory_source: str
    on_gpu: bool
    advice: str = ""

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.gpu_memory_bytes

    @property
    def verdict(self) -> str:
        """The table's last line: ``fits: yes: estimated peak 50.5 GB of 80.0 GB per GPU``, or
        ``fits: no: ...; try --activation-checkpointing full``."""
        unit = "GPU" if self.on_gpu else "worker"
        line = f"estimated peak {_gb(self.total_bytes)} GB of {_gb(self.gpu_memory_bytes)} GB per {unit}"
        return f"fits: yes: {line}" if self.fits else f"fits: no: {line}; {self.advice}"

    def format(self) -> str:
        """The aligned table (GB, one decimal), then ``verdict`` as the last line."""
        s, lay = self.shape, self.layout
        layers = f"{s.num_layers} layers x {s.num_layer_params / 1e6:,.1f}M, {s.num_root_params / 1e9:.2f}B outside them"
        workers = _workers(lay.num_workers)
        sharding = f"fsdp over {workers}" if lay.sharding == "fsdp" else f"ddp on {workers}"
        loss = f"loss chunk {lay.loss_chunk_tokens:,} tokens" if lay.chunked else "full logits"
        plural = "s" if lay.micro_batch_rows > 1 else ""
        rows = [(name, f"{_gb(size)} GB", note) for (name, size), note in zip(self.terms, self.notes)]
        rows += [("total", f"{_gb(self.total_bytes)} GB", ""),
                 ("GPU memory" if self.on_gpu else "memory", f"{_gb(self.gpu_memory_bytes)} GB", self.gpu_memory_source)]
        name_width = max(len(r[0]) for r in rows)
        size_width = max(len(r[1]) for r in rows)
        lines = [f"memory plan of one train worker: {self.model}, {s.num_params / 1e9:.2f}B parameters ({layers})",
                 f"  micro-batch {lay.micro_batch_rows} row{plural} x {lay.seq_len:,} tokens, {sharding}, activation "
                 f"checkpointing {lay.activation_checkpointing}, {loss}, {'bf16' if lay.bf16 else 'fp32'}"
                 + (f", LoRA ({lay.lora_params / 1e6:,.1f}M trained parameters)" if lay.lora_params else ""), ""]
        for i, (name, size, note) in enumerate(rows):
            if i == len(self.terms):
                lines.append("  " + "-" * (name_width + size_width + 2))
            lines.append(f"  {name:<{name_width}}  {size:>{size_width}}  {note}".rstrip())
        return "\n".join([*lines, self.verdict])


def estimate(shape: ModelShape, layout: Layout) -> tuple[tuple[str, int, str], ...]:
    """The terms (name, bytes, arithmetic) of one worker's peak, overhead last. Pure.

    One decoder layer saves for its backward, per token, about ``activation_bytes x (8 hidden +
    2 kv_dim + 4 intermediate)``: each of the two RMSNorms its input upcast to fp32 (2 units of
    hidden) and its normalised output (1); q and the attention output (1 each); k and v
    (kv_dim each); the MLP's gate and up projections, silu(gate) and their product (4 of
    intermediate). Flash/varlen attention saves its log-sum-exp, not an L x L matrix.
    """
    s, lay = shape, layout
    act = lay.activation_bytes
    fsdp = lay.sharding == "fsdp"
    # the residual stream, the layers' inputs: fp32 under autocast (ddp), whose linear layers
    # return bf16 but whose embeddings (fp32 weights) and residual adds stay fp32
    stream = act if fsdp or lay.lora_params else FP32  # LoRA: the embeddings' frozen weights are bf16
    terms = _weight_terms(s, lay)
    per_token = act * (8 * s.hidden + 2 * s.kv_dim + 4 * s.intermediate)
    layer = lay.tokens * per_token
    recompute = f"{lay.tokens:,} tokens x {act} B x (8 x {s.hidden:,} + 2 x {s.kv_dim:,} + 4 x {s.intermediate:,})"
    inputs = s.num_layers * lay.tokens * s.hidden * stream
    if lay.activation_checkpointing == "off":
        terms.append(("activations (no checkpointing)", s.num_layers * layer, f"{s.num_layers} layers x {_gb(layer)} GB"))
    elif lay.activation_checkpointing == "offload":
        terms.append(("checkpointed layer inputs", 0, f"offloaded: {_gb(inputs)} GB in host memory"))
    else:
        terms.append(("checkpointed layer inputs", inputs,
                      f"{s.num_layers} layers x {lay.tokens:,} tokens x {s.hidden:,} hidden x {stream} B"))
    if lay.activation_checkpointing != "off":
        terms.append(("one layer's recompute", layer, recompute))
    if fsdp:
        gathered = min(GATHERED_LAYERS, s.num_layers)
        terms.append(("gathered parameters", (gathered * s.num_layer_params + s.num_root_params) * act,
                      f"({gathered} layers + embeddings, norm, lm_head) x {act} B"))
    if lay.chunked:
        chunk = min(lay.loss_chunk_tokens, lay.tokens)
        terms.append(("loss chunk", LOSS_CHUNK_COPIES * chunk * s.vocab * FP32,
                      f"{LOSS_CHUNK_COPIES} x {chunk:,} tokens x {s.vocab:,} vocab x 4 B"))
    else:  # the logits, their fp32 upcast for the loss, and its gradient
        terms.append(("logits (not chunked)", lay.tokens * s.vocab * (act + FP32 + FP32),
                      f"{lay.tokens:,} tokens x {s.vocab:,} vocab x ({act} + 4 + 4) B"))
    subtotal = sum(size for _, size, _ in terms)
    terms.append(("overhead", int(OVERHEAD_FRACTION * subtotal) + OVERHEAD_BYTES,
                  f"{OVERHEAD_FRACTION:.0%} + {OVERHEAD_BYTES // GB} GB: runtime (CUDA context), allocator fragmentation"))
    return tuple(terms)


def _weight_terms(s: ModelShape, lay: Layout) -> list[tuple[str, int, str]]:
    """Weights, gradients, AdamW states (and DPO's reference) of one worker. With LoRA: the frozen
    weights at the compute dtype's bytes, states for the adapter's r x (in + out) per linear."""
    fsdp = lay.sharding == "fsdp"
    world = lay.num_workers if fsdp else 1
    over = f" / {_workers(world)}" if fsdp else " on every worker"
    trained, adapter = lay.lora_params or s.num_params, " of the adapter" if lay.lora_params else ""
    terms: list[tuple[str, int, str]] = []
    if lay.lora_params:
        weight = lay.activation_bytes
        terms.append(("frozen weights" + ("" if fsdp else " (not sharded)"), _ceil(weight * s.num_params, world),
                      f"{weight} B/param{over}"))
        terms.append(("LoRA adapter states", _ceil(STATE_BYTES * trained, world),
                      f"{STATE_BYTES} B x {trained / 1e6:,.1f}M adapter params{over}"))
    elif fsdp:
        terms.append(("sharded states", _ceil(STATE_BYTES * s.num_params, world),
                      f"{STATE_BYTES} B/param (fp32 weights, grads, AdamW moments) / {_workers(world)}"))
    else:
        terms.append(("model states (not sharded)", STATE_BYTES * s.num_params,
                      f"{STATE_BYTES} B/param (fp32 weights, grads, AdamW moments) on every worker"))
    if not fsdp and lay.num_workers > 1:
        terms.append(("DDP gradient buckets", DDP_BUCKET_BYTES * trained, f"{DDP_BUCKET_BYTES} B/param{adapter}"))
    if not fsdp and lay.bf16:  # LoRA: the frozen weights are bf16 already, only the adapter is copied
        terms.append(("autocast bf16 weight copies", AUTOCAST_COPY_BYTES * trained,
                      f"{AUTOCAST_COPY_BYTES} B/param{adapter}, cached for the forward"))
    if lay.reference_params:
        terms.append(("DPO reference weights", _ceil(FP32 * lay.reference_params, world),
                      f"4 B/param, frozen{f' / {_workers(world)}' if fsdp else ''}"))
    return terms


def total_bytes(shape: ModelShape, layout: Layout) -> int:
    return sum(size for _, size, _ in estimate(shape, layout))


def plan_memory(run: RunConfig, *, gpu_memory_gb: float | None = None, device_name: str | None = None,
                shape: ModelShape | None = None) -> MemoryPlan:
    """The memory plan of ``run`` for one train worker.

    The memory compared with: ``[scaling] gpu_memory_gb`` when given; else the driver's GPU
    (``gpu_memory_gb`` / ``device_name`` as the caller detected it, else nvidia-smi or torch);
    else, for ``use_gpu = "yes"``, an 80 GB GPU; else (``use_gpu = "no"``, or "auto" on a
    machine without a GPU) a CPU run: host memory / num_workers. Precision: bf16 for
    ``precision = "bf16"``, or "auto" on a GPU; fp32 otherwise. ``shape``: the model's, when the
    caller has it (``model_shape``); a tiny model's vocabulary is the tokenizer's, the only data
    input the plan reads, and for tiny models only. Raises ValueError for a config that does
    not load.
    """
    on_gpu, memory, source = _memory_figure(run, gpu_memory_gb, device_name)
    if shape is None:
        vocab = _tokenizer_vocab(run) if run.model.is_tiny else None
        shape = model_shape(run.model, vocab_size=vocab)
    layout = layout_of(run, shape, on_gpu=on_gpu)
    terms = estimate(shape, layout)
    total = sum(size for _, size, _ in terms)
    plan = MemoryPlan(model=run.model.name, shape=shape, layout=layout, terms=tuple((n, b) for n, b, _ in terms),
                      notes=tuple(note for _, _, note in terms), total_bytes=total, gpu_memory_bytes=memory,
                      gpu_memory_source=source, on_gpu=on_gpu)
    return plan if plan.fits else dataclasses.replace(plan, advice=advise(shape, layout, memory))


def check_memory_plan(run: RunConfig, *, no_memory_check: bool, vocab_size: int | None = None) -> MemoryPlan:
    """The plan of ``run``, checked before Ray starts: ValueError with the plan's last line when
    it does not fit on the GPUs, unless ``no_memory_check`` (then a warning). A CPU run is only
    warned: its workers' host memory is the nodes' Ray places them on, not this machine's.
    ``vocab_size``: the tokenizer's, when the caller has loaded it (a tiny model's vocabulary)."""
    plan = plan_memory(run, shape=model_shape(run.model, vocab_size=vocab_size) if vocab_size else None)
    if plan.fits:
        logger.info("memory plan: %s", plan.verdict)
    elif no_memory_check or not plan.on_gpu:
        why = "--no-memory-check" if no_memory_check else "a CPU run: the nodes' memory decides"
        logger.warning("memory plan: %s (starting anyway: %s)", plan.verdict, why)
    else:
        raise ValueError(f"memory plan: {plan.verdict} (`packfeed train --plan` shows the table; "
                         "--no-memory-check starts the run anyway)")
    return plan


def layout_of(run: RunConfig, shape: ModelShape, *, on_gpu: bool) -> Layout:
    """The settings of ``run`` the terms depend on; dpo adds its frozen reference's parameters
    (the model's own for ``dpo_reference = "initial"``, else that model's config is read)."""
    train = run.train
    reference, lora = 0, 0
    if run.lora is not None:  # a listed target the model lacks is refused here, before any rank starts
        check_targets(shape.linears, run.lora)
        lora = adapter_parameters(shape.linears, run.lora, vocab=shape.vocab, hidden=shape.hidden)
    if train.objective == "dpo":
        initial = train.dpo_reference == INITIAL_REFERENCE
        # LoRA's initial reference is the model itself, its adapter disabled: no second copy
        reference = (0 if initial and lora else shape.num_params if initial else
                     model_shape(ModelConfig(name=train.dpo_reference), vocab_size=shape.vocab).num_params)
    return Layout(sharding=train.sharding, activation_checkpointing=train.activation_checkpointing,
                  loss_chunk_tokens=train.loss_chunk_tokens, micro_batch_rows=train.micro_batch_rows,
                  grad_accum=train.grad_accum, seq_len=run.data.seq_len, num_workers=run.scaling.num_workers,
                  bf16=train.precision == "bf16" or (train.precision == "auto" and on_gpu),
                  objective=train.objective, reference_params=reference, lora_params=lora)


def advise(shape: ModelShape, layout: Layout, memory_bytes: int) -> str:
    """``try <flags>``: the cheapest change of ``layout`` whose plan fits ``memory_bytes``.

    Changes, cheapest first: a loss chunk (the same math, chunk by chunk), fewer rows a
    micro-batch (with more accumulation: the same rows a step), fsdp (all-gathers overlap the
    compute), full checkpointing (a third more layer compute), offload (plus host copies), more
    workers (more GPUs; fsdp only). Every combination of the first, third, fourth and fifth is
    tried, then each with the most rows that fit, then with the fewest workers that fit; the
    winner is the one whose dearest change is cheapest (then the fewest changes). E.g. Qwen2.5-7B
    at 65,536 on 8 x 80 GB with checkpointing off: "try --activation-checkpointing full".
    """
    def fits(lay: Layout) -> bool:
        return total_bytes(shape, lay) <= memory_bytes

    best: tuple[tuple[int, ...], str] | None = None
    for ranks, flags, changed in _combinations(layout):
        if fits(changed):
            found = ranks, flags
        else:
            rows = _fewer_rows(changed, fits)
            workers = _more_workers(changed, fits)
            found = ((ranks + (_ROWS,), flags + rows) if rows
                     else (ranks + (_WORKERS,), flags + workers) if workers else None)
        if found:
            key = tuple(sorted(found[0], reverse=True))
            if best is None or key < best[0]:
                best = key, " ".join(found[1])
    if best is not None:
        return f"try {best[1]}"
    frugal = dataclasses.replace(layout, sharding="fsdp", activation_checkpointing="offload", micro_batch_rows=1,
                                 loss_chunk_tokens=layout.loss_chunk_tokens or DEFAULT_LOSS_CHUNK_TOKENS)
    return (f"even fsdp, offloaded checkpoints, a loss chunk and 1 row a micro-batch need "
            f"{_gb(total_bytes(shape, frugal))} GB per worker: lower seq_len or use GPUs with more memory")


_CHUNK, _ROWS, _FSDP, _FULL, _OFFLOAD, _WORKERS = range(1, 7)  # the changes' cost ranks


def _combinations(layout: Layout):
    """(cost ranks, flags, layout) of every combination of the discrete changes, none included."""
    chunk = [((), (), {})]
    if layout.loss_chunk_tokens == 0 and layout.objective == "sft":
        chunk.append(((_CHUNK,), (f"--loss-chunk-tokens {DEFAULT_LOSS_CHUNK_TOKENS}",),
                      {"loss_chunk_tokens": DEFAULT_LOSS_CHUNK_TOKENS}))
    sharding = [((), (), {})]
    if layout.sharding == "ddp":
        sharding.append(((_FSDP,), ("--sharding fsdp",), {"sharding": "fsdp"}))
    checkpointing = [((), (), {})]
    modes = ("off", "full", "offload")  # each keeps less on the GPU than the one before
    for mode, rank in (("full", _FULL), ("offload", _OFFLOAD)):
        if modes.index(mode) > modes.index(layout.activation_checkpointing):
            checkpointing.append(((rank,), (f"--activation-checkpointing {mode}",), {"activation_checkpointing": mode}))
    for parts in product(chunk, sharding, checkpointing):
        ranks = tuple(r for p in parts for r in p[0])
        flags = tuple(f for p in parts for f in p[1])
        changes = {k: v for p in parts for k, v in p[2].items()}
        yield ranks, flags, dataclasses.replace(layout, **changes)


def _fewer_rows(layout: Layout, fits) -> tuple[str, ...]:
    """The most rows a micro-batch below the current that fit, keeping the rows a step."""
    step_rows = layout.micro_batch_rows * layout.grad_accum
    for rows in range(layout.micro_batch_rows - 1, 0, -1):
        if step_rows % rows == 0 and fits(dataclasses.replace(layout, micro_batch_rows=rows)):
            return (f"--micro-batch-rows {rows}", f"--grad-accum {step_rows // rows}")
    return ()


def _more_workers(layout: Layout, fits) -> tuple[str, ...]:
    """The fewest workers above the current that fit (fsdp: the states shard over them)."""
    def fits_over(workers: int) -> bool:
        return fits(dataclasses.replace(layout, num_workers=workers))

    if layout.sharding != "fsdp" or not fits_over(MAX_WORKERS_TRIED):
        return ()
    low, high = layout.num_workers, MAX_WORKERS_TRIED  # low does not fit, high does: the total falls with workers
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if fits_over(middle) else (middle, high)
    return (f"--num-workers {high}",)


def _tokenizer_vocab(run: RunConfig) -> int:
    return load_tokenizer(run.data.tokenizer).vocab_size


def _memory_figure(run: RunConfig, gpu_memory_gb: float | None, device_name: str | None) -> tuple[bool, int, str]:
    """(a GPU run, the memory one worker has in bytes, where that figure came from)."""
    scaling = run.scaling
    if scaling.use_gpu != "no":
        if scaling.gpu_memory_gb is not None:
            return True, int(scaling.gpu_memory_gb * GB), "[scaling] gpu_memory_gb"
        detected = (gpu_memory_gb, device_name or "GPU") if gpu_memory_gb is not None else detect_gpu()
        if detected is not None:
            return True, int(detected[0] * GB), f"detected: {detected[1]}"
        if scaling.use_gpu == "yes":
            assumed = f"assumed: an {ASSUMED_GPU_GB:.0f} GB GPU (none here; set [scaling] gpu_memory_gb)"
            return True, int(ASSUMED_GPU_GB * GB), assumed
    import psutil

    return False, psutil.virtual_memory().total // scaling.num_workers, HOST_SOURCE


def detect_gpu() -> tuple[float, str] | None:
    """(GB, name) of this machine's smallest visible GPU, or None. nvidia-smi first: it reads
    NVML and leaves no CUDA context behind in the driver (one would hold ~0.5 GB of a GPU that
    a train worker on this node needs for the whole run); torch only where nvidia-smi is not."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10, check=True).stdout
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            gpus = []
            for line in out.strip().splitlines():
                index, name, mib = (part.strip() for part in line.split(","))
                if visible is None or index in visible.split(","):
                    gpus.append((int(mib) * 2**20 / GB, name))
            if gpus:
                return min(gpus)
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return props.total_memory / GB, props.name
    except Exception:  # a broken CUDA install: no GPU for the plan
        pass
    return None


def _workers(count: int) -> str:
    return f"{count} worker{'s' if count != 1 else ''}"


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _gb(size: int) -> str:
    return f"{size / GB:,.1f}"
