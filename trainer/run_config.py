"""Typed, validated configuration of a training run: model, optimisation, scaling.

The data section is ``packfeed.service.data.config.DataConfig`` (the same as ``packfeed pack``).
A run is ``RunConfig(data=..., model=..., train=..., scaling=..., lora=...)``; ``from_dict`` reads the
``[data]``, ``[model]``, ``[train]``, ``[scaling]`` and optional ``[lora]`` tables of a TOML config
file (``[lora]``: trainer/model/lora.py ``LoraSettings``). Runtime
objects (rank, world size, device, Ray handles) are arguments, never config.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from packfeed.service.face import (
    PACKING_TABLE_KEYS,
    PIECE_ROWS,
    DataConfig,
    PackingScaling,
    check_known_keys,
    check_resources,
    check_selector,
    close_match,
)
from packfeed.trainer.loop.evaluate import EvalConfig
from packfeed.trainer.loop.trackers import report_to_names
from packfeed.trainer.model.attention import ATTENTION_CHOICES
from packfeed.trainer.model.lora import LoraSettings
from packfeed.trainer.objective.dpo_loss import DpoLoss
from packfeed.trainer.model.tiny import TINY_FAMILIES

PRECISIONS = ("auto", "fp32", "bf16")
SHARDINGS = ("ddp", "fsdp")
BALANCES = ("off", "compute")  # [train] balance (service/delivery/balance.py)
ACTIVATION_CHECKPOINTING = ("off", "full", "offload")
MAX_GPU_MEMORY_GB = 1024  # [scaling] gpu_memory_gb above this is a unit mistake (bytes, MB), not a GPU
DEFAULT_LOSS_CHUNK_TOKENS = 1024  # x a 152k vocabulary: 0.6 GB of fp32 logits a chunk, ~1.9 GB with log-softmax and gradient
OBJECTIVES = ("sft", "dpo")
INITIAL_REFERENCE = "initial"  # dpo_reference: a frozen copy of the weights the run starts from
MIN_FEEDER_BUFFER_ROWS = 2 * PIECE_ROWS  # the hub's smallest buffer
TINY_PREFIX = "tiny-"
TINY_NAMES = tuple(TINY_PREFIX + family for family in TINY_FAMILIES)
USE_GPU = {"auto": "auto", "yes": "yes", "no": "no", True: "yes", False: "no"}  # TOML's true / false too


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Which model to train.

    ``name``: a Hugging Face id, a local directory (a ``save_pretrained`` output), or
    ``tiny-<family>`` (``tiny-llama``, ``tiny-qwen3``, ...): a random-weight model built from
    ``packfeed.trainer.model.tiny.tiny_config`` with the tokenizer's vocabulary, where
    ``overrides`` replace config fields (``hidden_size = 128``). ``attn``: an attention
    back-end of ``packfeed.trainer.model.attention.ATTENTION_CHOICES``.
    """

    name: str
    attn: str = "auto"
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"model name must be a Hugging Face id, a local directory or tiny-<family>, got {self.name!r}")
        if not isinstance(self.overrides, Mapping):
            raise ValueError(f"model overrides must be a table of config fields, got {self.overrides!r}")
        if self.attn not in ATTENTION_CHOICES:
            raise ValueError(f"model attn must be one of {', '.join(ATTENTION_CHOICES)}; got {self.attn!r}")
        if self.is_tiny and self.name[len(TINY_PREFIX):] not in TINY_FAMILIES:
            raise ValueError(f"unknown tiny model {self.name!r}{tiny_suggestion(self.name)}: choose "
                             f"tiny-<family> with family one of {', '.join(TINY_FAMILIES)}")
        if self.overrides and not self.is_tiny:
            raise ValueError("model overrides apply to tiny-<family> models only; a pretrained config is loaded as is")
        object.__setattr__(self, "overrides", dict(self.overrides))

    @property
    def is_tiny(self) -> bool:
        return self.name.startswith(TINY_PREFIX)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The optimisation and its bookkeeping.

    One optimizer step consumes ``num_workers * grad_accum * micro_batch_rows`` packed rows.
    The learning rate warms up linearly for ``warmup_steps`` then follows a cosine from ``lr``
    down to ``lr * min_lr_ratio`` at ``max_steps``. ``log_every``: steps between metric lines
    (metrics.jsonl, progress); ``checkpoint_every``: steps between checkpoints (0: only the
    last step); each checkpoint is also a ``ray.train.report`` (~1.7 s on a small box), so keep
    it at tens of steps or more. ``stop_at_step`` ends this run early without changing the
    schedule (a planned interruption: resume later with ``--resume``). ``max_failures``: how
    many times Ray Train restarts the worker group from the latest checkpoint after a worker
    dies (0: the run fails instead). ``feeder_buffer_rows``: rows the feeder keeps for the ranks
    (its memory bound; 0: max(2048, 4 x the rows of a step)); a restarted group that needs rows
    it no longer holds gets them packed again from the window holding them.
    ``mixture_hook``: "module:function" every rank calls after each step to change the data
    mixture from the training loop (trainer/loop/mixture_hook.py); None: the mixture is the config's.
    ``report_to``: the experiment trackers rank 0 logs each metrics record to, ``tensorboard``,
    ``mlflow``, ``wandb`` (a list, one name, or "none": none); trainer/loop/trackers.py says where
    each writes.

    ``objective``: "sft" (the token mean of the causal-LM loss) or "dpo" (preference pairs,
    trainer/objective/dpo.py: the pair mean of the ``dpo_loss_type`` loss, "sigmoid" or "ipo", with
    ``dpo_beta`` and, for sigmoid, ``dpo_label_smoothing``). ``dpo_reference``: the frozen
    reference model, "initial" (the weights the run starts from, also after a resume) or a
    model name as ``[model] name`` takes (a local directory, a Hub id). The ``dpo_*`` keys are
    for objective "dpo" only.

    Memory (trainer/model/parallelize.py, trainer/objective/loss_head.py, trainer/model/memory_plan.py):
    ``sharding``: "ddp" (every rank holds the whole model, its gradients and AdamW states) or
    "fsdp" (FSDP2: ``fully_shard`` per decoder layer and the root, each rank holds 1/world of
    the fp32 weights, gradients and states; with ``precision`` bf16 the layers compute in bf16
    and gradients reduce in fp32). ``activation_checkpointing``: "off", "full" (every decoder
    layer keeps only its input and recomputes the rest in backward) or "offload" (full, with
    those inputs in pinned host memory). ``loss_chunk_tokens``: the loss head projects the
    trained positions' hidden states onto the vocabulary this many tokens at a time, never the
    whole row's logits (0: the full logits, as Hugging Face's loss does).

    ``balance``: which rank trains which row of a step: "off", rank k of N the rows k mod N;
    "compute", the same rows given out so that each micro-batch's ranks hold the same attention
    work (service/delivery/balance.py, docs/training.md).
    """

    max_steps: int = 100
    micro_batch_rows: int = 4
    grad_accum: int = 1
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0
    precision: str = "auto"
    log_every: int = 10
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    stop_at_step: int | None = None
    record_rows: bool = False
    max_failures: int = 1
    feeder_buffer_rows: int = 0
    mixture_hook: str | None = None
    objective: str = "sft"
    dpo_beta: float = 0.1
    dpo_loss_type: str = "sigmoid"
    dpo_label_smoothing: float = 0.0
    dpo_reference: str = INITIAL_REFERENCE
    sharding: str = "ddp"
    activation_checkpointing: str = "off"
    loss_chunk_tokens: int = DEFAULT_LOSS_CHUNK_TOKENS
    report_to: tuple[str, ...] = ()
    balance: str = "off"

    def __post_init__(self) -> None:
        object.__setattr__(self, "report_to", report_to_names(self.report_to))
        for name, choices in (("sharding", SHARDINGS), ("activation_checkpointing", ACTIVATION_CHECKPOINTING),
                              ("balance", BALANCES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}; got {getattr(self, name)!r}")
        _check_int("loss_chunk_tokens", self.loss_chunk_tokens, minimum=0)
        for name in ("max_steps", "micro_batch_rows", "grad_accum", "log_every", "keep_checkpoints"):
            _check_int(name, getattr(self, name), minimum=1)
        for name in ("warmup_steps", "checkpoint_every", "seed", "max_failures", "feeder_buffer_rows"):
            _check_int(name, getattr(self, name), minimum=0)
        if 0 < self.feeder_buffer_rows < MIN_FEEDER_BUFFER_ROWS:
            raise ValueError(f"feeder_buffer_rows must be 0 (automatic) or >= {MIN_FEEDER_BUFFER_ROWS}, "
                             f"got {self.feeder_buffer_rows}")
        if self.stop_at_step is not None:
            _check_int("stop_at_step", self.stop_at_step, minimum=1)
        if self.mixture_hook is not None and (not isinstance(self.mixture_hook, str) or ":" not in self.mixture_hook):
            raise ValueError(f"mixture_hook must be 'module:function', got {self.mixture_hook!r}")
        for name in ("lr", "min_lr_ratio", "weight_decay", "grad_clip"):
            _check_number(name, getattr(self, name))
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("weight_decay and grad_clip must be >= 0 (grad_clip 0 disables clipping)")
        if isinstance(self.betas, (str, bytes)) or not isinstance(self.betas, (list, tuple)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        for b in self.betas:
            _check_number("betas", b)
        betas = tuple(float(b) for b in self.betas)
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", betas)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {self.precision!r}")
        self._check_objective()

    def _check_objective(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}; got {self.objective!r}")
        defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name.startswith("dpo_")}
        if self.objective != "dpo":
            given = sorted(name for name, default in defaults.items() if getattr(self, name) != default)
            if given:
                raise ValueError(f"[train] {', '.join(given)}: for objective = \"dpo\" only; set objective = "
                                 "\"dpo\" or remove them")
            return
        for name in ("dpo_beta", "dpo_label_smoothing"):
            _check_number(name, getattr(self, name))
        if not isinstance(self.dpo_reference, str) or not self.dpo_reference:
            raise ValueError(f"dpo_reference must be \"{INITIAL_REFERENCE}\" or a model name or directory, "
                             f"got {self.dpo_reference!r}")
        self.dpo_loss  # validates beta, loss type and label smoothing

    @property
    def dpo_loss(self) -> Any:
        """The DPO objective's loss (``packfeed.trainer.objective.dpo_loss.DpoLoss``) of these settings."""
        return DpoLoss(beta=float(self.dpo_beta), loss_type=self.dpo_loss_type,
                       label_smoothing=float(self.dpo_label_smoothing))

    @property
    def last_step(self) -> int:
        """The step this run stops after: ``max_steps`` unless ``stop_at_step`` comes first."""
        return min(self.max_steps, self.stop_at_step or self.max_steps)


@dataclass(frozen=True, kw_only=True)
class TrainScaling:
    """Train workers, packing actors and where each runs, sized so both fit the cluster.

    On 2 CPUs the defaults fit: 2 train workers of 0.5 CPU and 1 packing actor of 1 CPU (Ray
    deadlocks when requests exceed the CPUs, see docs/design.md). ``use_gpu``: "auto" uses one
    GPU per train worker when the cluster has GPUs. ``packing``: the packing actors, as pack
    and serve have them (``PackingScaling``), here with a count: they share the nodes' CPUs
    with the train workers. The ``[scaling]`` table gives them flat, with pack's and serve's
    keys (``packing_workers``, ``packing_cpus_per_worker``, ``packing_max_workers``,
    ``packer_labels``, ``packer_resources``: ``from_table``).

    Placement (see packfeed.service.cluster.placement): ``trainer_labels`` / ``driver_labels``
    are Ray label selectors for the train workers and the feeder; None (default) means the
    ``packfeed/role`` defaults when the cluster's nodes carry that label, nothing otherwise.
    ``trainer_resources``: custom resources each train worker asks for (e.g. {"gpu_slot" = 1}).
    ``gpu_memory_gb``: the memory of one train worker's GPU, for the memory plan
    (trainer/model/memory_plan.py); None: the driver's GPU when it has one, else 80 GB for
    ``use_gpu = "yes"``, else (a CPU run) the host's memory per worker.
    """

    num_workers: int = 2
    cpus_per_worker: float = 0.5
    use_gpu: str = "auto"  # TOML's true / false read as yes / no
    packing: PackingScaling = field(default_factory=lambda: PackingScaling(num_workers=1))
    trainer_labels: Mapping[str, str] | None = None
    driver_labels: Mapping[str, str] | None = None
    trainer_resources: Mapping[str, float] = field(default_factory=dict)
    gpu_memory_gb: float | None = None

    def __post_init__(self) -> None:
        _check_int("num_workers", self.num_workers, minimum=1)
        if self.gpu_memory_gb is not None:
            _check_number("gpu_memory_gb", self.gpu_memory_gb)
            if not 0 < self.gpu_memory_gb <= MAX_GPU_MEMORY_GB:
                raise ValueError(f"gpu_memory_gb is one GPU's memory in GB (an H200 has 141), in (0, "
                                 f"{MAX_GPU_MEMORY_GB}]; got {self.gpu_memory_gb!r}")
        _check_number("cpus_per_worker", self.cpus_per_worker)
        if not self.cpus_per_worker > 0:
            raise ValueError("cpus_per_worker must be > 0 (fractions are fine)")
        if not isinstance(self.use_gpu, (str, bool)) or self.use_gpu not in USE_GPU:
            raise ValueError(f"use_gpu must be auto, yes or no (or true / false); got {self.use_gpu!r}")
        object.__setattr__(self, "use_gpu", USE_GPU[self.use_gpu])
        if not isinstance(self.packing, PackingScaling) or self.packing.num_workers is None:
            raise ValueError(f"packing must be a PackingScaling with num_workers set (a run's packing actors share the "
                             f"nodes' CPUs with its train workers: they need a count), got {self.packing!r}")
        for name in ("trainer_labels", "driver_labels"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, check_selector(name, value))
        object.__setattr__(self, "trainer_resources", check_resources("trainer_resources", self.trainer_resources))

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> "TrainScaling":
        """From a ``[scaling]`` table (``packing_workers`` 1 when not given)."""
        own = {f.name for f in dataclasses.fields(cls)} - {"packing"}
        check_known_keys("unknown [scaling] keys", table, own | set(PACKING_TABLE_KEYS))
        packing = PackingScaling.from_table(table, num_workers=1)
        return cls(packing=packing, **{k: v for k, v in table.items() if k in own})

    def to_table(self) -> dict[str, Any]:
        """The ``[scaling]`` table that gives this (``from_table(to_table())`` is itself)."""
        out = dataclasses.asdict(self)
        del out["packing"]
        return {**out, **self.packing.to_table()}


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything a training run is a function of. ``lora``: train a LoRA adapter on the frozen
    model (trainer/model/lora.py), None: every weight."""

    data: DataConfig
    model: ModelConfig
    train: TrainConfig = field(default_factory=lambda: TrainConfig())
    scaling: TrainScaling = field(default_factory=lambda: TrainScaling())
    eval: EvalConfig | None = None  # [eval]: held-out evaluation (trainer/loop/evaluate.py); None: none
    lora: LoraSettings | None = None

    def __post_init__(self) -> None:
        if self.train.objective == "dpo":
            trains_prompts = [s.name for s in self.data.sources if self.data.source_loss(s) == "all"]
            if trains_prompts:
                raise ValueError(f"objective = \"dpo\" compares the answers' log-probs, but loss = \"all\" (source(s) "
                                 f"{', '.join(trains_prompts)}) labels the prompts too: use loss = \"auto\" or "
                                 "\"completion\" for preference data")
        step = self.scaling.num_workers * self.train.grad_accum * self.train.micro_batch_rows
        if self.train.feeder_buffer_rows and self.train.feeder_buffer_rows < 2 * step:
            raise ValueError(f"feeder_buffer_rows {self.train.feeder_buffer_rows} holds less than two steps of "
                             f"{step} rows (num_workers x grad_accum x micro_batch_rows): raise it to at least {2 * step}")

    @property
    def feeder_buffer_rows(self) -> int:
        """The rows the feeder keeps: ``[train] feeder_buffer_rows``, else max(2048, 4 steps)."""
        step = self.scaling.num_workers * self.train.grad_accum * self.train.micro_batch_rows
        return self.train.feeder_buffer_rows or max(2048, 4 * step)

    def to_dict(self) -> dict[str, Any]:
        out = {"data": self.data.to_dict()}
        for name in ("model", "train"):
            out[name] = dataclasses.asdict(getattr(self, name))
        out["scaling"] = self.scaling.to_table()
        out["model"]["overrides"] = dict(self.model.overrides)
        if self.eval is not None:
            out["eval"] = dataclasses.asdict(self.eval)
        if self.lora is not None:  # absent otherwise: a run without LoRA writes the dict it always wrote
            out["lora"] = self.lora.to_table()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RunConfig":
        unknown = sorted(set(d) - {"data", "model", "train", "scaling", "eval", "lora"})
        if unknown:
            raise ValueError(f"unknown config tables {unknown}; expected [data], [model], [train], [scaling], [eval], [lora]")
        if "model" not in d:
            raise ValueError("the config needs a [model] table with at least name = \"tiny-llama\" or a model id/path")
        return cls(
            data=DataConfig.from_dict(d.get("data", {})),
            model=_build(ModelConfig, "model", d["model"]),
            train=_build(TrainConfig, "train", d.get("train", {})),
            scaling=TrainScaling.from_table(d.get("scaling", {})),
            eval=_build(EvalConfig, "eval", d["eval"]) if d.get("eval") is not None else None,
            lora=_build(LoraSettings, "lora", d["lora"]) if d.get("lora") is not None else None,
        )


def _build(cls: type, table: str, values: Mapping[str, Any]) -> Any:
    check_known_keys(f"unknown [{table}] keys", values, {f.name for f in dataclasses.fields(cls)})
    return cls(**values)


def tiny_suggestion(name: str) -> str:
    """" (did you mean 'tiny-llama'?)" for a model name that looks like a typo of a tiny model's
    (tiny-lama, tiny_llama, tinyllama, llama), else ""."""
    if name.startswith(TINY_PREFIX):
        family = close_match(name[len(TINY_PREFIX):], TINY_FAMILIES)
        match = family and TINY_PREFIX + family
    else:
        match = TINY_PREFIX + name if name in TINY_FAMILIES else close_match(name, TINY_NAMES, cutoff=0.8)
    return f" (did you mean {match!r}?)" if match else ""


def _check_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
