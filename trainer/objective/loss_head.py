"""The loss head: log-probabilities of the trained tokens, never the B x L x V logits.

A Hugging Face causal LM projects every position onto the vocabulary: at 65,536 tokens and a
152k vocabulary that is 40 GB of float32 logits, and as much again for their gradient. Here:

1. ``final_hidden_states`` runs the model through its root ``__call__`` (FSDP2's root hooks
   gather the root's weights, lm_head included, once; DDP's forward runs as usual) with
   ``logits_to_keep`` an EMPTY index tensor, so the lm_head sees [B, 0, H]; a forward hook on
   ``get_decoder()`` keeps the decoder's final (post-norm) hidden states.
2. ``trained_token_logps`` gathers the hidden states of the trained positions only: token t of
   a row when ``labels[t + 1]`` is trained (Hugging Face's shift). Prompts, padding and the
   last token of every segment cost nothing.
3. ``chunk_tokens`` of them at a time, ``OutputHead.logits`` projects them as the family's
   CausalLM forward does (hidden @ W.T + bias, then its transform, in the compute dtype, e.g.
   bf16 under autocast), upcasts to float32 and takes the log-softmax at the target. Each chunk
   runs under non-reentrant activation checkpointing: its logits are freed after forward and
   recomputed in backward.

Worked example, one row, L=6, ``labels = [-100, 7, 8, -100, 9, 4]``: the trained targets sit
at slots 1, 2, 4, 5, so the hidden states of slots [0, 1, 3, 4] are projected, onto targets
[7, 8, 9, 4]; the returned slots are [0, 1, 3, 4] (row * L + t, row-major).

Cost, N trained tokens, vocabulary V, hidden H: the head's FLOPs are 8 N V H (forward,
recompute, backward) against the full path's 6 B L V H, so it is cheaper as soon as a quarter
of the positions are untrained. Its peak is three chunk x V float32 tensors (the logits, their
log-softmax, its gradient), whatever N; the full path's is three N x V. Measured on CPU
(bench/bench_loss_head.py, V 151,665, one row of 4096 tokens all trained, forward + backward):
chunk 1024 grows the process by 1.85 GiB against 7.0 GiB for the full logits (0.26 x), in 1.2 x
the seconds (the recompute).

Families: the head must compute exactly what the CausalLM forward computes after the decoder.
``LOGIT_TRANSFORMS`` lists the forwards read in transformers 5.x that do
``lm_head(slice_logits_to_keep(last_hidden_state))`` and then nothing, a softcap
(``final_logit_softcapping``: gemma2/3), a multiplier (``logit_scale``: cohere) or a divisor
(``logits_scaling``: granite); any other model is refused with a ValueError (train it with
``loss_chunk_tokens = 0``), never projected a different way than its own forward does.

Pure torch, no Ray; torch is imported inside the functions.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from packfeed.client.rows import IGNORE_INDEX
from packfeed.trainer.model.lora import base_model
from packfeed.trainer.model.parallelize import unwrapped

# Keys of a micro-batch dict that are not model inputs: the labels, and DPO's pair indices
# (trainer/objective/dpo.py PAIR_KEYS).
NON_MODEL_KEYS = ("labels", "chosen_segments", "rejected_segments")

# The CausalLM class whose forward runs -> what it does to ``lm_head``'s output, read in the
# installed transformers (models/*/modeling_*.py): None (nothing), "softcap" (cap * tanh(x /
# cap), cap = config.final_logit_softcapping, None: nothing), "scale" (x * config.logit_scale),
# "divide" (x / config.logits_scaling). tests/unit/trainer/test_loss_head.py builds each one tiny
# and checks the head against the model's own logits.
LOGIT_TRANSFORMS: dict[str, str | None] = {
    "LlamaForCausalLM": None,
    "MistralForCausalLM": None,
    "MinistralForCausalLM": None,
    "MixtralForCausalLM": None,
    "Qwen2ForCausalLM": None,
    "Qwen2MoeForCausalLM": None,
    "Qwen3ForCausalLM": None,
    "Qwen3MoeForCausalLM": None,
    "GemmaForCausalLM": None,
    "PhiForCausalLM": None,  # lm_head with a bias
    "Phi3ForCausalLM": None,
    "StableLmForCausalLM": None,
    "Starcoder2ForCausalLM": None,
    "SmolLM3ForCausalLM": None,
    "Glm4ForCausalLM": None,
    "GPTNeoXForCausalLM": None,
    "OlmoForCausalLM": None,
    "Olmo2ForCausalLM": None,
    "Olmo3ForCausalLM": None,
    "Gemma2ForCausalLM": "softcap",
    "Gemma3ForCausalLM": "softcap",
    "CohereForCausalLM": "scale",
    "Cohere2ForCausalLM": "scale",
    "GraniteForCausalLM": "divide",
}


@dataclass(frozen=True)
class OutputHead:
    """What a CausalLM forward does to the final hidden states: ``lm_head`` (``weight`` [V, H],
    ``bias`` [V] or None) and at most one of the family's transforms."""

    weight: Any
    bias: Any = None
    scale: float | None = None  # logits * scale (cohere)
    divisor: float | None = None  # logits / divisor (granite)
    softcap: float | None = None  # softcap * tanh(logits / softcap) (gemma2/3)

    def logits(self, hidden: Any) -> Any:
        """[n, V] logits of ``hidden`` [n, H], in the dtype the model's own forward gives (the
        autocast dtype under autocast), op for op as its CausalLM forward computes them."""
        import torch
        import torch.nn.functional as F

        logits = F.linear(hidden, self.weight, self.bias)
        if self.scale is not None:
            logits = logits * self.scale
        if self.divisor is not None:
            logits = logits / self.divisor
        if self.softcap is not None:
            logits = logits / self.softcap
            logits = torch.tanh(logits)
            logits = logits * self.softcap
        return logits


def output_head(model: Any) -> OutputHead:
    """The ``OutputHead`` of ``model`` (a Hugging Face CausalLM; a DDP wrapper's module; FSDP2
    wraps in place; a peft model's base, and a ``modules_to_save`` lm_head's active copy). Read
    it AFTER the forward under FSDP2: the root's weights are then the gathered ones. ValueError
    for a model whose forward is not in ``LOGIT_TRANSFORMS`` or whose output embeddings are not
    a plain linear layer."""
    import torch.nn as nn

    model = base_model(unwrapped(model))
    forward_class = _forward_class(model)
    if forward_class not in LOGIT_TRANSFORMS:
        raise ValueError(
            f"the chunked loss head does not know what {forward_class}.forward does to its logits (it knows "
            f"{', '.join(sorted(LOGIT_TRANSFORMS))}): train it with loss_chunk_tokens = 0 (the full logits)")
    lm_head = model.get_output_embeddings()
    if hasattr(lm_head, "original_module") and hasattr(lm_head, "modules_to_save"):  # peft's ModulesToSaveWrapper
        disabled = lm_head.disable_adapters or not lm_head.active_adapters
        lm_head = lm_head.original_module if disabled else lm_head.modules_to_save[lm_head.active_adapters[0]]
    # A subclass with its own forward (quantised, LoRA-wrapped) does not compute hidden @ W.T + b.
    if not isinstance(lm_head, nn.Linear) or type(lm_head).forward is not nn.Linear.forward:
        raise ValueError(f"{forward_class}'s output embeddings are a {type(lm_head).__name__}, not a plain linear "
                         "layer: train it with loss_chunk_tokens = 0 (the full logits)")
    config = model.config
    kind = LOGIT_TRANSFORMS[forward_class]
    transform = {}
    if kind == "softcap" and config.final_logit_softcapping is not None:
        transform = {"softcap": config.final_logit_softcapping}
    elif kind == "scale":
        transform = {"scale": config.logit_scale}
    elif kind == "divide":
        transform = {"divisor": config.logits_scaling}
    return OutputHead(weight=lm_head.weight, bias=lm_head.bias, **transform)


def check_loss_head(config: Any, *, chunk_tokens: int) -> None:
    """Before any worker starts: ValueError (the fix: ``loss_chunk_tokens = 0``) when the
    chunked head would refuse the CausalLM class transformers builds for ``config`` (a
    transformers config: its ``model_type``'s class). Nothing to check for the full logits."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if chunk_tokens == 0:
        return
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", None))
    if name not in LOGIT_TRANSFORMS:
        raise ValueError(
            f"the chunked loss head does not know what {name or config.model_type}.forward does to its logits: "
            "train it with loss_chunk_tokens = 0 (the full logits)")


def final_hidden_states(model: Any, kwargs: Mapping[str, Any]) -> Any:
    """[B, L, H]: the decoder's final (post-norm) hidden states of ``model(**kwargs)``, the
    lm_head run on no position (``logits_to_keep`` an empty index tensor). Through the root's
    ``__call__``, so FSDP2's and DDP's forward hooks run as for an ordinary forward."""
    import torch

    device = kwargs["input_ids"].device
    with _capture_output(base_model(unwrapped(model)).get_decoder()) as captured:
        model(**kwargs, logits_to_keep=torch.empty(0, dtype=torch.long, device=device))
    if len(captured) != 1:
        raise RuntimeError(f"the decoder ran {len(captured)} times in one forward; the loss head expects once")
    hidden = getattr(captured[0], "last_hidden_state", None)
    if hidden is None:
        raise ValueError(f"{type(captured[0]).__name__} (the decoder's output) has no last_hidden_state: train "
                         "with loss_chunk_tokens = 0 (the full logits)")
    return hidden


def trained_token_logps(model: Any, inputs: Mapping[str, Any], *, chunk_tokens: int) -> tuple[Any, Any]:
    """(logps, slots): float32 [N] and int64 [N], one per trained target, row-major.

    ``inputs``: a ``to_model_inputs`` dict (everything but ``NON_MODEL_KEYS`` goes to the
    model). ``logps[i]`` is log p(labels[r, t + 1] | tokens of row r up to t), predicted from
    the hidden state of slot ``slots[i] = r * L + t``, for every (r, t) with ``labels[r, t +
    1] != IGNORE_INDEX``. Gradients flow to the model through ``logps``; with no trained token
    both are empty and ``logps.sum()`` still backpropagates (zero gradients, as the full
    logits' loss gives). Peak memory of the head: a few ``chunk_tokens`` x V float32 tensors.
    """
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be an int >= 1 (0, the full logits, is the callers' path); "
                         f"got {chunk_tokens!r}")
    labels = inputs["labels"]
    hidden = final_hidden_states(model, {k: v for k, v in inputs.items() if k not in NON_MODEL_KEYS})
    head = output_head(model)
    num_rows, seq_len, width = hidden.shape
    labels = labels.to(hidden.device).long()
    if tuple(labels.shape) != (num_rows, seq_len):
        raise ValueError(f"labels must be [B, L] = [{num_rows}, {seq_len}], got {tuple(labels.shape)}")
    row, t = torch.nonzero(labels[:, 1:] != IGNORE_INDEX, as_tuple=True)
    slots = row * seq_len + t
    targets = labels.reshape(-1)[slots + 1]
    trained = hidden.reshape(-1, width)[slots]

    def chunk_logps(chunk_hidden: Any, chunk_targets: Any) -> Any:
        return -F.cross_entropy(head.logits(chunk_hidden).float(), chunk_targets, reduction="none")

    chunks = []
    for start in range(0, max(len(slots), 1), chunk_tokens):  # no trained token: one empty chunk
        part = (trained[start:start + chunk_tokens], targets[start:start + chunk_tokens])
        if torch.is_grad_enabled():
            chunks.append(checkpoint(chunk_logps, *part, use_reentrant=False))
        else:
            chunks.append(chunk_logps(*part))
    return torch.cat(chunks), slots


def _forward_class(model: Any) -> str:
    """The name of the class whose ``forward`` runs (FSDP2's dynamic subclass defines none);
    "<module>.<name>" when it is not one of transformers' models (remote code)."""
    for cls in type(model).__mro__:
        if "forward" in vars(cls):
            known = cls.__module__.startswith("transformers.models.")
            return cls.__name__ if known else f"{cls.__module__}.{cls.__name__}"
    return type(model).__name__


@contextlib.contextmanager
def _capture_output(module: Any) -> Iterator[list]:
    """The outputs of ``module``'s forwards inside the block; the hook is removed on exit, also
    on an exception."""
    captured: list = []
    handle = module.register_forward_hook(lambda _module, _args, output: captured.append(output))
    try:
        yield captured
    finally:
        handle.remove()
