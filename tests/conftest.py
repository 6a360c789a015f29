"""The test session keeps packfeed's machine-wide cache to itself: quicktok's imported files
(service/tokenize/fast/quick_cache.py) go to a directory of this session, inherited by every process
the tests start, so no test depends on what an earlier run left in ~/.cache."""

import os
import shutil
import tempfile

_OWN_CACHE: list[str] = []


def pytest_configure(config):
    if "PACKFEED_CACHE_DIR" not in os.environ:
        _OWN_CACHE.append(tempfile.mkdtemp(prefix="packfeed-test-cache-"))
        os.environ["PACKFEED_CACHE_DIR"] = _OWN_CACHE[0]


def pytest_unconfigure(config):
    for path in _OWN_CACHE:
        shutil.rmtree(path, ignore_errors=True)
