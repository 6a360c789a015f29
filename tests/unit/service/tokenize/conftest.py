"""Fixtures of the tokenizer tests: the tokenizers of the chat templates packfeed knows."""

import pytest
from support.tokenizers import qwen_tokenizer_dir

from packfeed.service.assets import demo_tokenizer_path


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    """{template name: tokenizer}: the bundled tokenizer (ChatML) and Qwen2.5's, built offline."""
    from transformers import AutoTokenizer

    qwen = AutoTokenizer.from_pretrained(qwen_tokenizer_dir(str(tmp_path_factory.mktemp("qwen"))))
    return {"chatml": AutoTokenizer.from_pretrained(demo_tokenizer_path()), "qwen2.5": qwen}
