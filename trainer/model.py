"""Model set-up: a Hugging Face causal LM with a block-causal attention back-end.

``build_model(config, vocab_size=..., device=...)`` loads ``config.name`` (Hub id or local
directory, ``from_pretrained``) or builds ``tiny-<family>`` from a random config
(``tiny_config``) sized to the tokenizer's vocabulary. Weights are initialised under
``torch.manual_seed(seed)``: every rank and every rerun starts from the same weights.

Cost: a tiny model builds in milliseconds; a pretrained one takes its load time. Nothing is
downloaded unless ``name`` is a Hub id missing from the local cache.
"""

from __future__ import annotations

import logging
from typing import Any

from packfeed.trainer.attention import select_attention
from packfeed.trainer.config import TINY_PREFIX, ModelConfig
from packfeed.trainer.tiny_models import TINY_FAMILIES, tiny_config

logger = logging.getLogger(__name__)


def build_model(config: ModelConfig, *, vocab_size: int, device: Any = "cpu", seed: int = 0) -> Any:
    """The model on ``device`` in float32 (autocast handles bf16), in train mode.

    Raises ValueError for an unknown tiny family, or when the tokenizer's ``vocab_size`` is
    larger than a pretrained model's embedding table (token ids would index past it).
    """
    import torch
    from transformers import AutoModelForCausalLM

    attn = select_attention(config.attn, device)
    torch.manual_seed(seed)
    if config.is_tiny:
        family = config.name[len(TINY_PREFIX):]
        if family not in TINY_FAMILIES:
            raise ValueError(f"unknown tiny model {config.name!r}; choose tiny-<family> with family in {TINY_FAMILIES}")
        model_config = tiny_config(family, vocab_size, **config.overrides)
        model = AutoModelForCausalLM.from_config(model_config, attn_implementation=attn)
    else:
        model = AutoModelForCausalLM.from_pretrained(config.name, attn_implementation=attn, dtype=torch.float32)
        embeddings = model.get_input_embeddings().num_embeddings
        if vocab_size > embeddings:
            raise ValueError(
                f"the tokenizer has {vocab_size} tokens but {config.name!r} embeds only {embeddings}: "
                "use the model's own tokenizer (--tokenizer) or resize the embeddings first"
            )
    model.config.use_cache = False
    model.to(device)
    model.train()
    logger.info("model %s: %.2fM parameters, attention %s", config.name, num_parameters(model) / 1e6, attn)
    return model


def num_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_token(model: Any, seq_len: int) -> float:
    """Training FLOPs per token: 6 N plus attention 12 * layers * hidden * seq_len (PaLM's estimate)."""
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", 0) or 0
    hidden = getattr(config, "hidden_size", 0) or 0
    return 6.0 * num_parameters(model) + 12.0 * layers * hidden * seq_len
