"""Model set-up: a Hugging Face causal LM with a block-causal attention back-end.

``build_model(config, vocab_size=..., device=...)`` loads ``config.name`` (Hub id or local
directory, ``from_pretrained``) or builds ``tiny-<family>`` from a random config
(``tiny_config``) sized to the tokenizer's vocabulary. Weights are initialised under
``torch.manual_seed(seed)``: every rank and every rerun starts from the same weights.
``check_model(config, vocab_size=...)`` checks on the driver, before Ray starts, what would
otherwise fail in every train worker: a name that loads no config, a vocabulary too large.

Cost: a tiny model builds in milliseconds; a pretrained one takes its load time. Nothing is
downloaded unless ``name`` is a Hub id missing from the local cache.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from packfeed.service.face import hub_kwargs, hub_unreachable, hub_unreachable_error, looks_local
from packfeed.trainer.model.attention import select_attention
from packfeed.trainer.run_config import TINY_PREFIX, ModelConfig, tiny_suggestion
from packfeed.trainer.model.tiny import TINY_FAMILIES, tiny_config

logger = logging.getLogger(__name__)


def build_model(config: ModelConfig, *, vocab_size: int, device: Any = "cpu", seed: int = 0,
                empty: bool = False) -> Any:
    """The model on ``device`` in float32 (autocast or FSDP's mixed precision handle bf16), in
    train mode. ``empty``: a pretrained model's layout on the meta device, no weights read nor
    memory taken (the sharded ranks other than 0: ``load_shards_from_rank0`` fills them).

    Raises ValueError when the tokenizer's ``vocab_size`` is larger than a pretrained model's
    embedding table (token ids would index past it); ``check_model`` says so before Ray starts.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    attn = select_attention(config.attn, device)
    hub = {} if config.is_tiny else hub_kwargs(config.name)  # the Hub unreachable: the local cache, no retries
    torch.manual_seed(seed)
    if config.is_tiny:  # a known family: ModelConfig checked it
        model_config = tiny_config(config.name[len(TINY_PREFIX):], vocab_size, **config.overrides)
        model = AutoModelForCausalLM.from_config(model_config, attn_implementation=attn)
    elif empty:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config.name, **hub),
                                                     attn_implementation=attn, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(config.name, attn_implementation=attn, dtype=torch.float32, **hub)
    embeddings = model.get_input_embeddings().num_embeddings
    if vocab_size > embeddings:
        raise ValueError(
            f"the tokenizer has {vocab_size} tokens but {config.name!r} embeds only {embeddings}: "
            "use the model's own tokenizer (--tokenizer) or resize the embeddings first"
        )
    model.config.use_cache = False
    if not empty or config.is_tiny:
        model.to(device)
    model.train()
    logger.info("model %s: %.2fM parameters, attention %s", config.name, num_parameters(model) / 1e6, attn)
    return model


def load_shards_from_rank0(model: Any, whole: Any | None, *, device: Any) -> None:
    """Give a sharded model built empty (``build_model(empty=True)`` then ``apply_fsdp``) its
    weights from rank 0's ``whole`` model (None on the other ranks): rank 0 reads the
    checkpoint once, each rank receives only its own shards (a broadcast per tensor), and the
    buffers a state dict leaves out (rotary frequencies) come from rank 0 too. Peak: one whole
    fp32 copy in rank 0's host memory, none on the other ranks. A collective."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, whole.state_dict() if whole is not None else {}, options=options)
    kept = set(model.state_dict())
    for name, buffer in model.named_buffers():
        plain = name.replace("_checkpoint_wrapped_module.", "")
        if plain in kept:
            continue
        if whole is not None:
            with torch.no_grad():
                buffer.copy_(whole.get_buffer(plain).to(buffer.device))
        dist.broadcast(buffer, src=0)


def check_model(config: ModelConfig, *, vocab_size: int) -> Any:
    """What the driver can check of the model before Ray starts, instead of every train worker
    after it: a tiny model's config builds for this vocabulary; a pretrained ``name`` is a local
    directory or a Hub id whose config loads (config.json only, from the directory or the local
    cache; no weights) and whose embedding table holds the tokenizer's ``vocab_size``. Returns
    that transformers config; raises ValueError, one line, naming the model and the fix (a near
    tiny name: "did you mean"). A Hub id while the Hub is unreachable is read from the local
    cache only, or refused in one line (``hub_unreachable``: one probe, not transformers' 25 s
    of retries). Cost: milliseconds."""
    from transformers import AutoConfig

    if config.is_tiny:
        return tiny_config(config.name[len(TINY_PREFIX):], vocab_size, **config.overrides)
    name = config.name
    choices = f"a local save_pretrained directory, a Hugging Face id, or tiny-<family> ({', '.join(TINY_FAMILIES)})"
    if looks_local(name) and not os.path.isdir(name):
        what = "is a file" if os.path.exists(name) else "does not exist"
        raise ValueError(f"model {name!r} {what}{tiny_suggestion(name)}: give {choices}")
    if os.path.isdir(name) and not os.path.isfile(os.path.join(name, "config.json")):
        raise ValueError(f"model {name!r} is a directory without config.json (not a save_pretrained directory): "
                         f"give {choices}")
    unreachable = hub_unreachable(name)
    try:
        model_config = AutoConfig.from_pretrained(name, **({"local_files_only": True} if unreachable else {}))
    except Exception as e:  # OSError (no config.json, not cached, no network), ValueError (unknown model type), ...
        if unreachable:
            raise hub_unreachable_error("model", name, unreachable, tiny_suggestion(name)) from None
        detail = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise ValueError(f"model {name!r}: cannot load its config ({type(e).__name__}: {detail})"
                         f"{tiny_suggestion(name)}; give {choices} (a Hub id must be in the local cache or "
                         "reachable)") from None
    embeddings = getattr(model_config, "vocab_size", None)
    if isinstance(embeddings, int) and vocab_size > embeddings:
        raise ValueError(f"the tokenizer has {vocab_size} tokens but {name!r} embeds only {embeddings}: "
                         "use the model's own tokenizer (--tokenizer) or resize the embeddings first")
    return model_config


def num_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_token(model: Any, seq_len: int) -> float:
    """Training FLOPs per token: 6 N plus attention 12 * layers * hidden * seq_len (PaLM's estimate)."""
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", 0) or 0
    hidden = getattr(config, "hidden_size", 0) or 0
    return 6.0 * num_parameters(model) + 12.0 * layers * hidden * seq_len
