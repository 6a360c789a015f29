"""packfeed.trainer: training on packed rows with block-causal attention.

Attention back-end selection (flash-attn 2/4, PyTorch's varlen kernel, SDPA/eager on CPU) and
tiny random model configs for demos and tests; the model's layout over the ranks (activation
checkpointing, FSDP2 or DDP: ``parallelize``); the step (token mean over the whole optimizer
step through the chunked loss head, ``trained_token_logps``; DPO's pair mean on packed
preference pairs, ``dpo``); the memory plan (``plan_memory``); the Ray Train driver
(``train``) and the torchrun one (``train_torchrun``).
"""

from packfeed.trainer.model.attention import (
    ATTENTION_CHOICES,
    VARLEN,
    register_varlen_attention,
    select_attention,
    varlen_attention_forward,
)
from packfeed.trainer.run_config import ModelConfig, RunConfig, TrainConfig, TrainScaling
from packfeed.trainer.objective.dpo import accumulate_dpo_gradients, dpo_micro_batch
from packfeed.trainer.objective.dpo_loss import DpoLoss
from packfeed.trainer.hf import PackedCollator, packed_hf_dataset
from packfeed.trainer.objective.loss_head import trained_token_logps
from packfeed.trainer.model.memory_plan import plan_memory
from packfeed.trainer.model.builder import build_model
from packfeed.trainer.model.parallelize import apply_activation_checkpointing, apply_fsdp, apply_sharding
from packfeed.trainer.launch.ray_driver import train
from packfeed.trainer.objective.step import accumulate_gradients, train_step
from packfeed.trainer.launch.torchrun import train_torchrun
from packfeed.trainer.model.tiny import TINY_FAMILIES, tiny_config

__all__ = [
    "ATTENTION_CHOICES",
    "DpoLoss",
    "ModelConfig",
    "PackedCollator",
    "RunConfig",
    "TrainConfig",
    "TrainScaling",
    "accumulate_dpo_gradients",
    "accumulate_gradients",
    "apply_activation_checkpointing",
    "apply_fsdp",
    "apply_sharding",
    "dpo_micro_batch",
    "build_model",
    "packed_hf_dataset",
    "plan_memory",
    "train",
    "train_step",
    "train_torchrun",
    "trained_token_logps",
    "TINY_FAMILIES",
    "VARLEN",
    "register_varlen_attention",
    "select_attention",
    "tiny_config",
    "varlen_attention_forward",
]
