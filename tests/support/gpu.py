"""What the GPU tests share: the CUDA attention back-ends they sweep, skipped where not installed."""

from __future__ import annotations

import pytest

from packfeed.trainer.model.attention import VARLEN, select_attention

DEVICE = "cuda"
CUDA_BACKENDS = [VARLEN, "flash_attention_2", "flash_attention_4"]


def backend_or_skip(name: str) -> str:
    """``name`` as select_attention resolves it on the GPU; the test is skipped, saying why,
    when that back-end cannot run here (not installed, an older GPU)."""
    try:
        return select_attention(name, device=DEVICE)
    except RuntimeError as why:
        pytest.skip(str(why))
