"""to_model_inputs: packed rows -> block-causal model kwargs. Golden cases a reader can check."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packfeed.client.model_inputs import num_trained_tokens, to_model_inputs  # noqa: E402
from packfeed.client.rows import (  # noqa: E402
    IGNORE_INDEX,
    PackedRows,
    cu_seqlens,
    positions_from_seq_lens,
)


def make_rows(seq_lens_per_row: list[list[int]], pad_last: bool = False) -> PackedRows:
    """Rows following the convention; token ids count up from 3 so every row is distinct."""
    seq_len = sum(seq_lens_per_row[0])
    num_rows = len(seq_lens_per_row)
    ids = np.arange(3, 3 + num_rows * seq_len, dtype=np.int32).reshape(num_rows, seq_len)
    labels = ids.copy()
    sample_ids, next_id = [], 0
    for r, lens in enumerate(seq_lens_per_row):
        starts = np.cumsum(lens) - lens
        labels[r, starts] = IGNORE_INDEX
        row_ids = list(range(next_id, next_id + len(lens)))
        next_id += len(lens)
        if pad_last:
            labels[r, starts[-1] :] = IGNORE_INDEX
            row_ids[-1] = -1
        sample_ids.append(np.asarray(row_ids, dtype=np.int64))
    return PackedRows.from_columns(
        {
            "input_ids": ids,
            "labels": labels,
            "position_ids": np.stack([positions_from_seq_lens(lens) for lens in seq_lens_per_row]),
            "seq_lens": [np.asarray(lens, dtype=np.int32) for lens in seq_lens_per_row],
            "sample_ids": sample_ids,
        }
    )


def as_numpy_dict(rows: PackedRows) -> dict:
    return {
        "input_ids": rows.input_ids,
        "labels": rows.labels,
        "position_ids": rows.position_ids,
        "seq_lens": [rows.row_seq_lens(r) for r in range(rows.num_rows)],
    }


def as_ray_dict(rows: PackedRows) -> dict:
    """What Ray's iter_batches gives for list columns: object ndarrays of per-row arrays."""

    def objects(per_row: list[np.ndarray]) -> np.ndarray:
        column = np.empty(len(per_row), dtype=object)
        for r, value in enumerate(per_row):
            column[r] = value
        return column

    return {
        "input_ids": objects(list(rows.input_ids)),
        "labels": objects(list(rows.labels)),
        "position_ids": objects(list(rows.position_ids)),
        "seq_lens": objects([rows.row_seq_lens(r) for r in range(rows.num_rows)]),
        "sample_ids": objects([rows.row_sample_ids(r) for r in range(rows.num_rows)]),
    }


def as_torch_dict(rows: PackedRows) -> dict:
    return {
        "input_ids": torch.from_numpy(rows.input_ids),
        "labels": torch.from_numpy(rows.labels),
        "position_ids": torch.from_numpy(rows.position_ids),
        "seq_lens": [torch.from_numpy(rows.row_seq_lens(r)) for r in range(rows.num_rows)],
    }


def without_seq_lens(rows: PackedRows) -> dict:
    return {key: value for key, value in as_numpy_dict(rows).items() if key != "seq_lens"}


FORMS = {
    "packed-rows": lambda rows: rows,
    "numpy-dict": as_numpy_dict,
    "ray-object-columns": as_ray_dict,
    "torch-dict": as_torch_dict,
    "derived-from-positions": without_seq_lens,
}

GOLDEN = [
    pytest.param([[3, 5], [8]], [0, 3, 8, 16], 8, id="L8-rows-3+5-and-8"),
    pytest.param([[1, 2, 3]], [0, 1, 3, 6], 3, id="L6-toy-samples-1-2-3"),
    pytest.param([[3, 2, 3], [8]], [0, 3, 5, 8, 16], 8, id="L8-design-example-with-padding-tail"),
    pytest.param([[4], [1, 1, 1, 1], [2, 2]], [0, 4, 5, 6, 7, 8, 10, 12], 4, id="L4-three-rows-length-1"),
]


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize(("seq_lens", "expected_cu", "expected_max"), GOLDEN)
def test_golden_cu_seq_lens(form, seq_lens, expected_cu, expected_max):
    rows = make_rows(seq_lens)
    inputs = to_model_inputs(FORMS[form](rows))

    assert inputs["cu_seq_lens_q"].tolist() == expected_cu
    assert inputs["cu_seq_lens_k"].tolist() == expected_cu
    assert inputs["max_length_q"] == inputs["max_length_k"] == expected_max
    assert inputs["input_ids"].tolist() == rows.input_ids.tolist()
    assert inputs["labels"].tolist() == rows.labels.tolist()
    assert inputs["position_ids"].tolist() == rows.position_ids.tolist()


@pytest.mark.parametrize("form", list(FORMS))
def test_types_and_keys(form):
    inputs = to_model_inputs(FORMS[form](make_rows([[3, 5], [8]])))

    assert set(inputs) == {
        "input_ids",
        "labels",
        "position_ids",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "use_cache",
    }
    assert "attention_mask" not in inputs
    assert inputs["use_cache"] is False
    for key in ("input_ids", "labels", "position_ids"):
        assert inputs[key].dtype == torch.int64 and inputs[key].shape == (2, 8)
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        assert inputs[key].dtype == torch.int32 and inputs[key].dim() == 1
    assert type(inputs["max_length_q"]) is int and type(inputs["max_length_k"]) is int


def test_sweep_agrees_with_rows_convention():
    """Random rows: seq_lens, positions and rows.cu_seqlens give the same global offsets."""
    rng = np.random.default_rng(0)
    seq_len, seen_interior = 32, 0
    for _ in range(50):
        per_row = []
        for _ in range(int(rng.integers(1, 6))):
            cuts = np.sort(rng.choice(np.arange(1, seq_len), size=int(rng.integers(0, 8)), replace=False))
            per_row.append(np.diff(np.concatenate([[0], cuts, [seq_len]])).tolist())
            seen_interior += len(cuts)
        rows = make_rows(per_row)
        expected = cu_seqlens([np.asarray(lens) for lens in per_row], seq_len).tolist()
        for form in FORMS.values():
            inputs = to_model_inputs(form(rows))
            assert inputs["cu_seq_lens_q"].tolist() == expected
            assert inputs["max_length_q"] == max(max(lens) for lens in per_row)
    assert seen_interior > 0  # the sweep did exercise interior boundaries


def test_padded_2d_seq_lens_ignore_zero_entries():
    rows = make_rows([[3, 5], [8]])
    batch = {**without_seq_lens(rows), "seq_lens": np.array([[3, 5], [8, 0]], dtype=np.int32)}
    assert to_model_inputs(batch)["cu_seq_lens_q"].tolist() == [0, 3, 8, 16]


def test_moves_tensors_to_device():
    inputs = to_model_inputs(make_rows([[3, 5], [8]]), device="meta")
    for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert inputs[key].device.type == "meta"
    assert inputs["max_length_q"] == 8


def test_num_trained_tokens_counts_shifted_labels():
    # DESIGN example row: labels [-100, 6, 7, -100, 9, -100, -100, -100] -> targets 6, 7, 9.
    labels = np.array([[-100, 6, 7, -100, 9, -100, -100, -100]])
    assert num_trained_tokens(labels) == 3
    # A trained label in slot 0 is never a target after the shift: nothing predicts it.
    assert num_trained_tokens(np.array([[5, 6, -100, 8]])) == 2
    rows = make_rows([[3, 2, 3], [8]], pad_last=True)
    inputs = to_model_inputs(rows)
    # row 0: samples of 3 and 2 trained on all but their first token (2 + 1); row 1 is padding.
    assert num_trained_tokens(inputs) == 3
    assert num_trained_tokens(inputs["labels"]) == num_trained_tokens(rows.labels) == 3


@pytest.mark.parametrize(
    ("batch_fn", "message"),
    [
        pytest.param(
            lambda rows: {**without_seq_lens(rows), "seq_lens": [[3, 4], [8]]},
            "sum to 7",
            id="seq-lens-not-summing-to-L",
        ),
        pytest.param(
            lambda rows: {**without_seq_lens(rows), "seq_lens": [[4, 4], [8]]},
            "position_ids disagree",
            id="seq-lens-disagree-with-positions",
        ),
        pytest.param(
            lambda rows: {**without_seq_lens(rows), "seq_lens": [[3, 5]]},
            "1 rows",
            id="seq-lens-row-count",
        ),
        pytest.param(
            lambda rows: {**without_seq_lens(rows), "position_ids": rows.position_ids + 1},
            "slot 0",
            id="row-not-starting-at-position-0",
        ),
        pytest.param(
            lambda rows: {
                **without_seq_lens(rows),
                "position_ids": np.array([[0, 1, 2, 0, 1, 2, 4, 5], list(range(8))]),
            },
            "position_ids disagree",
            id="positions-skip-inside-a-segment",
        ),
        pytest.param(
            lambda rows: {key: v for key, v in without_seq_lens(rows).items() if key != "labels"},
            "labels",
            id="missing-labels",
        ),
        pytest.param(
            lambda rows: {
                **as_ray_dict(rows),
                "input_ids": np.array([np.arange(8), np.arange(7)], dtype=object),
            },
            "different lengths",
            id="ragged-rows",
        ),
    ],
)
def test_rejects_rows_breaking_the_convention(batch_fn, message):
    with pytest.raises(ValueError, match=message):
        to_model_inputs(batch_fn(make_rows([[3, 5], [8]])))


def test_client_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import packfeed.client.model_inputs as m\n"
        "import numpy as np\n"
        "assert m.num_trained_tokens(np.array([[-100, 1, -100, 2]])) == 2\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
