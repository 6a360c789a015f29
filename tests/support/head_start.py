"""The driver's head start (service/packjob/head_start.py) on the bundled corpus, for its unit tests."""

from __future__ import annotations

import threading
from typing import Any


def bundled_setup() -> tuple[Any, Any, Any]:
    """(config, plan, shipped tokenizer) of the bundled corpus in 15 windows of 500 samples, seq_len 512."""
    from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
    from packfeed.service.data.config import DataConfig
    from packfeed.service.data.plan import build_plan
    from packfeed.service.tokenize.samples import load_tokenizer

    config = DataConfig.from_inputs(demo_corpus_paths(), tokenizer=demo_tokenizer_path(), seq_len=512,
                                    window_samples=500)
    plan = build_plan(config)
    assert plan.num_windows == 15
    return config, plan, load_tokenizer(config.tokenizer, snapshot=True).ship()


def start_head(setup: tuple[Any, Any, Any], out, **kwargs) -> tuple[Any, threading.Thread]:
    """A HeadStart of ``setup`` writing to ``out``, running in its own thread."""
    from packfeed.service.packjob.head_start import HeadStart

    config, plan, shipped = setup
    head = HeadStart(config, plan, shipped, output=str(out), **kwargs)
    thread = threading.Thread(target=head.run, daemon=True)
    thread.start()
    return head, thread
