"""quicktok's imported files, kept on local disk by tokenizer: the fast back-end's import (step 2
of its proof, ~2 s for a 150k vocabulary here) runs once per tokenizer and machine, not once per
command.

The key is the SHA-256 of quicktok's version and the backend's whole JSON (``to_str()``, as
transformers loaded it): another vocabulary, pattern, normalizer or quicktok gives another
entry. An entry only saves the import: the stress texts (step 3) and each actor's first window
(step 4) still run on every use, so a stale or damaged entry can cost a refusal, never a
wrong row, and ``load_fast`` then drops it and imports again. Entries are written whole
(a temporary directory renamed into place); a cache that cannot be written is skipped.

Where: ``$PACKFEED_CACHE_DIR/quicktok``, else ``$XDG_CACHE_HOME/packfeed/quicktok``, else
``~/.cache/packfeed/quicktok``; a few MB per tokenizer. snapshots.py keeps the driver's loaded
tokenizers beside them (``tokenizers/``) with the same entries (``keyed_entry``,
``read_entry``, ``write_entry``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)


def cache_root(kind: str = "quicktok") -> Path:
    """Where entries of ``kind`` live (quicktok's files; snapshots.py's tokenizers)."""
    base = os.environ.get("PACKFEED_CACHE_DIR")
    if base:
        return Path(base) / kind
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "packfeed" / kind


def keyed_entry(kind: str, key: bytes) -> Path:
    """The entry of ``kind`` for ``key`` (hashed: any length, any bytes)."""
    return cache_root(kind) / hashlib.sha256(key).hexdigest()[:40]


def entry(backend_json: str, version: str) -> Path:
    return keyed_entry("quicktok", f"quicktok {version}\0".encode() + backend_json.encode())


def read_entry(path: Path) -> dict[str, bytes] | None:
    """An entry's files (name -> bytes), or None when it is absent, empty or unreadable."""
    try:
        files = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
    except OSError:
        return None
    return files or None


def write_entry(path: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` as the entry ``path``, whole (best effort: a read-only or full disk skips it)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
        for name, data in files.items():
            (staging / name).write_bytes(data)
        try:
            staging.rename(path)  # whole or not at all; another process may have written it first
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as e:
        logger.debug("not cached in %s: %s", path.parent, e)


def load(backend_json: str, version: str) -> dict[str, bytes] | None:
    """The files cached for this backend and quicktok version, or None."""
    return read_entry(entry(backend_json, version))


def store(backend_json: str, version: str, files: dict[str, bytes]) -> None:
    """Keep ``files`` for this backend."""
    write_entry(entry(backend_json, version), files)


def forget(backend_json: str, version: str) -> None:
    shutil.rmtree(entry(backend_json, version), ignore_errors=True)
