"""The loss per source (trainer/objective/step.py ``loss_figures``, ``source_tokens``) and the
pieces of held-out evaluation that need no process group (trainer/loop/evaluate.py,
trainer/loop/interval.py).

A tiny random Llama, float32 on CPU, on rows built by the real packer with samples of three
sources laid out as a stream's source table lays them (sample ids 0..3 source 0, 4..8 source 1,
9.. source 2), over a sweep of seeds and both loss paths (full logits, chunked head):

* every token is attributed to its own sample's source: a source's summed loss equals the loss
  sum of the same rows with every other source's labels masked (computed independently);
* the per-source sums and counts add up to the micro-batch's loss sum and trained tokens;
* ``accumulate_gradients`` with token sources leaves the gradients of the plain step.

Then the records: an interval's ``source_loss`` weighted by ``source_tokens`` is the token mean
of its steps; eval-only records stay out of the training summary; the best eval step is the
lowest loss; ``[eval]`` keys are checked; rows past ``max_rows`` count for nothing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.model_batch import packed_prompt_rows  # noqa: E402
from support.torch_ranks import one_torch_thread  # noqa: E402

from packfeed.client.model_inputs import to_model_inputs  # noqa: E402
from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID  # noqa: E402
from packfeed.trainer.loop.evaluate import EvalConfig, _first_rows, eval_record  # noqa: E402
from packfeed.trainer.loop.interval import MetricsWindow, summarize  # noqa: E402
from packfeed.trainer.model.builder import build_model  # noqa: E402
from packfeed.trainer.objective.step import accumulate_gradients, loss_figures, source_tokens  # noqa: E402
from packfeed.trainer.run_config import ModelConfig  # noqa: E402

VOCAB, SEQ_LEN = 96, 40
FIRST_IDS = [0, 4, 9]  # the source table: source s holds sample ids [FIRST_IDS[s], FIRST_IDS[s + 1])


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def model():
    return build_model(ModelConfig(name="tiny-llama", attn="sdpa"), vocab_size=VOCAB, seed=0)


def packed_rows(seed: int):
    """Rows of 14 samples (ids 0..13: sources 0, 1, 2 by ``FIRST_IDS``) of 2..18 tokens, every
    third with its first half masked as a prompt, padding at the rows' ends."""
    rows = packed_prompt_rows(seed, samples=14, max_len=18, seq_len=SEQ_LEN, vocab=VOCAB)
    assert (rows.sample_ids == PAD_SAMPLE_ID).any() and max(np.diff(rows.segment_splits)) >= 3
    return rows


def test_source_tokens_repeats_each_segments_source_over_its_tokens():
    rows = packed_rows(0)
    sources = source_tokens(rows, FIRST_IDS)
    assert sources.shape == rows.input_ids.shape
    for r in range(rows.num_rows):
        start = 0
        for length, sid in zip(rows.row_seq_lens(r), rows.row_sample_ids(r)):
            expected = -1 if sid == PAD_SAMPLE_ID else int(np.searchsorted(FIRST_IDS, sid, side="right") - 1)
            assert (sources[r, start:start + length] == expected).all()
            start += int(length)
    assert set(np.unique(sources)) == {-1, 0, 1, 2}, "every source and padding appear: the sweep is not vacuous"


@pytest.mark.parametrize("chunk_tokens", [0, 7])
@pytest.mark.parametrize("seed", range(4))
def test_each_source_gets_the_loss_of_its_own_tokens(model, seed, chunk_tokens):
    rows = packed_rows(seed)
    sources = torch.from_numpy(source_tokens(rows, FIRST_IDS))
    with torch.no_grad():
        loss_sum, figures = loss_figures(model, to_model_inputs(rows), chunk_tokens=chunk_tokens,
                                         token_sources=sources, num_sources=3)
        total, tokens, sums, counts = figures[0], figures[1], figures[2:5], figures[5:8]
        assert float(total) == pytest.approx(float(loss_sum), rel=1e-6)  # float64 of float32 losses
        assert float(sums.sum()) == pytest.approx(float(total), rel=1e-12)
        assert int(counts.sum()) == int(tokens) == int((rows.labels[:, 1:] != IGNORE_INDEX).sum())
        for s in range(3):
            labels = rows.labels.copy()
            labels[source_tokens(rows, FIRST_IDS) != s] = IGNORE_INDEX  # only source s's targets trained
            alone = rows.__class__(**{**rows.__dict__, "labels": labels})
            _, own = loss_figures(model, to_model_inputs(alone), chunk_tokens=chunk_tokens)
            assert float(sums[s]) == pytest.approx(float(own[0]), rel=1e-5)
            assert int(counts[s]) == int(own[1]) > 0


def test_token_sources_leave_the_step_unchanged(model):
    micro = [packed_rows(1), packed_rows(2)]
    inputs = [to_model_inputs(r) for r in micro]

    def grads(**kwargs):
        model.zero_grad(set_to_none=True)
        result = accumulate_gradients(model, inputs, chunk_tokens=0, **kwargs)
        out = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return result, out

    plain, plain_grads = grads()
    split, split_grads = grads(token_sources=[torch.from_numpy(source_tokens(r, FIRST_IDS)) for r in micro],
                               num_sources=3)
    assert plain.source_tokens == () and len(split.source_tokens) == 3
    assert split.loss == plain.loss and sum(split.source_tokens) == plain.trained_tokens
    assert sum(split.source_sums) / plain.trained_tokens == pytest.approx(plain.loss, rel=1e-6)  # float64 sums of float32 losses
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, split_grads))


def test_an_intervals_source_losses_weighted_by_tokens_give_its_token_mean():
    rng = np.random.default_rng(3)
    window, sums, tokens = MetricsWindow(), np.zeros(3), np.zeros(3, dtype=np.int64)
    for _ in range(5):
        step_sums, step_tokens = rng.uniform(0, 50, 3), rng.integers(0, 20, 3)
        step_sums[step_tokens == 0] = 0.0
        window.add(loss=1.0, real_tokens=10, slots=20, data_wait=0.0, source_sums=tuple(step_sums),
                   source_tokens=tuple(int(t) for t in step_tokens))
        sums, tokens = sums + step_sums, tokens + step_tokens
    record = window.close(step=5, lr=1e-3, world_totals=(50, 100), flops_per_token=1.0, peak_flops_total=None,
                          sources=["a", "b", "c"])
    assert record["source_tokens"] == dict(zip("abc", tokens.tolist()))
    weighted = sum(record["source_loss"][n] * record["source_tokens"][n] for n in record["source_loss"])
    assert weighted / tokens.sum() == pytest.approx(sums.sum() / tokens.sum(), rel=1e-12)
    assert set(record["source_loss"]) == {n for n, t in zip("abc", tokens) if t}


def test_eval_records_give_the_last_and_the_best_and_stay_out_of_the_training_figures():
    def interval(step, loss):
        return {"step": step, "loss": loss, "lr": 1e-3, "tokens_per_s": 100.0, "fill": 0.9, "data_wait": 0.0,
                "seconds": 1.0}

    evaluated = {2: 3.0, 4: 2.5, 6: 2.7}
    records = [interval(s, 5.0 - s / 2) for s in range(1, 7)]
    for record in records:
        if record["step"] in evaluated:
            record["eval"] = eval_record([evaluated[record["step"]] * 10, 10, 0, 0], names=["held"])
    records.append({"step": 6, "time": 0.0, "eval": eval_record([26.0, 10, 0, 0], names=["held"])})
    summary = summarize(records)
    assert summary["steps"] == 6 and summary["last_loss"] == records[5]["loss"]
    assert summary["eval"]["best_step"] == 4 and summary["eval"]["best_loss"] == 2.5
    assert summary["eval"]["last_step"] == 6 and summary["eval"]["last_loss"] == pytest.approx(2.6)
    assert "eval" not in summarize([interval(1, 3.0)])


def test_eval_record_sources_add_up_and_an_empty_eval_set_is_nan():
    record = eval_record([30.0, 12, 10.0, 20.0, 4, 8], names=["x", "y"])
    assert record["loss"] == 2.5 and record["tokens"] == 12
    assert record["source_loss"] == {"x": 2.5, "y": 2.5} and record["source_tokens"] == {"x": 4, "y": 8}
    assert math.isnan(eval_record([0.0, 0], names=[])["loss"])


@pytest.mark.parametrize("bad", [{"packed": ""}, {"packed": "d", "every_steps": -1}, {"packed": "d", "max_rows": 1.5},
                                 {"packed": "d", "every_steps": True}])
def test_eval_keys_are_checked(bad):
    with pytest.raises(ValueError, match=r"\[eval\]"):
        EvalConfig(**bad)


def test_eval_is_due_every_n_steps_and_at_the_last():
    config = EvalConfig(packed="d", every_steps=3)
    assert [s for s in range(1, 11) if config.due(s, 10)] == [3, 6, 9, 10]
    assert [s for s in range(1, 11) if EvalConfig(packed="d").due(s, 10)] == [10]


def test_rows_past_max_rows_count_for_nothing():
    rows = packed_rows(0)
    rows = rows.__class__(**{**rows.__dict__, "row_index": np.arange(10, 10 + rows.num_rows)})
    kept = _first_rows(rows, 12)
    assert (kept.labels[:2] == rows.labels[:2]).all() and (kept.labels[2:] == IGNORE_INDEX).all()
    assert _first_rows(rows, 0) is rows and _first_rows(rows, 100) is rows


# ---- evaluate(): the objective's own figures, without gradients (single process) ----------------

def test_sft_evaluation_gives_the_steps_token_mean_per_source_and_leaves_the_model_training(model):
    from packfeed.trainer.loop.evaluate import EvalSet, evaluate, sft_objective

    rows = [packed_rows(4), packed_rows(5)]
    step = accumulate_gradients(model, [to_model_inputs(r) for r in rows], chunk_tokens=0, num_sources=3,
                                token_sources=[torch.from_numpy(source_tokens(r, FIRST_IDS)) for r in rows])
    model.zero_grad(set_to_none=True)
    sources = [("a", 0), ("b", 4), ("c", 9)]
    for chunk in (0, 5):
        record = evaluate(model, EvalSet(batches=rows, sources=sources),
                          sft_objective(model, chunk_tokens=chunk, first_ids=FIRST_IDS), device=torch.device("cpu"))
        assert record["loss"] == pytest.approx(step.loss, rel=1e-6) and record["tokens"] == step.trained_tokens
        assert record["source_tokens"] == dict(zip("abc", step.source_tokens))
        assert [record["source_loss"][n] for n in "abc"] == pytest.approx(
            [s / t for s, t in zip(step.source_sums, step.source_tokens)], rel=1e-6)
        assert model.training and all(p.grad is None for p in model.parameters()), "no gradient, mode restored"


def test_dpo_evaluation_gives_the_steps_pair_means():
    from support.pair_rows import pack_pairs, random_pairs

    from packfeed.trainer.loop.evaluate import EvalSet, evaluate
    from packfeed.trainer.objective.dpo import accumulate_dpo_gradients, dpo_micro_batch, dpo_objective
    from packfeed.trainer.objective.dpo_loss import DpoLoss

    policy = build_model(ModelConfig(name="tiny-llama", attn="sdpa"), vocab_size=VOCAB, seed=1)
    reference = build_model(ModelConfig(name="tiny-llama", attn="sdpa"), vocab_size=VOCAB, seed=2).eval()
    rows = [pack_pairs(random_pairs(seed, 4, VOCAB), 64) for seed in (0, 1)]
    loss = DpoLoss(beta=0.1)
    step = accumulate_dpo_gradients(policy, [dpo_micro_batch(r) for r in rows], reference=reference, loss=loss)
    policy.zero_grad(set_to_none=True)
    record = evaluate(policy, EvalSet(batches=rows, sources=[]),
                      dpo_objective(policy, reference=reference, loss=loss, chunk_tokens=0), device=torch.device("cpu"))
    assert record["pairs"] == step.pairs == 8 and record["tokens"] == step.trained_tokens
    assert record["loss"] == pytest.approx(step.loss, rel=1e-6)
    assert record["reward_margin"] == pytest.approx(step.rewards["margin"], rel=1e-6, abs=1e-9)
    assert record["reward_accuracy"] == step.rewards["accuracy"]
    empty = evaluate(policy, EvalSet(batches=[packed_rows(0)], sources=[]),
                     dpo_objective(policy, reference=reference, loss=loss, chunk_tokens=0), device=torch.device("cpu"))
    assert empty["pairs"] == 0 and math.isnan(empty["loss"]), "no pair: no loss, not 0"
