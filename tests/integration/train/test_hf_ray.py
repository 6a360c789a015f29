"""``packed_hf_dataset`` on the Ray packed stream: every row, in stream order, columns kept.

The reference is the same windows packed in this process with ``process_window`` (the stream
is a deterministic function of inputs, config and seed), so the test shows the Hugging Face
view neither lost, reordered nor re-packed a row.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

pytest.importorskip("datasets")

from packfeed.service.packed.arrow_rows import rows_from_arrow
from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.data.config import DataConfig
from packfeed.service.tokenize.samples import SampleTokenizer
from packfeed.service.pipeline.window import process_window
from packfeed.trainer.hf import PackedCollator, packed_hf_dataset

pytestmark = pytest.mark.integration


@pytest.fixture
def small_corpus(tmp_path):
    """200 prompt/completion samples of the bundled corpus: 4 windows of 64 (the last short)."""
    source = next(p for p in demo_corpus_paths() if p.endswith("instruct.jsonl"))
    path = tmp_path / "instruct.jsonl"
    with open(source) as f:
        path.write_text("".join(itertools.islice(f, 200)))
    return str(path)


def test_packed_hf_dataset_of_the_ray_stream_keeps_every_row(ray_cluster, small_corpus):
    from packfeed.service.pipeline.ray_pipeline import PackingPipeline
    from packfeed.service.cluster.scaling import PackingScaling
    from packfeed.service.data.plan import build_plan

    config = DataConfig.from_inputs((small_corpus,), tokenizer=demo_tokenizer_path(), seq_len=256, window_samples=64)
    plan = build_plan(config)
    stream = PackingPipeline(config, plan, scaling=PackingScaling(num_workers=1, cpus_per_worker=0.5))
    dataset = packed_hf_dataset(stream.dataset)

    tokenizers = {"auto": SampleTokenizer(config.tokenizer)}
    expected = [(k, process_window(plan.window(k), tokenizers, config, plan)[0]) for k in stream.windows]
    assert len(expected) == 4
    assert dataset.column_names == ["input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "pair_roles",
                                    "row_index", "window"]
    assert len(dataset) == sum(rows.num_rows for _, rows in expected)
    assert dataset["window"] == [w for w, rows in expected for _ in range(rows.num_rows)]

    got = rows_from_arrow(dataset.with_format("arrow")[:])
    for name in ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "pair_roles", "row_index"):
        want = np.concatenate([getattr(rows, name) for _, rows in expected])
        np.testing.assert_array_equal(getattr(got, name), want, err_msg=name)

    # The trainers' collator takes the rows as they come, the extra "window" column included.
    inputs = PackedCollator()([dataset[0], dataset[1]])
    assert inputs["input_ids"].shape == (2, 256) and "attention_mask" not in inputs
