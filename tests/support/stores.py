"""An object store without a socket for the unit tests: fsspec's in-memory filesystem, which
the storage layer serves as any other URI (``memory://bucket/key``, through pyarrow's fsspec
wrapper), so the code paths of a store (listing, whole-object writes, no rename, no append)
run in-process."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture(name="store")
def memory_store():
    """A fresh ``memory://`` prefix, removed afterwards."""
    import fsspec

    memory = fsspec.filesystem("memory")
    name = f"pf-{uuid.uuid4().hex[:12]}"
    yield f"memory://{name}"
    if memory.exists(f"/{name}"):
        memory.rm(f"/{name}", recursive=True)


@pytest.fixture(name="where", params=["local", "store"])
def local_or_store(request, tmp_path, store):
    """The same place on disk and on the store (a test runs for both)."""
    return str(tmp_path / "out") if request.param == "local" else f"{store}/out"


def keys(root: str) -> list[str]:
    """Every object under ``root``, relative to it, sorted."""
    from packfeed.service import storage

    return [info.uri[len(root) + 1:] for info in storage.listing(root, recursive=True) if not info.is_dir]
