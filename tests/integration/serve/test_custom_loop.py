"""examples/custom_loop.py and PackedIterableDataset against one real ``packfeed serve``.

A run that trains 5 steps with a checkpoint at step 3, then "crashes" (its step-5 checkpoint is
deleted, so steps 4-5 were trained but never saved) and is resumed to step 6 must train on
exactly the rows and sample ids of an uninterrupted 6-step run, reach the same losses, and end
with the same weights. Both runs seed the model init and run on CPU in fp32, one thread each.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys

import pytest

from support.serve import REPO, ServerProcess, demo_args

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "custom_loop.py"
BATCH_ROWS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    with ServerProcess(demo_args(seq_len=512), log=root / "server.log", state_dir=root / "state") as proc:
        yield proc


def start_example(server, output, *flags: str) -> subprocess.Popen:
    command = [sys.executable, str(EXAMPLE), "--target", server.target, "--output", str(output),
               "--batch-rows", str(BATCH_ROWS), "--save-every", "3", *flags]
    # One thread per run: the two runs below go side by side on a small machine, reproducibly.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    return out


def trained(output) -> list[dict]:
    return [json.loads(line) for line in (output / "trained.jsonl").read_text().splitlines()]


def weights(checkpoint) -> dict:
    from safetensors.torch import load_file

    return load_file(str(checkpoint / "model" / "model.safetensors"))


def test_resumed_run_trains_on_the_same_samples_as_an_uninterrupted_one(server, tmp_path):
    import torch

    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    runs = [start_example(server, straight, "--steps", "6"), start_example(server, interrupted, "--steps", "5")]
    for proc in runs:
        finish(proc)

    assert sorted(p.name for p in (interrupted / "checkpoints").iterdir()) == ["step_000003", "step_000005"]
    shutil.rmtree(interrupted / "checkpoints" / "step_000005")  # crashed after step 5, before saving it
    assert [r["step"] for r in trained(interrupted)] == [1, 2, 3, 4, 5]

    out = finish(start_example(server, interrupted, "--steps", "6", "--resume"))
    assert "resumed from" in out and "step_000003" in out, out
    assert "step     4" in out and "step     3" not in out.split("resumed from")[1], out

    expected, got = trained(straight), trained(interrupted)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6]  # steps 4-5 of the crashed run are forgotten
    for want, have in zip(expected, got, strict=True):
        assert have["row_index"] == want["row_index"], f"step {want['step']}"
        assert have["sample_ids"] == want["sample_ids"], f"step {want['step']}"
        assert have["trained_tokens"] == want["trained_tokens"] > 0
        assert have["loss"] == pytest.approx(want["loss"], abs=1e-5), f"step {want['step']}"
    # Not vacuous: the rows are consecutive global rows and carry real, distinct samples.
    assert [i for r in got for i in r["row_index"]] == list(range(6 * BATCH_ROWS))
    ids = [i for r in got for row in r["sample_ids"] for i in row if i >= 0]
    assert len(ids) == len(set(ids)) > 6 * BATCH_ROWS
    assert expected[-1]["loss"] < expected[0]["loss"]  # it learns (deterministic: seeded init, same data)

    final_straight, final_resumed = weights(straight / "checkpoints" / "step_000006"), weights(
        interrupted / "checkpoints" / "step_000006")
    assert final_straight.keys() == final_resumed.keys()
    for name, tensor in final_straight.items():
        torch.testing.assert_close(final_resumed[name], tensor, atol=1e-6, rtol=0, msg=name)
    state = json.loads((interrupted / "checkpoints" / "step_000006" / "state.json").read_text())
    assert state["step"] == 6 and state["stream"]["cursor"] == 6 * BATCH_ROWS


def test_iterable_dataset_yields_model_inputs_and_resumes_exactly(server):
    import torch
    from torch.utils.data import DataLoader

    from packfeed.client import PackedIterableDataset, PackedStream, to_model_inputs

    with PackedStream(server.target, batch_rows=BATCH_ROWS) as stream:
        reference = [(batch.row_index.copy(), to_model_inputs(batch.rows)) for batch in itertools.islice(stream, 6)]

    def same(item: dict, index: int) -> None:
        want = reference[index][1]
        assert item.keys() == want.keys() and "attention_mask" not in item and item["use_cache"] is False
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(item[key], value), (index, key)
            else:
                assert item[key] == value, (index, key)

    dataset = PackedIterableDataset(server.target, batch_rows=BATCH_ROWS)
    assert dataset.describe().seq_len == 512
    assert dataset.state_dict()["cursor"] == 0
    loader = DataLoader(dataset, batch_size=None)
    for i, item in enumerate(itertools.islice(loader, 3)):
        same(item, i)
        assert dataset.last_batch.step == i
        assert dataset.last_batch.row_index.tolist() == reference[i][0].tolist()
    state = json.loads(json.dumps(dataset.state_dict()))  # JSON-able, as a checkpoint stores it
    assert state["cursor"] == 3 * BATCH_ROWS and state["step"] == 3

    # A new dataset from the saved state, and the same dataset iterated again, both go on at row 12.
    resumed = PackedIterableDataset(server.target, batch_rows=BATCH_ROWS, state=None)
    resumed.load_state_dict(state)
    for ds in (resumed, dataset):
        for i, item in enumerate(itertools.islice(DataLoader(ds, batch_size=None), 3), start=3):
            same(item, i)
            assert ds.last_batch.step == i
        assert ds.state_dict()["cursor"] == 6 * BATCH_ROWS

    with pytest.raises(ValueError, match="version"):
        resumed.load_state_dict({"cursor": 3})
    # A worker process would advance a copy of the position that the main process never sees.
    with pytest.raises(RuntimeError, match="num_workers=0"):
        next(iter(DataLoader(resumed, batch_size=None, num_workers=1)))


def test_client_imports_without_torch_or_ray():
    # torch, Ray, transformers and pyarrow made unimportable, as on a trainer that installed
    # packfeed without extras. PackedIterableDataset itself is imported lazily in the test above.
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'ray', 'transformers', 'pyarrow'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import packfeed.client as c\n"
        "from packfeed.client import *\n"
        "c.PackedStream, c.Batch, c.StreamError, c.StreamInfo, c.select_rows\n"
        "from packfeed.client.wire import decode_batch_bytes\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)
