"""LoRA through ``peft``: the ``[lora]`` table, the adapter put on a built model, its size.

With a ``[lora]`` table the run trains a low-rank adapter and leaves the model's own weights
frozen. Every rank, after ``build_model`` and before activation checkpointing and sharding
(trainer/model/parallelize.py), wraps the model with ``peft.get_peft_model`` under
``torch.manual_seed(seed)``: the adapters start equal on every rank (lora_A random, lora_B 0,
so the wrapped model computes exactly what the base computes at step 0). The frozen weights
are then cast to the run's compute dtype (bf16 on a GPU: 2 B a parameter instead of 4), the
adapter stays fp32 and is the only thing that requires a gradient, so the optimizer, the
gradient norm, the checkpoints (trainer/state/checkpoint.py) and ``final/`` hold the adapter
alone. ``final/`` is ``PeftModel.save_pretrained``'s (adapter_config.json,
adapter_model.safetensors): ``PeftModel.from_pretrained(base, final)`` loads it; ``merge = true``
adds ``final/merged/`` (``merge_and_unload``), and a tiny model's base, random from the seed,
is saved in ``final/base/`` (``write_final_extras``).

Size of an adapter on a linear layer of ``in`` x ``out`` features: ``r * (in + out)``
parameters (lora_A r x in, lora_B out x r). Worked example, Qwen2.5-7B, r 16, every linear of
its 28 decoder layers (q 3584->3584, k and v 3584->512, o 3584->3584, gate and up
3584->18944, down 18944->3584): 16 x 90,112 x 28 = 40.4M parameters, 0.53% of 7.62B.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from packfeed.trainer.model.parallelize import decoder_layers, unwrapped
from packfeed.trainer.state.run_dir import BASE_DIR, MERGED_DIR

logger = logging.getLogger(__name__)

ALL_LINEAR = "all-linear"  # peft's: every linear layer but the output layer (lm_head)
OUTPUT_MODULES = ("lm_head", "embed_tokens")  # modules_to_save the plan counts as vocab x hidden


@dataclass(frozen=True, kw_only=True)
class LoraSettings:
    """The ``[lora]`` table: a rank-``r`` adapter scaled by ``alpha / r`` on ``target_modules``
    ("all-linear": every linear layer of the decoder blocks, not lm_head; or a list of module
    names, matched as peft matches them: the name or its last dotted parts), ``dropout`` on its
    input; ``modules_to_save``: modules trained whole beside it (e.g. ["lm_head"]), None: none;
    ``merge``: also save the merged model in ``final/merged/``."""

    r: int = 16
    alpha: float = 32
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = ALL_LINEAR
    modules_to_save: tuple[str, ...] | None = None
    merge: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"[lora] r must be an integer >= 1, got {self.r!r}")
        for name in ("alpha", "dropout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise ValueError(f"[lora] {name} must be a number, got {value!r}")
        if not self.alpha > 0:
            raise ValueError(f"[lora] alpha must be > 0, got {self.alpha!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"[lora] dropout must be in [0, 1), got {self.dropout!r}")
        if self.target_modules != ALL_LINEAR:
            object.__setattr__(self, "target_modules", _names("target_modules", self.target_modules,
                                                               also=f' or "{ALL_LINEAR}"'))
        if self.modules_to_save is not None:
            object.__setattr__(self, "modules_to_save", _names("modules_to_save", self.modules_to_save))
        if not isinstance(self.merge, bool):
            raise ValueError(f"[lora] merge must be true or false, got {self.merge!r}")

    def to_table(self) -> dict[str, Any]:
        """The ``[lora]`` table that gives this (``LoraSettings(**to_table())`` is itself)."""
        table: dict[str, Any] = {"r": self.r, "alpha": self.alpha, "dropout": self.dropout,
                                 "target_modules": self.target_modules if isinstance(self.target_modules, str)
                                 else list(self.target_modules), "merge": self.merge}
        if self.modules_to_save is not None:
            table["modules_to_save"] = list(self.modules_to_save)
        return table

    def peft_config(self) -> Any:
        """This adapter as ``peft.LoraConfig`` (causal LM, no bias trained)."""
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(task_type="CAUSAL_LM", r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=targets, bias="none",
                          modules_to_save=None if self.modules_to_save is None else list(self.modules_to_save))


def _names(key: str, value: Any, *, also: str = "") -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value or \
            not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"[lora] {key} must be a non-empty list of module names{also}, got {value!r}")
    return tuple(value)


def apply_lora(model: Any, lora: LoraSettings, *, seed: int, frozen_dtype: Any = None) -> Any:
    """``model`` (a built Hugging Face CausalLM) wrapped by ``peft.get_peft_model``: the adapter
    initialised under ``torch.manual_seed(seed)`` (the same on every rank), only its parameters
    (and ``modules_to_save``) requiring grad. ``frozen_dtype``: the dtype the frozen weights are
    cast to (e.g. torch.bfloat16; None: kept fp32); the adapter stays fp32."""
    import torch
    from peft import get_peft_model

    torch.manual_seed(seed)
    wrapped = get_peft_model(model, lora.peft_config())
    if frozen_dtype is not None:
        for param in wrapped.parameters():
            if not param.requires_grad and param.is_floating_point():
                param.data = param.data.to(frozen_dtype)
    trainable = num_trainable(wrapped)
    logger.info("LoRA r %d alpha %g on %s: %.2fM trainable parameters", lora.r, lora.alpha,
                lora.target_modules if isinstance(lora.target_modules, str) else ", ".join(lora.target_modules),
                trainable / 1e6)
    return wrapped


def is_lora(model: Any) -> bool:
    """Whether ``model`` (or the module a DDP wrapper holds) is a peft model. peft is imported
    by whoever wrapped it: a run without LoRA never imports it."""
    if "peft" not in sys.modules:
        return False
    from peft import PeftModel

    return isinstance(unwrapped(model), PeftModel)


def base_model(model: Any) -> Any:
    """The Hugging Face model inside a peft wrapper (its layers carry the adapter); ``model``
    itself otherwise."""
    return model.get_base_model() if is_lora(model) else model


@contextlib.contextmanager
def adapter_names(model: Any) -> Iterator[None]:
    """Inside the block, a LoRA ``model``'s decoder layers are their plain modules, not their
    activation checkpointing wrappers: peft finds the adapter's keys from the modules' names
    (``save_pretrained``, ``get_peft_model_state_dict``), and a wrapper's
    ``_checkpoint_wrapped_module.`` is in those names but not in the state dict's keys. For
    saving and loading only (no forward inside); nothing for a model without LoRA."""
    if not is_lora(model):
        yield
        return
    layers = decoder_layers(model)
    wrapped = list(layers)
    for i, layer in enumerate(wrapped):
        layers[i] = getattr(layer, "_checkpoint_wrapped_module", layer)
    try:
        yield
    finally:
        for i, layer in enumerate(wrapped):
            layers[i] = layer


def num_trainable(model: Any) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def adapter_parameters(linears: Iterable[tuple[str, int, int]], lora: LoraSettings, *, vocab: int,
                       hidden: int) -> int:
    """The trainable parameters of ``lora`` on a model whose decoder layers hold the linear
    layers ``linears`` ((qualified name, in, out), e.g. ("model.layers.0.mlp.up_proj", 3584,
    18944)): r x (in + out) per targeted one, plus ``modules_to_save`` whole (lm_head and
    embed_tokens: vocab x hidden; a decoder linear: in x out). Shapes only: the memory plan's."""
    total = 0
    for name, fan_in, fan_out in linears:
        if lora.target_modules == ALL_LINEAR or _matches(name, lora.target_modules):
            total += lora.r * (fan_in + fan_out)
        if lora.modules_to_save and _matches(name, lora.modules_to_save):
            total += fan_in * fan_out
    for name in lora.modules_to_save or ():
        if name in OUTPUT_MODULES:
            total += vocab * hidden
    return total


def _matches(name: str, targets: Iterable[str]) -> bool:
    """peft's rule for a list of names: the module's name is one, or ends with "." + one."""
    return any(name == t or name.endswith("." + t) for t in targets)


def write_final_extras(directory: Path, *, lora: LoraSettings, state_dict: dict, build_base: Callable[[], Any],
                       tiny: bool) -> None:
    """Beside the adapter in ``directory`` (the final model being written): a tiny model's base
    in ``base/`` (its weights exist nowhere else), and with ``merge`` the merged model in
    ``merged/``. ``state_dict``: the trained peft model's whole state dict (on the CPU);
    ``build_base()``: the base model as the run built it (the same seed), on the CPU, in fp32.
    Cost: one more CPU copy of the model on rank 0, once, at the end."""
    import torch
    from peft import get_peft_model

    if not tiny and not lora.merge:
        return
    base = build_base()
    if tiny:
        base.save_pretrained(directory / BASE_DIR)
    if lora.merge:
        trained = get_peft_model(base, lora.peft_config())
        with torch.no_grad():
            missing, unexpected = trained.load_state_dict(state_dict, strict=False)
        if missing or unexpected:
            raise ValueError(f"the trained adapter does not match a fresh one: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        trained.merge_and_unload().save_pretrained(directory / MERGED_DIR)


def check_targets(linears: Iterable[tuple[str, int, int]], lora: LoraSettings) -> None:
    """ValueError, before any rank starts, when a listed target matches no linear layer of the
    decoder blocks ``linears`` (the model's shape): peft's own error would come from every rank."""
    if isinstance(lora.target_modules, str):
        return
    names = [name for name, _, _ in linears]
    missing = [t for t in lora.target_modules if not _matches_any(names, t)]
    if missing:
        known = sorted({n.rsplit(".", 1)[-1] for n in names})
        raise ValueError(f"[lora] target_modules {missing} match no linear layer of the decoder blocks; theirs are "
                         f"{', '.join(known)} (or \"{ALL_LINEAR}\")")


def _matches_any(names: Iterable[str], target: str) -> bool:
    return any(_matches(n, (target,)) for n in names)
