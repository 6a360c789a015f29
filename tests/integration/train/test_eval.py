"""Held-out evaluation and the loss per source, end to end (``[eval]``, trainer/loop/evaluate.py).

A real `packfeed train` process (tests/support/train.py: its own embedded Ray, 2 DDP workers,
tiny Llama, seq_len 256, 2 rows a rank a step, a record every step) trains 4 steps on two sources
(chat, stories: the first 40 lines of each bundled file) and evaluates every 2 steps on an eval
set packed apart with `packfeed pack` from held-out lines (lines 1000-1039 of chat and
stories, as sources ``chat_eval`` and ``stories_eval``), its first ``MAX_ROWS`` rows: a number
that is not a multiple of the 4 rows an eval step takes, so the last eval step holds a row past
it and padding rows. Checked:

* the eval loss logged at the last step equals the token-mean loss of ``final/``, loaded by
  Hugging Face, computed here from its logits on the eval set's first ``MAX_ROWS`` rows (read
  back from the packed directory), to 1e-4; so does each eval source's loss, and the per-source
  losses weighted by their tokens give the total;
* evaluated at steps 2 and 4 only; the summary names the last and the best eval step;
* every record's training loss per source, weighted by its tokens, gives the record's loss (a
  record a step: the step's token mean), and both training sources appear.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from support.train import Train, run_config_text

from packfeed.client.model_inputs import to_model_inputs
from packfeed.client.rows import IGNORE_INDEX, select_rows
from packfeed.client.sources import first_sample_ids, source_index
from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.cli import main
from packfeed.service.packed.writer import packed_dir_info, read_packed_dir
from packfeed.trainer.loop.interval import read_jsonl

pytestmark = pytest.mark.integration

STEPS, EVERY, MAX_ROWS = 4, 2, 7
SOURCES = ("chat", "stories")


def lines_of(name: str, start: int, count: int, root: Path) -> str:
    """Lines [start, start + count) of the bundled corpus file ``name``, written under ``root``."""
    [source] = [p for p in demo_corpus_paths() if Path(p).stem == name]
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}.jsonl"
    with open(source) as f:
        path.write_text("".join(itertools.islice(f, start, start + count)))
    return str(path)


def sources_toml(table: str, paths: dict[str, str]) -> str:
    return "".join(f'\n[[{table}.sources]]\nname = "{name}"\npaths = [{json.dumps(path)}]\n'
                   for name, path in paths.items())


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path]:
    """(the finished run's output, the eval set's packed directory)."""
    root = tmp_path_factory.mktemp("eval")
    held_out = {f"{name}_eval": lines_of(name, 1000, 40, root / "held") for name in SOURCES}
    pack_config = root / "eval.toml"
    pack_config.write_text(f"[data]\ntokenizer = {json.dumps(demo_tokenizer_path())}\nseq_len = 256\n"
                           + sources_toml("data", held_out))
    eval_dir = root / "eval_rows"
    assert main(["pack", "--config", str(pack_config), "--output", str(eval_dir)]) == 0
    assert read_packed_dir(eval_dir).num_rows > MAX_ROWS, "the eval set is cut by max_rows"

    train = {name: lines_of(name, 0, 40, root / "train") for name in SOURCES}
    model_onwards = run_config_text([], steps=STEPS).split("[model]", 1)[1]  # the tests' small run
    config = root / "run.toml"
    config.write_text(f"[data]\ntokenizer = {json.dumps(demo_tokenizer_path())}\nseq_len = 256\nwindow_samples = 16\n"
                      f"epochs = 3\n{sources_toml('data', train)}\n[model]{model_onwards}\n[eval]\n"
                      f"packed = {json.dumps(str(eval_dir))}\nevery_steps = {EVERY}\nmax_rows = {MAX_ROWS}\n")
    output = root / "run"
    proc = Train(config, output)
    code, out = proc.ended()
    proc.left()
    assert code == 0, out[-3000:]
    assert "eval loss" in out, out[-3000:]
    return output, eval_dir


def direct_losses(final: Path, eval_dir: Path) -> tuple[float, dict[str, float]]:
    """(token-mean loss, per-source token-mean losses) of the model in ``final`` on the eval set's
    first MAX_ROWS rows, from Hugging Face's logits: every target of a row by the shift."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(final, attn_implementation="sdpa", dtype=torch.float32).eval()
    rows = read_packed_dir(eval_dir)
    rows = select_rows(rows, np.flatnonzero(rows.row_index < MAX_ROWS))
    assert rows.num_rows == MAX_ROWS
    plan = packed_dir_info(eval_dir)["config"]["plan"]["sources"]
    names, firsts = [s["name"] for s in plan], first_sample_ids(plan)
    token_source = np.repeat(source_index(rows.sample_ids, firsts), rows.seq_lens).reshape(rows.input_ids.shape)
    inputs = to_model_inputs(rows)
    with torch.no_grad():
        logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits.float()
    targets = inputs["labels"][:, 1:]
    losses = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1),
                             ignore_index=IGNORE_INDEX, reduction="none").reshape(targets.shape)
    trained = (targets != IGNORE_INDEX).numpy()
    per_source = {}
    for s, name in enumerate(names):
        mine = trained & (token_source[:, 1:] == s)
        per_source[name] = float(losses.numpy()[mine].sum() / mine.sum())
    return float(losses.numpy()[trained].sum() / trained.sum()), per_source


def test_the_last_eval_loss_is_the_final_models_loss_on_the_eval_rows(run):
    output, eval_dir = run
    records = read_jsonl(output / "metrics.jsonl")
    last = records[-1]
    assert last["step"] == STEPS and "eval" in last
    total, per_source = direct_losses(output / "final", eval_dir)
    assert last["eval"]["loss"] == pytest.approx(total, rel=1e-4)
    assert set(last["eval"]["source_loss"]) == set(per_source) == {f"{n}_eval" for n in SOURCES}
    for name, loss in per_source.items():
        assert last["eval"]["source_loss"][name] == pytest.approx(loss, rel=1e-4)
    tokens = last["eval"]["source_tokens"]
    weighted = sum(last["eval"]["source_loss"][n] * tokens[n] for n in tokens) / sum(tokens.values())
    assert weighted == pytest.approx(last["eval"]["loss"], rel=1e-12)
    assert last["eval"]["tokens"] == sum(tokens.values())


def test_evaluated_every_n_steps_and_summarised(run):
    output, _ = run
    records = read_jsonl(output / "metrics.jsonl")
    evaluated = {r["step"]: r["eval"]["loss"] for r in records if "eval" in r}
    assert sorted(evaluated) == list(range(EVERY, STEPS + 1, EVERY))
    summary = json.loads((output / "summary.json").read_text())
    best = min(evaluated, key=evaluated.get)
    assert summary["eval"]["last_step"] == STEPS and summary["eval"]["best_step"] == best
    assert summary["eval"]["best_loss"] == evaluated[best]


def test_each_records_source_losses_give_its_loss(run):
    output, _ = run
    records = read_jsonl(output / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    seen = set()
    for record in records:
        losses, tokens = record["source_loss"], record["source_tokens"]
        seen |= set(losses)
        weighted = sum(losses[n] * tokens[n] for n in losses) / sum(tokens.values())
        assert weighted == pytest.approx(record["loss"], rel=1e-9)
    assert seen == set(SOURCES)
