"""What a model's config says about its size, without its weights: ``model_shape``.

The memory plan (trainer/model/memory_plan.py) needs a model's hidden size, layers, MLP width, key/value
width, vocabulary and exact parameter counts (in total, per decoder layer, outside the layers).
They come from ``config.json`` alone: the model is built on the meta device (no memory, no
weights read), so the counts are the real model's for any family transformers knows. Cost:
~1.5 s on one core for a 7B model's meta build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from packfeed.service.face import hub_kwargs
from packfeed.trainer.model.builder import check_model
from packfeed.trainer.model.tiny import tiny_config
from packfeed.trainer.run_config import TINY_PREFIX, ModelConfig


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """What the plan needs of a model: its sizes and exact parameter counts.

    ``num_layer_params``: the largest decoder layer's; ``num_root_params``: everything outside
    the decoder layers (embeddings, final norm, lm_head; tied embeddings counted once), so
    ``num_params == num_root_params + the layers' sum``. ``linears``: (name under the decoder,
    in_features, out_features) of every linear layer of the decoder layers (what LoRA's
    "all-linear" targets: trainer/model/lora.py ``adapter_parameters``).
    """

    hidden: int
    num_layers: int
    intermediate: int
    kv_dim: int  # num_key_value_heads x head_dim
    vocab: int
    num_params: int
    num_layer_params: int
    num_root_params: int
    linears: tuple[tuple[str, int, int], ...] = ()
    config: Any = field(default=None, compare=False, repr=False)  # the transformers config read (its context)


def model_shape(config: Any, *, vocab_size: int | None = None) -> ModelShape:
    """The shape of a model from its config: a ``ModelConfig`` (a tiny model needs the
    tokenizer's ``vocab_size``; a directory or a cached Hub id reads only config.json) or a
    transformers config. Parameters are counted on the meta device (no memory, no weights):
    exactly ``sum(p.numel() for p in model.parameters())`` of the real model."""
    import torch
    from transformers import AutoModelForCausalLM

    if isinstance(config, ModelConfig):
        config = _load_config(config, vocab_size)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if layers is None or not len(layers):
        raise ValueError(f"{type(model).__name__} has no decoder layers at get_decoder().layers: the memory plan "
                         "(and fsdp, activation checkpointing) need them")
    per_layer = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    linears = tuple((f"layers.{i}.{name}", module.in_features, module.out_features) for i, layer in enumerate(layers)
                    for name, module in layer.named_modules() if isinstance(module, torch.nn.Linear))
    total = sum(p.numel() for p in model.parameters())  # a tied lm_head is the embedding: once
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return ModelShape(hidden=text.hidden_size, num_layers=len(layers),
                      intermediate=getattr(text, "intermediate_size", None) or 4 * text.hidden_size,
                      kv_dim=(getattr(text, "num_key_value_heads", None) or heads) * head_dim,
                      vocab=text.vocab_size, num_params=total, num_layer_params=max(per_layer),
                      num_root_params=total - sum(per_layer), linears=linears, config=text)


def _load_config(config: ModelConfig, vocab_size: int | None) -> Any:
    if config.is_tiny:
        if vocab_size is None:
            raise ValueError(f"{config.name}: a tiny model's vocabulary is its tokenizer's: give vocab_size")
        return tiny_config(config.name[len(TINY_PREFIX):], vocab_size, **config.overrides)
    from transformers import AutoConfig

    check_model(config, vocab_size=0)  # one clear ValueError for a name that loads no config
    return AutoConfig.from_pretrained(config.name, **hub_kwargs(config.name))  # the Hub unreachable: the cache
