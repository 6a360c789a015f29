"""The DPO objective's settings, loss formulas and metrics (no model: trainer/objective/dpo.py's arithmetic)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from packfeed.trainer.run_config import RunConfig, TrainConfig  # noqa: E402
from packfeed.trainer.objective.dpo_loss import LN2, DpoLoss  # noqa: E402
from packfeed.trainer.loop.interval import MetricsWindow, progress_line, summarize  # noqa: E402


def test_sft_stays_the_default_and_dpo_settings_round_trip():
    assert TrainConfig().objective == "sft"
    train = TrainConfig(objective="dpo", dpo_beta=0.2, dpo_loss_type="ipo", dpo_reference="/models/sft")
    assert train.dpo_loss == DpoLoss(beta=0.2, loss_type="ipo")
    run = RunConfig.from_dict({"model": {"name": "tiny-llama"}, "data": {"inputs": ["x.jsonl"], "tokenizer": "t", "seq_len": 64},
                               "train": {"objective": "dpo", "dpo_label_smoothing": 0.1}})
    assert RunConfig.from_dict(run.to_dict()) == run and run.train.dpo_loss.label_smoothing == 0.1
    with pytest.raises(ValueError, match="loss = \"all\" \\(source\\(s\\) x\\) labels the prompts too"):
        RunConfig.from_dict({**run.to_dict(), "data": {**run.to_dict()["data"], "loss": "all"}})


@pytest.mark.parametrize("kwargs, match", [
    pytest.param({"objective": "ppo"}, "objective must be one of sft, dpo", id="unknown-objective"),
    pytest.param({"dpo_beta": 0.5}, "dpo_beta: for objective = \"dpo\" only", id="dpo-key-with-sft"),
    pytest.param({"objective": "dpo", "dpo_beta": 0}, "beta must be > 0", id="beta-zero"),
    pytest.param({"objective": "dpo", "dpo_beta": "high"}, "dpo_beta must be a finite number", id="beta-text"),
    pytest.param({"objective": "dpo", "dpo_loss_type": "hinge"}, "sigmoid, ipo", id="unknown-loss"),
    pytest.param({"objective": "dpo", "dpo_label_smoothing": 0.5}, "in \\[0, 0.5\\)", id="smoothing-half"),
    pytest.param({"objective": "dpo", "dpo_loss_type": "ipo", "dpo_label_smoothing": 0.1}, "sigmoid loss only",
                 id="smoothing-with-ipo"),
    pytest.param({"objective": "dpo", "dpo_reference": ""}, "dpo_reference must be", id="empty-reference"),
])
def test_bad_dpo_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def sides(chosen, rejected, ref_chosen, ref_rejected, chosen_tokens=(1,), rejected_tokens=(1,)):
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    policy = {"chosen_logps": t(chosen), "rejected_logps": t(rejected),
              "chosen_tokens": torch.tensor(chosen_tokens), "rejected_tokens": torch.tensor(rejected_tokens)}
    return policy, {"chosen_logps": t(ref_chosen), "rejected_logps": t(ref_rejected)}


@pytest.mark.parametrize("loss, policy_reference, expected", [
    pytest.param(DpoLoss(beta=0.1), sides([-5.0], [-7.0], [-5.0], [-7.0]), LN2, id="sigmoid-at-reference"),
    # delta = (-4 - -5) - (-8 - -7) = 2; beta 0.5: -log sigmoid(1)
    pytest.param(DpoLoss(beta=0.5), sides([-4.0], [-8.0], [-5.0], [-7.0]), math.log1p(math.exp(-1)), id="sigmoid"),
    pytest.param(DpoLoss(beta=0.5, label_smoothing=0.25), sides([-4.0], [-8.0], [-5.0], [-7.0]),
                 0.75 * math.log1p(math.exp(-1)) + 0.25 * math.log1p(math.exp(1)), id="sigmoid-smoothed"),
    # per token: 1 / 2 - (-1) / 4 = 0.75; (0.75 - 1 / (2 * 0.5))^2 = 0.0625
    pytest.param(DpoLoss(beta=0.5, loss_type="ipo"), sides([-4.0], [-8.0], [-5.0], [-7.0], (2,), (4,)), 0.0625,
                 id="ipo-per-token"),
])
def test_pair_loss_golden(loss, policy_reference, expected):
    losses, chosen_reward, rejected_reward = loss.pair_losses(*policy_reference)
    assert float(losses[0]) == pytest.approx(expected, rel=1e-12)
    policy, reference = policy_reference
    assert float(chosen_reward[0]) == pytest.approx(loss.beta * float(policy["chosen_logps"][0] - reference["chosen_logps"][0]))
    assert float(rejected_reward[0]) == pytest.approx(loss.beta * float(policy["rejected_logps"][0] - reference["rejected_logps"][0]))


def test_metrics_records_rewards_for_dpo_and_nothing_new_for_sft():
    sft = MetricsWindow()
    sft.add(loss=2.0, real_tokens=10, slots=16, data_wait=0.0)
    record = sft.close(step=1, lr=1e-3, world_totals=(10, 16), flops_per_token=1.0, peak_flops_total=None)
    assert not any(key.startswith(("reward", "pairs")) for key in record) and "margin" not in progress_line(record, 5)

    dpo = MetricsWindow()
    dpo.add(loss=0.69, real_tokens=10, slots=16, data_wait=0.0, pairs=4,
            rewards={"chosen": 0.1, "rejected": -0.1, "margin": 0.2, "accuracy": 0.5})
    dpo.add(loss=0.59, real_tokens=10, slots=16, data_wait=0.0, pairs=6,
            rewards={"chosen": 0.3, "rejected": -0.3, "margin": 0.6, "accuracy": 1.0})
    record = dpo.close(step=2, lr=1e-3, world_totals=(20, 32), flops_per_token=1.0, peak_flops_total=None)
    assert record["pairs"] == 10
    assert record["reward_margin"] == pytest.approx(0.4) and record["reward_accuracy"] == pytest.approx(0.75)
    assert "margin +0.4000  accuracy 75%" in progress_line(record, 5)
    assert summarize([record])["last_reward_accuracy"] == pytest.approx(0.75)


def test_a_checkpoint_resumes_only_the_same_objective():
    from types import SimpleNamespace

    from packfeed.service.data.config import DataConfig
    from packfeed.trainer.run_config import ModelConfig
    from packfeed.trainer.state.resume import check_resume
    from packfeed.trainer.state.train_state import TrainState

    data = DataConfig.from_inputs(["a.jsonl"], tokenizer="tok", seq_len=64)
    sft = RunConfig(data=data, model=ModelConfig(name="tiny-llama"))
    dpo = RunConfig(data=data, model=ModelConfig(name="tiny-llama"), train=TrainConfig(objective="dpo"))
    h = data.config_hash()
    state = {"step": 3, "stream": {"version": 1, "config_hash": h, "seq_len": 64}, "manifest": {"key": f"{h}-f1"}}
    plan = SimpleNamespace(fingerprint=lambda: "f1")
    check_resume(TrainState.from_dict({**state, "config": dpo.to_dict()}), dpo, packed=None, plan=plan)
    old_sft = sft.to_dict()
    del old_sft["train"]["objective"]  # a checkpoint from before objectives existed: SFT
    check_resume(TrainState.from_dict({**state, "config": old_sft}), sft, packed=None, plan=plan)
    with pytest.raises(ValueError, match="the checkpoint trained objective 'sft', this run's is 'dpo'"):
        check_resume(TrainState.from_dict({**state, "config": old_sft}), dpo, packed=None, plan=plan)


def test_a_dpo_step_without_pairs_on_real_samples_is_refused():
    from packfeed.client.rows import padding_rows
    from packfeed.trainer.objective.dpo import check_pairs_trained
    from packfeed.trainer.objective.step import StepResult
    from support.pair_rows import pack_pairs

    plain = pack_pairs([], 16, plain=[[5, 6, 7]])
    with pytest.raises(ValueError, match="step 3 holds no preference pair"):
        check_pairs_trained(StepResult(loss=0.0, trained_tokens=0), [plain], 3)
    check_pairs_trained(StepResult(loss=0.0, trained_tokens=0), [padding_rows(2, 16, 0)], 3)  # the data's end
    check_pairs_trained(StepResult(loss=0.7, trained_tokens=9, pairs=1), [plain], 3)  # pairs on another rank


def test_the_closing_summary_shows_the_rewards_of_dpo_runs_only():
    from packfeed.trainer.loop.interval import format_summary

    dpo = format_summary({"steps": 3, "first_loss": 0.6931, "last_loss": 0.5, "last_reward_margin": 0.3,
                          "last_reward_accuracy": 0.7})
    assert "DPO reward (last)        margin +0.3000, accuracy 70%" in dpo
    assert "DPO" not in format_summary({"steps": 3, "first_loss": 2.0, "last_loss": 1.0})


def test_the_bundled_dpo_config_reads_as_a_dpo_run(monkeypatch):
    import argparse
    from pathlib import Path

    from packfeed.trainer.launch.command import add_arguments, run_config_from_args

    repo = Path(__file__).resolve().parents[3]
    monkeypatch.chdir(repo)  # its paths are relative to the repository root
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    run = run_config_from_args(parser.parse_args(["--config", "examples/train_dpo.toml"]))
    assert run.train.objective == "dpo" and run.train.dpo_reference == "initial"
    assert [Path(p).name for p in run.data.inputs] == ["preference.jsonl"]
    assert all(Path(p).exists() for p in run.data.inputs)
