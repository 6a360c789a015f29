"""The driver's tokenizer without transformers, from the second load of the same files on.

``packfeed pack`` and ``serve`` use of a loaded tokenizer only what ``ShippedTokenizer`` keeps
(the backend's JSON, special ids and tokens, vocabulary size, chat templates); getting them
through ``AutoTokenizer`` costs seconds per command, most of it transformers' import (torch
with it), and runs while the embedded Ray starts, on the same cores (bench/bench_startup.py). So the
first load of a local tokenizer directory keeps that snapshot on local disk, keyed by
everything the load depended on, and later loads of the same directory rebuild it in
milliseconds.

The key is the SHA-256 of: this module's format, the installed versions of transformers and
``tokenizers`` (they decide what a load gives), and every file under the directory by its
relative path and contents (a file over ``HASHED_BYTES``, a model's weights when the tokenizer
is a model directory, by its size and modification time: transformers reads no such file to
load a tokenizer). Any change to the directory, or another transformers, loads it again and
keeps a new entry. A Hub id is not cached (resolving it needs transformers). Entries live in
``<cache>/tokenizers`` (quick_cache.py's root), written whole; a damaged one is loaded again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from importlib import metadata
from pathlib import Path

from packfeed.service.tokenize.fast import quick_cache
from packfeed.service.tokenize.shipped import ShippedTokenizer

logger = logging.getLogger(__name__)

FORMAT = "packfeed tokenizer snapshot 1"
HASHED_BYTES = 64 << 20  # larger files are keyed by size and mtime (weights, never a tokenizer's)
_BACKEND, _FIELDS = "backend.json", "fields.json"


def directory_key(directory: str) -> bytes | None:
    """The key of a tokenizer directory's snapshot (module docstring); None when a file or
    a version cannot be read (then nothing is cached)."""
    digest = hashlib.sha256(FORMAT.encode())
    try:
        for package in ("transformers", "tokenizers"):
            digest.update(f"\0{package} {metadata.version(package)}".encode())
        root = Path(directory)
        files = sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            stat = path.stat()
            digest.update(f"\0{path.relative_to(root).as_posix()}\0{stat.st_size}\0".encode())
            if stat.st_size > HASHED_BYTES:
                digest.update(f"mtime {stat.st_mtime_ns}".encode())
            else:
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    except (OSError, metadata.PackageNotFoundError) as e:
        logger.debug("tokenizer %s: no snapshot key: %s", directory, e)
        return None
    return digest.digest()


def load(directory: str, key: bytes | None) -> ShippedTokenizer | None:
    """The snapshot kept for ``key`` (``directory_key``), named ``directory``; None when there
    is none or it is damaged."""
    if key is None:
        return None
    files = quick_cache.read_entry(quick_cache.keyed_entry("tokenizers", key))
    if files is None or set(files) != {_BACKEND, _FIELDS}:
        return None
    try:
        return ShippedTokenizer.from_snapshot(json.loads(files[_FIELDS]), files[_BACKEND].decode(), directory)
    except (ValueError, KeyError, TypeError) as e:  # a damaged entry: load the tokenizer again
        logger.debug("tokenizer %s: snapshot not used: %s", directory, e)
        return None


def store(key: bytes | None, shipped: ShippedTokenizer) -> None:
    """Keep ``shipped`` (the tokenizer as transformers loaded it) for ``key``."""
    if key is None:
        return
    fields, backend_json = shipped.snapshot()
    quick_cache.write_entry(quick_cache.keyed_entry("tokenizers", key),
                            {_FIELDS: json.dumps(fields).encode(), _BACKEND: backend_json.encode()})

