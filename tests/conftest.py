"""The test session keeps packfeed's machine-wide cache to itself: quicktok's imported files
(service/tokenize/fast/quick_cache.py) go to a directory of this session, inherited by every process
the tests start, so no test depends on what an earlier run left in ~/.cache.

The suite runs on two worker processes (pyproject.toml: ``-n 2 --dist loadfile``), which take
the test files in collection order; the longest files are put first (``LONGEST_FIRST``), so that
no long file starts last while the other worker has nothing left to run."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_OWN_CACHE: list[str] = []
TESTS = Path(__file__).parent

# Seconds each took in a serial run of the suite on this 2-core machine (--durations=0, loaded),
# longest first; the other files keep their order after these.
LONGEST_FIRST = (
    "integration/test_train_resume.py",  # 178 s
    "integration/test_train_signals.py",  # 154 s
    "integration/test_train_fsdp.py",  # 101 s
    "integration/test_serve_robustness.py",  # 86 s
    "integration/test_local_cluster.py",  # 75 s
    "integration/test_torchrun.py",  # 67 s
    "integration/test_train_mixture_hook.py",  # 52 s
    "integration/test_serve_failures.py",  # 44 s
    "integration/test_cluster_placement.py",  # 39 s
    "integration/test_pack_cli.py",  # 35 s
    "integration/test_gpu_check.py",  # 31 s
    "integration/storage/test_train_s3.py",  # 29 s
    # unit files after the integration ones: a worker's shared Ray (integration/conftest.py)
    # would stop before a unit file and start again after it
    "unit/service/tokenize/test_tokenizer_snapshots.py",  # 71 s
    "unit/service/tokenize/test_tokenize_shipped.py",  # 39 s
)


def pytest_configure(config):
    if "PACKFEED_CACHE_DIR" not in os.environ:
        _OWN_CACHE.append(tempfile.mkdtemp(prefix="packfeed-test-cache-"))
        os.environ["PACKFEED_CACHE_DIR"] = _OWN_CACHE[0]


def pytest_unconfigure(config):
    for path in _OWN_CACHE:
        shutil.rmtree(path, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    missing = [name for name in LONGEST_FIRST if not (TESTS / name).is_file()]
    if missing:  # a file renamed or removed: its place in the order would be lost without a word
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names no such file: {missing}")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.path).relative_to(TESTS).as_posix(), len(rank)))
