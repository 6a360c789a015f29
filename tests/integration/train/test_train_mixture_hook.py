"""`packfeed train`'s ``[train] mixture_hook`` end to end, as a user runs it.

Real `packfeed train` processes (tests/support/train.py: own embedded Ray, 2 DDP workers, tiny
Llama, seq_len 256, 8 rows a step) on two sources, chat and stories (250 lines each, windows of
16 samples: ~30 steps of rows) with a 128-row feeder buffer, so the reader is still windows short
of the end when the hook asks. The hook is a function in a module written under tmp_path and put
on the run's PYTHONPATH (the driver and every Ray worker import it); it pauses chat at step 2 and
keeps the weights at every other step. The run is stopped right after that step (``--stop-at-step
2``) and resumed (``--resume``): the resumed run's hook changes nothing, so the change it trains
on can only come from the checkpoint. Checked:

* the step-2 checkpoint records the change (its step, ``from_sample``, window, weights);
* replayed exactly: over both runs every (step, rank) trained once and every row of the stream
  exactly once, each (step, rank) on the samples, row by row, of ``packfeed pack --config`` of
  the data config with the recorded change written as a ``[[data.schedule]]`` entry; the pack
  says that entry takes effect at the change's window, which starts at its ``from_sample``;
* the change did something: chat's last trained sample is in the window before the change's,
  no row trained from that window on holds one, and rows of more than one step were trained there.

The change's window is past every row the stopped run trained (the hook of step 2 runs after the
ranks got the rows of step 2, so the change starts after them), so the resumed run trains every
row the change made.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from packfeed.client.mixture_record import schedule_toml
from packfeed.client.rows import PAD_SAMPLE_ID
from packfeed.client.sources import first_sample_ids, source_index
from support.train import WORKERS, Train, corpus_head

from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.cli import main
from packfeed.service.packed.writer import packed_dir_info, read_packed_dir
from packfeed.trainer.state.checkpoint import latest_checkpoint, read_state
from packfeed.trainer.loop.interval import read_jsonl

pytestmark = pytest.mark.integration

LINES, WINDOW, ROWS_PER_RANK, PAUSE_AT = 250, 16, 4, 2
PAUSE_CHAT = {"chat": 0.0, "stories": 1.0}
HOOK_MODULE = "pause_chat_hook"
HOOK = f'''
def pause_chat(info):
    """Pause chat after step {PAUSE_AT}; keep the weights (None) after every other step."""
    assert info.sources == ("chat", "stories") and info.world_size == {WORKERS}, info.sources
    return {PAUSE_CHAT!r} if info.step == {PAUSE_AT} else None
'''
TRAIN = f"""
[model]
name = "tiny-llama"
attn = "sdpa"

[train]
max_steps = 100  # more than the data holds: the run trains every row of the stream
micro_batch_rows = {ROWS_PER_RANK}
grad_accum = 1
log_every = 10
checkpoint_every = 0
lr = 3e-3
warmup_steps = 2
record_rows = true
feeder_buffer_rows = 128
mixture_hook = "{HOOK_MODULE}:pause_chat"

[scaling]
num_workers = {WORKERS}
cpus_per_worker = 0.5
packing_workers = 1
packing_cpus_per_worker = 0.5
"""


def data_toml(paths: dict[str, str], schedule: str = "") -> str:
    """The [data] table of both runs and of the pack: one source per path, then ``schedule``."""
    sources = "".join(f'\n[[data.sources]]\nname = "{name}"\npaths = [{json.dumps(path)}]\n'
                      for name, path in paths.items())
    return (f"[data]\ntokenizer = {json.dumps(demo_tokenizer_path())}\nseq_len = 256\n"
            f"window_samples = {WINDOW}\n{sources}\n{schedule}")


def trained_samples(output: Path) -> list[tuple[int, int, list[int], list[int]]]:
    """(step, rank, global row indices, real sample ids of those rows) of every step every rank
    trained, over the stopped and the resumed run."""
    return [(r["step"], r["rank"], r["row_index"], r["sample_ids"])
            for path in sorted((output / "rows").glob("rank*.jsonl")) for r in read_jsonl(path)]


def succeeded(run: Train) -> str:
    """The output of ``run`` once it ended with status 0; what is left of its processes is killed."""
    code, out = run.ended()
    run.left()
    assert code == 0, out[-3000:]
    return out


@pytest.mark.timeout(400)
def test_a_hooks_change_is_checkpointed_replayed_on_resume_and_equals_the_scheduled_pack(
        ray_cluster, tmp_path, monkeypatch):
    files = {Path(p).stem: p for p in corpus_head(tmp_path / "corpus", LINES)}
    paths = {name: files[name] for name in PAUSE_CHAT}
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / f"{HOOK_MODULE}.py").write_text(HOOK)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH")) if p))
    config, output = tmp_path / "run.toml", tmp_path / "run"
    config.write_text(data_toml(paths) + TRAIN)

    succeeded(Train(config, output, "--stop-at-step", str(PAUSE_AT)))
    state = read_state(latest_checkpoint(output))
    assert state["step"] == PAUSE_AT
    [change] = state["manifest"].get("mixture", [])
    assert change == {"step": PAUSE_AT, "from_sample": change["from_sample"], "window": change["window"],
                      "weights": PAUSE_CHAT}, "the hook's weights, recorded in the checkpoint"
    stopped_rows = [i for _, _, indices, _ in trained_samples(output) for i in indices]
    assert len(stopped_rows) == PAUSE_AT * WORKERS * ROWS_PER_RANK

    assert f"at step {PAUSE_AT}," in succeeded(Train(config, output, "--resume"))
    assert read_state(latest_checkpoint(output))["manifest"]["mixture"] == [change], "replayed, no other change"

    packed = tmp_path / "packed"
    scheduled = tmp_path / "scheduled.toml"
    scheduled.write_text(data_toml(paths, schedule_toml([change])))
    assert main(["pack", "--config", str(scheduled), "--output", str(packed)]) == 0
    plan = packed_dir_info(packed)["config"]["plan"]
    assert plan["stages"][1] == {"stage": 1, "from_sample": change["from_sample"], "window": change["window"],
                                 "start_sample": change["from_sample"], "weights": PAUSE_CHAT}
    pack = read_packed_dir(packed)
    samples_of = {int(pack.row_index[r]): [int(s) for s in pack.row_sample_ids(r) if s != PAD_SAMPLE_ID]
                  for r in range(pack.num_rows)}

    records = trained_samples(output)
    last = max(step for step, _, _, _ in records)
    assert sorted((s, r) for s, r, _, _ in records) == [(s, r) for s in range(1, last + 1) for r in range(WORKERS)]
    rows = [i for _, _, indices, _ in records for i in indices if i in samples_of]
    assert sorted(rows) == sorted(samples_of), "every row of the scheduled pack trained exactly once"
    padding = [i for _, _, indices, _ in records for i in indices if i not in samples_of]
    assert len(padding) < WORKERS * ROWS_PER_RANK, "only the last step is filled with padding rows"
    for step, rank, indices, sample_ids in records:
        assert sample_ids == [s for i in indices if i in samples_of for s in samples_of[i]], \
            f"step {step} rank {rank}: the samples of the scheduled pack's rows"

    first_row = read_state(latest_checkpoint(output))["manifest"]["first_row"]
    change_row, before_row = first_row[str(change["window"])], first_row[str(change["window"] - 1)]
    assert change_row > max(stopped_rows), "the resumed run trained every row of the change"
    first_ids = first_sample_ids(plan["sources"])
    chat_rows = [i for i in rows if (source_index(samples_of[i], first_ids) == 0).any()]
    assert before_row <= max(chat_rows) < change_row, "chat until the change's window, none from it on"
    assert sum(i >= change_row for i in rows) > WORKERS * ROWS_PER_RANK, "rows after the change were trained"
    chat_samples = {s for i in chat_rows for s in samples_of[i] if s < first_ids[1]}
    assert 0 < len(chat_samples) < LINES, "chat paused part-way: fewer than its samples"
