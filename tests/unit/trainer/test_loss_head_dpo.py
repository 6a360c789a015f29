"""The loss head for DPO: per-segment log-prob sums from the chunked head equal segment_logps's
from the full logits, and a DPO step with a chunked policy and reference equals the full
logits'. The tiny models and helpers (and the one-thread fixture) are test_loss_head.py's."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from packfeed.client.pair_logps import segment_logps, segment_sums  # noqa: E402
from packfeed.client.rows import select_rows  # noqa: E402
from packfeed.trainer.objective.dpo import accumulate_dpo_gradients, batch_pair_logps, dpo_micro_batch  # noqa: E402
from packfeed.trainer.objective.dpo_loss import DpoLoss  # noqa: E402
from packfeed.trainer.objective.loss_head import (  # noqa: E402
    NON_MODEL_KEYS,
    trained_token_logps,
)
from support.compare import relative_error  # noqa: E402
from support.pair_rows import pack_pairs, random_pairs  # noqa: E402
from test_loss_head import (  # noqa: E402
    EQUAL,
    EQUAL_ONE_TOKEN_CHUNKS,
    NOISE_FLOOR,
    VOCAB,
    one_thread,  # noqa: F401 - the module's autouse fixture: one torch thread
    tiny_model,
)


# DPO: per-segment sums from the head equal segment_logps's from the full logits.


def test_segment_sums_golden_case_and_the_row_convention():
    """cu [0, 3, 6]: slots [0, 1, 3] go to segments [0, 0, 1]; slot 2 would predict segment 1's first label."""
    logps = torch.tensor([-1.0, -2.0, -4.0])
    sums, counts = segment_sums(logps, torch.tensor([0, 1, 3]), torch.tensor([0, 3, 6]))
    assert sums.tolist() == [-3.0, -4.0] and counts.tolist() == [2, 1]
    with pytest.raises(ValueError, match="the first label of every segment"):
        segment_sums(logps, torch.tensor([0, 2, 3]), torch.tensor([0, 3, 6]))
    with pytest.raises(ValueError, match="slots"):
        segment_sums(logps, torch.tensor([0, 1, 5]), torch.tensor([0, 3, 6]))


@pytest.mark.parametrize("forward_class", ["LlamaForCausalLM", "GemmaForCausalLM", "Phi3ForCausalLM",
                                           "Gemma2ForCausalLM"])
def test_chunked_pair_logps_equal_the_full_logits(forward_class):
    model = tiny_model(forward_class)
    rows = pack_pairs(random_pairs(3, 8, VOCAB), 40, plain=[np.arange(3, 15)])
    inputs = dpo_micro_batch(rows)
    assert len(inputs["chosen_segments"]) == 8 and inputs["input_ids"].shape[0] > 1
    weights = torch.linspace(-1, 1, 8)

    def run(chunk):
        out = batch_pair_logps(model, inputs, chunk_tokens=chunk)
        ((out["chosen_logps"] - 2 * out["rejected_logps"]) * weights).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return {k: v.detach() for k, v in out.items()}, grads

    full, full_grads = run(0)
    with torch.no_grad():  # segment_logps itself, for every segment (plain samples and padding too)
        logits = model(**{k: v for k, v in inputs.items() if k not in NON_MODEL_KEYS}).logits
        all_sums, all_counts = segment_logps(logits, inputs["labels"], inputs["cu_seq_lens_q"])
        logps, slots = trained_token_logps(model, inputs, chunk_tokens=5)
        head_sums, head_counts = segment_sums(logps, slots, inputs["cu_seq_lens_q"])
    assert head_counts.tolist() == all_counts.tolist() and (all_counts == 0).any()
    torch.testing.assert_close(head_sums, all_sums, rtol=EQUAL, atol=0)
    for chunk in (1, 5, 1000):
        out, grads = run(chunk)
        for key in ("chosen_tokens", "rejected_tokens"):
            assert out[key].tolist() == full[key].tolist()
        for key in ("chosen_logps", "rejected_logps"):
            torch.testing.assert_close(out[key], full[key], rtol=EQUAL, atol=0)
        error = relative_error(grads, full_grads, noise_floor=NOISE_FLOOR)
        assert error < (EQUAL_ONE_TOKEN_CHUNKS if chunk == 1 else EQUAL), chunk
    # Negative control: the same token log-probs bucketed one slot off land in other segments.
    with pytest.raises(ValueError):
        segment_sums(logps, slots + 1, inputs["cu_seq_lens_q"])


def test_dpo_step_with_a_chunked_policy_and_reference_equals_the_full_logits():
    policy = tiny_model("Qwen3ForCausalLM", seed=0)
    reference = tiny_model("Qwen3ForCausalLM", seed=1).eval().requires_grad_(False)
    rows = pack_pairs(random_pairs(5, 6, VOCAB), 40)
    micro = [dpo_micro_batch(select_rows(rows, [i])) for i in range(rows.num_rows)]
    results, grads = [], []
    for chunk in (0, 4):
        results.append(accumulate_dpo_gradients(policy, micro, reference=reference, loss=DpoLoss(beta=0.5),
                                                chunk_tokens=chunk))
        grads.append({n: p.grad.clone() for n, p in policy.named_parameters()})
        policy.zero_grad(set_to_none=True)
    assert results[0].pairs == results[1].pairs == 6
    assert results[1].loss == pytest.approx(results[0].loss, rel=EQUAL)
    assert results[1].rewards == pytest.approx(results[0].rewards, rel=1e-5, abs=1e-7)
    assert relative_error(grads[1], grads[0], noise_floor=NOISE_FLOOR) < EQUAL


# Memory: what the chunked path keeps for backward.
