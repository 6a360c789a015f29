"""Tiny random-weight model configs for tests and laptop runs: nothing is downloaded.

``AutoModelForCausalLM.from_config(tiny_config("qwen3", vocab_size=128))`` builds a model of
about 0.1M parameters in milliseconds: 2 layers, hidden 64, 4 query heads and 2 kv heads (GQA),
head_dim 16, MLP 128, 1024 positions, float32.
"""

from __future__ import annotations

from typing import Any

TINY_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "phi3", "olmo2")

_TINY = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 1024,
    # Several families default to special-token ids beyond a tiny vocabulary (phi3: 32000).
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "dtype": "float32",
}

# Families whose config carries head_dim with a large default (gemma: 256, qwen3: 128); the
# others derive it as hidden_size // num_attention_heads.
_EXPLICIT_HEAD_DIM = ("llama", "qwen3", "mistral", "gemma")


def tiny_config(family: str, vocab_size: int, **overrides: Any) -> Any:
    """A transformers config of ``family`` (one of TINY_FAMILIES) sized for tests.

    ``overrides`` replace any field, e.g. ``sliding_window=8`` (mistral) or
    ``dtype="bfloat16"``. Each family keeps its own quirks (gemma's sqrt(hidden) embedding
    scale and gelu MLP, qwen3/olmo2 q/k norms, phi3's fused qkv, mistral's sliding window).
    """
    from transformers import AutoConfig

    if family not in TINY_FAMILIES:
        raise ValueError(f"unknown tiny model family {family!r}; choose one of {TINY_FAMILIES}")
    if vocab_size < 3:
        raise ValueError(f"vocab_size must be >= 3 (pad, bos and eos ids are 0, 1, 2), got {vocab_size}")
    fields = {**_TINY, "vocab_size": vocab_size, **overrides}
    if family in _EXPLICIT_HEAD_DIM and "head_dim" not in overrides:
        fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
    return AutoConfig.for_model(family, **fields)
