"""The DPO objective's loss of a batch of pairs (``DpoLoss``), from the pairs' log-probs.

Pure arithmetic on [P] tensors: trainer/objective/dpo.py computes the log-probs of packed pairs and
calls it; trainer/run_config.py validates ``[train] dpo_*`` by building one. The losses (``beta``
> 0; a side's log-ratio is ``logp_policy - logp_reference`` over its trained tokens; ``delta`` =
chosen log-ratio - rejected log-ratio): ``sigmoid`` (DPO; label smoothing eps > 0: conservative
DPO) ``-(1 - eps) logsigmoid(beta delta) - eps logsigmoid(-beta delta)``; ``ipo`` ``(delta per
token - 1 / (2 beta))^2``, each side's log-ratio divided by its trained tokens, as TRL does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

LOSS_TYPES = ("sigmoid", "ipo")
LN2 = math.log(2)  # the sigmoid loss of every pair while the policy equals its reference


@dataclass(frozen=True, kw_only=True)
class DpoLoss:
    """The objective's knobs (``[train] dpo_*``, validated by TrainConfig)."""

    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"dpo loss type must be one of {', '.join(LOSS_TYPES)}; got {self.loss_type!r}")
        if not self.beta > 0:
            raise ValueError(f"dpo beta must be > 0, got {self.beta!r}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"dpo label smoothing must be in [0, 0.5), got {self.label_smoothing!r}")
        if self.label_smoothing and self.loss_type != "sigmoid":
            raise ValueError("dpo label smoothing applies to the sigmoid loss only")

    def pair_losses(self, policy: Mapping[str, Any], reference: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        """(losses, chosen rewards, rejected rewards), each [P], from two ``pair_logps`` dicts
        of the same pairs (the reference's without gradients)."""
        import torch.nn.functional as F

        chosen_ratio = policy["chosen_logps"] - reference["chosen_logps"]
        rejected_ratio = policy["rejected_logps"] - reference["rejected_logps"]
        if self.loss_type == "sigmoid":
            logits = self.beta * (chosen_ratio - rejected_ratio)
            eps = self.label_smoothing
            losses = -(1 - eps) * F.logsigmoid(logits) - eps * F.logsigmoid(-logits)
        else:
            per_token = (chosen_ratio / policy["chosen_tokens"].clamp(min=1)
                         - rejected_ratio / policy["rejected_tokens"].clamp(min=1))
            losses = (per_token - 1 / (2 * self.beta)) ** 2
        return losses, self.beta * chosen_ratio.detach(), self.beta * rejected_ratio.detach()
