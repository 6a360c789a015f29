"""Checks of the model before anything starts (trainer/launch/prechecks.py ``context_warning``,
trainer/model/builder.py ``check_model``): rows longer than the model's context are said in one
line (with RoPE scaling named when the config has it); a directory that is not a
save_pretrained one is refused as such, not by transformers' "model_type key" message."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from transformers import LlamaConfig  # noqa: E402

from packfeed.trainer.launch.prechecks import context_warning  # noqa: E402
from packfeed.trainer.model.builder import check_model  # noqa: E402
from packfeed.trainer.run_config import ModelConfig  # noqa: E402


@pytest.mark.parametrize("context", [1024, 131_072])
def test_rows_longer_than_the_context_are_said_in_one_line(context):
    config = LlamaConfig(max_position_embeddings=context)
    for seq_len in (context // 2, context):
        assert context_warning(config, seq_len=seq_len, name="m") is None
    line = context_warning(config, seq_len=2 * context, name="m")
    assert "\n" not in line and f"max_position_embeddings {context:,}" in line and f"{2 * context:,}" in line
    assert "rope_scaling" not in line


def test_rope_scaling_is_named():
    config = LlamaConfig(max_position_embeddings=8192, rope_scaling={"rope_type": "linear", "factor": 4.0})
    assert "rope_scaling 'linear' is set" in context_warning(config, seq_len=16384, name="m")


def test_a_config_without_a_context_says_nothing():
    assert context_warning(object(), seq_len=10**6, name="m") is None


def test_a_directory_without_config_json_is_refused_as_such(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="is a directory without config.json") as error:
        check_model(ModelConfig(name=str(tmp_path)), vocab_size=100)
    assert "model_type" not in str(error.value)
