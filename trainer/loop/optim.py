"""AdamW with linear warmup and cosine decay.

``build_optimizer(model, train)`` returns ``(optimizer, scheduler)``; call ``scheduler.step()``
once per optimizer step. Weight decay applies to matrices only (not to biases, norms or other
1-D parameters).

Worked example, lr 1e-3, warmup 2, max_steps 6, min_lr_ratio 0.1: the lrs of steps 0..5 are
5e-4, 1e-3, then the cosine 1e-3, 8.68e-4, 5.5e-4, 2.32e-4, towards 1e-4 at step 6.
"""

from __future__ import annotations

import math
from typing import Any

from packfeed.trainer.run_config import TrainConfig


def lr_factor(step: int, *, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step ``step`` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: Any, train: TrainConfig) -> tuple[Any, Any]:
    import torch

    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=train.lr,
        betas=train.betas,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(
            step, warmup_steps=train.warmup_steps, max_steps=train.max_steps, min_lr_ratio=train.min_lr_ratio
        ),
    )
    return optimizer, scheduler
