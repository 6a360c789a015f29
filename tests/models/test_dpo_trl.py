"""packfeed's packed DPO loss equals TRL's ``DPOTrainer`` loss on the same pairs (CPU, fp32).

TRL tokenizes a standard preference dataset (prompt, chosen, rejected strings) and pads each
side into its own row (its padding-free mode is disabled in the installed TRL, see the README);
packfeed packs the same token ids, both sides of a pair in one row, several pairs a row. The
policy and the reference are tiny random Llamas of different seeds, so the loss is not ln 2.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("datasets")
pytest.importorskip("trl")

from packfeed.client.pair_logps import pair_segments  # noqa: E402
from packfeed.service.assets import demo_tokenizer_path  # noqa: E402
from packfeed.trainer.run_config import ModelConfig  # noqa: E402
from packfeed.trainer.objective.dpo import accumulate_dpo_gradients, dpo_micro_batch  # noqa: E402
from packfeed.trainer.objective.dpo_loss import LN2, DpoLoss  # noqa: E402
from packfeed.trainer.model.builder import build_model  # noqa: E402
from support.pair_rows import Pair, pack_pairs  # noqa: E402

EQUAL_LOSS = 1e-5  # measured: 4.6e-7 (sigmoid, loss 0.711), 8.3e-7 (ipo, 1.152): fp32 sums in another order
PAIRS = [
    ("The capital of France is", " Paris.", " a large dog that barks at night."),
    ("Two plus two equals", " four.", " five, or so I was told."),
    ("Name a colour:", " blue", " the number seven"),
    ("Translate 'chat' to English:", " cat", " It is a conversation between friends online."),
    ("Write a short greeting.", " Hello there, nice to meet you!", " No."),
    ("Is water wet?", " Yes, water makes things wet.", " Purple elephants."),
]


@pytest.mark.parametrize("loss", [DpoLoss(beta=0.1), DpoLoss(beta=0.5, loss_type="ipo")], ids=["sigmoid", "ipo"])
def test_packed_dpo_loss_equals_trl_dpo_trainer(loss, tmp_path):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(demo_tokenizer_path())
    config = ModelConfig(name="tiny-llama", attn="sdpa")
    policy = build_model(config, vocab_size=len(tokenizer), seed=0)
    reference = build_model(config, vocab_size=len(tokenizer), seed=1).eval().requires_grad_(False)
    ours_policy, ours_reference = copy.deepcopy(policy), copy.deepcopy(reference)  # TRL patches forward
    dataset = Dataset.from_list([{"prompt": p, "chosen": c, "rejected": r} for p, c, r in PAIRS])
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), per_device_train_batch_size=len(PAIRS), beta=loss.beta,
                     loss_type=[loss.loss_type], max_length=None, report_to=[], use_cpu=True, bf16=False,
                     dataloader_num_workers=0, seed=0)
    trainer = DPOTrainer(model=policy, ref_model=reference, args=args, train_dataset=dataset,
                         processing_class=tokenizer)

    examples = [trainer.train_dataset[i] for i in range(len(PAIRS))]
    trl_loss = float(trainer.compute_loss(trainer.model, trainer.data_collator(examples)).detach())

    pairs = [Pair(*(torch.tensor(e[key]).numpy() for key in ("prompt_ids", "chosen_ids", "rejected_ids")))
             for e in examples]
    longest = max(2 * len(p.prompt) + len(p.chosen) + len(p.rejected) for p in pairs)
    rows = pack_pairs(pairs, 2 * longest, pad_id=tokenizer.pad_token_id or 0)
    assert rows.num_rows < len(PAIRS), "rows must hold several pairs"
    assert len(pair_segments(rows.pair_roles, rows.sample_ids)[0]) == len(PAIRS)
    ours = accumulate_dpo_gradients(ours_policy, [dpo_micro_batch(rows)], reference=ours_reference, loss=loss)

    assert abs(ours.loss - trl_loss) < EQUAL_LOSS, f"packfeed {ours.loss!r} vs TRL {trl_loss!r}"
    # Not vacuous: policy == reference would give ln 2 (sigmoid) or 1 / (2 beta)^2 (ipo).
    assert abs(trl_loss - (LN2 if loss.loss_type == "sigmoid" else 1 / (2 * loss.beta) ** 2)) > 1e-3
