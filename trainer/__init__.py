"""packfeed.trainer: training on packed rows with block-causal attention.

Attention back-end selection (flash-attn 2/4, PyTorch's varlen kernel, SDPA/eager on CPU) and
tiny random model configs for demos and tests. The Ray Train loop builds on these.
"""

from packfeed.trainer.attention import (
    ATTENTION_CHOICES,
    VARLEN,
    register_varlen_attention,
    select_attention,
    varlen_attention_forward,
)
from packfeed.trainer.tiny_models import TINY_FAMILIES, tiny_config

__all__ = [
    "ATTENTION_CHOICES",
    "TINY_FAMILIES",
    "VARLEN",
    "register_varlen_attention",
    "select_attention",
    "tiny_config",
    "varlen_attention_forward",
]
