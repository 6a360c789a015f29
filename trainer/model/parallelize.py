"""How the model is laid over the ranks: activation checkpointing, then FSDP2 or DDP.

Applied in this order by the worker, each a short function of the model and one setting::

    model = build_model(...)                                        # trainer/model/builder.py
    apply_activation_checkpointing(model, "full")                   # each decoder layer
    model = apply_sharding(model, "fsdp", param_dtype=torch.bfloat16, device=device)

``fsdp`` (FSDP2, ``torch.distributed.fsdp.fully_shard``): each decoder layer is one group, the
root (embeddings, final norm, lm_head) another. A rank holds 1/world of every fp32 weight, its
gradient and its two AdamW moments (16 B per parameter / world); a group's weights are gathered
(in ``param_dtype``, e.g. bf16) just before its forward and again before its backward, and its
gradients reduce-scattered in fp32 after its backward. The root is not resharded after forward
(FSDP2's own rule), so the loss head (trainer/objective/loss_head.py) projects every chunk with a weight
gathered once per micro-batch. ``ddp``: every rank holds the whole model (16 B per parameter,
plus DDP's gradient buckets); gradients are all-reduced on the step's last micro-batch.

Activation checkpointing wraps each decoder layer (non-reentrant ``checkpoint_wrapper``) BEFORE
``fully_shard`` wraps it: the recompute in backward then runs the layer's inner forward, inside
the FSDP group's own backward gather, so no layer is gathered twice (tests/integration/train/
test_fsdp.py counts 2 x layers gathers per micro-batch with and without it). A layer then keeps
only its input for backward (layers x tokens x hidden) and recomputes the rest, one layer at a
time: about a third more compute for the layers. "offload" keeps those inputs in host memory
(pinned on a GPU machine) and copies them back in backward.

The state dict keys stay Hugging Face's (``checkpoint_wrapper`` strips its prefix on save and
adds it on load), so checkpoints and ``save_pretrained`` see the model as it was built.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def decoder_layers(model: Any) -> Any:
    """The ``nn.ModuleList`` of the model's decoder layers (``model.get_decoder().layers``);
    ValueError for a model laid out otherwise (one packfeed does not know how to shard)."""
    import torch.nn as nn

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ValueError(f"{type(model).__name__} has no decoder layers at get_decoder().layers: activation "
                         "checkpointing and FSDP wrap each decoder layer; train it with sharding = \"ddp\" and "
                         "activation_checkpointing = \"off\"")
    return layers


def apply_activation_checkpointing(model: Any, mode: str) -> None:
    """Wrap every decoder layer of ``model`` in place: ``mode`` "off" (nothing), "full" (the
    layer recomputes its activations in backward from its saved input) or "offload" (full, the
    saved input in host memory). Before ``apply_sharding``."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    if mode == "off":
        return
    if mode not in ("full", "offload"):
        raise ValueError(f"activation checkpointing must be off, full or offload; got {mode!r}")
    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        if mode == "full":
            layers[i] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        else:
            layers[i] = checkpoint_wrapper(layer, checkpoint_fn=_offloaded_checkpoint)


def _offloaded_checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
    """Non-reentrant checkpoint of ``function`` whose saved inputs go to host memory (pinned
    where CUDA is, so the copies overlap compute). What backward recomputes stays on the device."""
    import torch
    from torch.utils.checkpoint import checkpoint

    with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()):
        return checkpoint(function, *args, use_reentrant=False, **kwargs)


def apply_fsdp(model: Any, *, param_dtype: Any = None) -> Any:
    """``fully_shard`` each decoder layer, then the root, over every rank of the default
    process group; in place, returns ``model``. ``param_dtype``: the dtype layers compute in
    (None: the weights' fp32); gradients always reduce in fp32. The last layer keeps its
    gathered weights after forward: backward needs them first."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        fully_shard(layer, mp_policy=policy, reshard_after_forward=i < len(layers) - 1)
    fully_shard(model, mp_policy=policy)
    return model


def apply_sharding(model: Any, sharding: str, *, param_dtype: Any = None, device: Any = None) -> Any:
    """The model to train: ``sharding`` "fsdp" (``apply_fsdp``, in place) or "ddp" (wrapped in
    ``DistributedDataParallel`` when the process group has more than one rank; alone, the model
    itself). ``param_dtype`` applies to fsdp (ddp computes under autocast instead)."""
    import torch.distributed as dist

    if sharding == "fsdp":
        if not dist.is_initialized():
            raise ValueError("sharding = \"fsdp\" needs torch.distributed initialised (Ray Train or torchrun does it)")
        return apply_fsdp(model, param_dtype=param_dtype)
    if sharding != "ddp":
        raise ValueError(f"sharding must be ddp or fsdp; got {sharding!r}")
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device is not None and device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def unwrapped(model: Any) -> Any:
    """The Hugging Face model inside a DDP wrapper (FSDP2 wraps in place: the model itself)."""
    return getattr(model, "module", model)


def is_sharded(model: Any) -> bool:
    """Whether ``model`` was laid out by ``apply_fsdp``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def local_bytes(tensors: Any) -> int:
    """Bytes of ``tensors`` this rank holds: a sharded parameter's (DTensor's) local shard."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def memory_figures(model: Any, optimizer: Any, device: Any) -> dict[str, int]:
    """This rank's memory: ``peak_bytes`` (CUDA's max allocated on a GPU; the process's peak RSS
    on CPU), and the bytes it holds of the parameters, their gradients and the optimizer's
    states (a sharded model's local shards)."""
    import resource

    import torch

    params = list(model.parameters())
    states = [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    if device is not None and device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"peak_bytes": int(peak), "param_bytes": local_bytes(params),
            "grad_bytes": local_bytes(p.grad for p in params), "optimizer_bytes": local_bytes(states)}
