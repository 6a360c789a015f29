"""Packed preference pairs on real transformers models: log-probs, DPO loss and gradients equal
each pair run alone.

Tiny random-weight models of several families, fp32 on CPU. Rows of L=40 hold up to 3 pairs each
(prompt + chosen, prompt + rejected side by side), plain samples and padding tails; the
unpacked side runs every sequence alone through the model and sums its label log-probs in a
plain Python loop, and computes the DPO losses from the papers' formulas, one pair at a time.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from packfeed.client.model_inputs import to_model_inputs  # noqa: E402
from packfeed.client.pair_logps import pair_segments, segment_logps  # noqa: E402
from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, check_rows, select_rows  # noqa: E402
from packfeed.trainer.objective.dpo import accumulate_dpo_gradients, dpo_micro_batch  # noqa: E402
from packfeed.trainer.objective.dpo_loss import LN2, DpoLoss  # noqa: E402
from packfeed.trainer.model.tiny import TINY_FAMILIES, tiny_config  # noqa: E402
from support.compare import relative_error  # noqa: E402
from support.pair_rows import alone_logps, pack_pairs, random_pairs, segments_of, unpacked_dpo_loss  # noqa: E402

VOCAB, SEQ_LEN, NUM_PAIRS = 96, 40, 10
EQUAL_LOGPS = 1e-4  # the bound; measured <= 4e-6 (sums of ~10 log-probs of ~-4.6)
EQUAL_GRADS = 1e-4  # relative; measured <= 2e-6
LOSSES = {
    "sigmoid": DpoLoss(beta=0.1),
    "sigmoid-label-smoothing": DpoLoss(beta=0.5, label_smoothing=0.2),
    "ipo": DpoLoss(beta=0.3, loss_type="ipo"),
}


def tiny_model(family: str, seed: int, attn: str = "sdpa"):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(family, VOCAB), attn_implementation=attn).eval()


def batch():
    pairs = random_pairs(3, NUM_PAIRS, VOCAB)
    plain = [np.random.default_rng(4).integers(3, VOCAB, size=n) for n in (1, 5, 12)]
    rows = pack_pairs(pairs, SEQ_LEN, plain=plain)
    check_rows(rows, SEQ_LEN)
    # Not vacuous: rows hold several pairs, a pair away from the row start, plain samples, padding.
    chosen, _ = pair_segments(rows.pair_roles, rows.sample_ids, rows.segment_splits)
    pairs_per_row = np.bincount(np.searchsorted(rows.segment_splits, chosen, side="right") - 1)
    assert len(chosen) == NUM_PAIRS and pairs_per_row.max() >= 2
    assert not np.isin(chosen, rows.segment_splits[:-1]).all()
    assert (rows.sample_ids >= NUM_PAIRS).sum() == len(plain) and (rows.sample_ids == PAD_SAMPLE_ID).any()
    return pairs, rows


def grads_of(model) -> dict:
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_packed_segment_logps_equal_each_sequence_alone(family, attn):
    model = tiny_model(family, 0, attn)
    pairs, rows = batch()
    inputs = to_model_inputs(rows)
    with torch.no_grad():
        logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits
        sums, counts = segment_logps(logits, inputs["labels"], inputs["cu_seq_lens_q"])
        worst = 0.0
        for s, sid, ids, labels in segments_of(rows):
            if sid == PAD_SAMPLE_ID:
                assert (float(sums[s]), int(counts[s])) == (0.0, 0)
                continue
            alone, n = alone_logps(model, ids, labels)
            assert int(counts[s]) == n == int((labels != IGNORE_INDEX).sum())
            worst = max(worst, abs(float(sums[s]) - float(alone)))
    assert worst <= EQUAL_LOGPS, f"{family}/{attn}: packed log-probs differ from alone by {worst:.2e}"


@pytest.mark.parametrize("loss_name", list(LOSSES))
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma", "phi3"])
def test_packed_dpo_loss_and_gradients_equal_unpacked(family, loss_name):
    loss = LOSSES[loss_name]
    policy, reference = tiny_model(family, 0), tiny_model(family, 1).requires_grad_(False)
    pairs, rows = batch()

    expected = unpacked_dpo_loss(policy, reference, pairs, loss)
    expected.backward()
    expected_grads = grads_of(policy)
    value = float(expected.detach())
    assert value > 0 and abs(value - LN2) > 1e-3, "policy and reference must differ"

    one = accumulate_dpo_gradients(policy, [dpo_micro_batch(rows)], reference=reference, loss=loss)
    assert one.pairs == NUM_PAIRS
    assert one.loss == pytest.approx(value, rel=1e-5)
    assert relative_error(grads_of(policy), expected_grads) < EQUAL_GRADS

    # Two micro-batches of unequal pair counts: the mean is still over the step's pairs.
    halves = [select_rows(rows, [0]), select_rows(rows, range(1, rows.num_rows))]
    split = accumulate_dpo_gradients(policy, [dpo_micro_batch(h) for h in halves], reference=reference, loss=loss)
    assert split.loss == pytest.approx(value, rel=1e-5)
    assert relative_error(grads_of(policy), expected_grads) < EQUAL_GRADS

    # Negative control: the mean of the two micro-batches' own pair means is another gradient.
    for h in halves:
        accumulate_dpo_gradients(policy, [dpo_micro_batch(h)], reference=reference, loss=loss)
    assert relative_error({n: g / 2 for n, g in grads_of(policy).items()}, expected_grads) > 1e-3


@pytest.mark.parametrize("family", ["llama", "olmo2"])
def test_policy_equal_to_reference_starts_at_ln2(family):
    policy, reference = tiny_model(family, 0), tiny_model(family, 0).requires_grad_(False)
    _, rows = batch()
    result = accumulate_dpo_gradients(policy, [dpo_micro_batch(rows)], reference=reference, loss=DpoLoss(beta=0.1))
    assert result.loss == pytest.approx(math.log(2), abs=1e-6)
    assert result.rewards["margin"] == pytest.approx(0, abs=1e-6) and result.rewards["accuracy"] == 0
    # The gradient is not zero: it raises the chosen side and lowers the rejected one.
    assert max(float(p.grad.abs().max()) for p in policy.parameters()) > 1e-6


def test_reference_is_the_initial_weights_or_the_named_model(tmp_path):
    from packfeed.trainer.run_config import ModelConfig
    from packfeed.trainer.objective.dpo import build_reference
    from packfeed.trainer.model.builder import build_model

    config = ModelConfig(name="tiny-qwen3", attn="sdpa")
    policy = build_model(config, vocab_size=VOCAB, seed=5)
    initial = {n: t.clone() for n, t in policy.state_dict().items()}
    with torch.no_grad():  # the policy trains on; "initial" still means the weights it started from
        next(policy.parameters()).add_(1.0)
    reference = build_reference(config, "initial", vocab_size=VOCAB, device="cpu", seed=5)
    assert not reference.training and not any(p.requires_grad for p in reference.parameters())
    assert all(torch.equal(t, initial[n]) for n, t in reference.state_dict().items())

    policy.save_pretrained(tmp_path / "sft")
    named = build_reference(config, str(tmp_path / "sft"), vocab_size=VOCAB, device="cpu", seed=0)
    assert all(torch.equal(t, policy.state_dict()[n]) for n, t in named.state_dict().items())
    assert named.config._attn_implementation == "sdpa"
