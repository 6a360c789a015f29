"""quicktok's imported files, kept on local disk by tokenizer: the fast back-end's import (step 2
of its proof, ~2 s for a 150k vocabulary here) runs once per tokenizer and machine, not once per
command.

The key is the SHA-256 of quicktok's version and the backend's whole JSON (``to_str()``, as
transformers loaded it): another vocabulary, pattern, normalizer or quicktok gives another
entry. An entry only saves the import: the stress texts (step 3) check the files it holds
(their pass is keyed by those very bytes, below) and each actor's first window (step 4) runs on
every use, so a stale or damaged entry can cost a refusal, never a wrong row, and ``load_fast``
then drops it and imports again. Entries are written whole
(a temporary directory renamed into place); a cache that cannot be written is skipped.

The outcome of the stress texts (step 3) is kept too, by everything it depends on
(``verdict_entry``): a second command with the same tokenizer, templates and packfeed skips
them (0.7 s for Qwen2.5's 151k vocabulary, on the driver while Ray starts). Step 4 still runs
in every actor on its own data.

Where: ``$PACKFEED_CACHE_DIR/quicktok``, else ``$XDG_CACHE_HOME/packfeed/quicktok``, else
``~/.cache/packfeed/quicktok``; a few MB per tokenizer. snapshots.py keeps the driver's loaded
tokenizers beside them (``tokenizers/``) with the same entries (``keyed_entry``,
``read_entry``, ``write_entry``).
"""

from __future__ import annotations

import hashlib
import json
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


# packfeed's code that builds the fast encoder and compares it with HF: a verdict holds for it only
_CHECK_SOURCES = ("backend.py", "encoder.py", "checks.py", "../encoders.py")  # beside this file


def verdict_entry(backend_json: str, version: str, files: dict[str, bytes], texts: list[str],
                  threads: int = 1) -> Path | None:
    """The entry of a stress check (step 3) that passed on exactly these inputs: quicktok's and
    ``tokenizers``' versions, packfeed's encoder and check code, the backend's JSON, quicktok's
    files, the stress texts (a chat template's rendered probes among them) and the encoder's
    threads. The check is a deterministic function of them, so its outcome is too. None: a
    version or source unreadable."""
    from importlib import metadata

    digest = hashlib.sha256(f"stress verdict 1\0quicktok {version}\0threads {threads}\0".encode())
    try:
        digest.update(f"tokenizers {metadata.version('tokenizers')}\0".encode())
        for name in _CHECK_SOURCES:
            digest.update((Path(__file__).parent / name).read_bytes())
    except (OSError, metadata.PackageNotFoundError):
        return None
    digest.update(backend_json.encode())
    for name in sorted(files):
        digest.update(f"\0{name}\0".encode() + hashlib.sha256(files[name]).digest())
    for text in texts:
        digest.update(f"\0{len(text)}\0{text}".encode("utf-8", "surrogatepass"))
    return cache_root("stress") / digest.hexdigest()[:40]


def load_verdict(path: Path | None) -> dict | None:
    """What a passed stress check counted (``compare_encoders``'s dict), or None."""
    files = read_entry(path) if path is not None else None
    try:
        checked = json.loads(files["checked.json"]) if files else None
    except (KeyError, ValueError):
        return None
    return checked if isinstance(checked, dict) else None


def store_verdict(path: Path | None, checked: dict) -> None:
    """Keep a passed check's counts (replacing a damaged entry of the same key)."""
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        write_entry(path, {"checked.json": json.dumps(checked).encode()})


def forget(backend_json: str, version: str) -> None:
    shutil.rmtree(entry(backend_json, version), ignore_errors=True)
