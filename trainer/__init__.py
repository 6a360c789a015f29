"""packfeed.trainer: training on packed rows with block-causal attention.

Attention back-end selection (flash-attn 2/4, PyTorch's varlen kernel, SDPA/eager on CPU) and
tiny random model configs for demos and tests; the step (token mean over the whole optimizer
step; DPO's pair mean on packed preference pairs, ``dpo``), the RowFeeder step plan and the Ray
Train driver (``train``).
"""

from packfeed.trainer.attention import (
    ATTENTION_CHOICES,
    VARLEN,
    register_varlen_attention,
    select_attention,
    varlen_attention_forward,
)
from packfeed.trainer.config import ModelConfig, RunConfig, TrainConfig, TrainScaling
from packfeed.trainer.dpo import DpoLoss, accumulate_dpo_gradients, dpo_micro_batch
from packfeed.trainer.hf import PackedCollator, packed_hf_dataset
from packfeed.trainer.model import build_model
from packfeed.trainer.run import train
from packfeed.trainer.step import accumulate_gradients, train_step
from packfeed.trainer.tiny_models import TINY_FAMILIES, tiny_config

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
    "dpo_micro_batch",
    "build_model",
    "packed_hf_dataset",
    "train",
    "train_step",
    "TINY_FAMILIES",
    "VARLEN",
    "register_varlen_attention",
    "select_attention",
    "tiny_config",
    "varlen_attention_forward",
]
