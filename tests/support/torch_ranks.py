"""Torch set-up the tests share: one intra-op thread for tiny models, and a spawned process as
one rank of a gloo group (CPU) that tears the group down together with the others."""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads; on a busy 2-core box they cost a lot."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def gloo_rank(rank: int, init_file: str, world_size: int) -> Iterator[None]:
    """This process as rank ``rank`` of a gloo group met through ``init_file``, one torch thread.

    When the body is done, the ranks tear gloo down together (a barrier first): a rank done first
    tore its side down while the other was still connected, and that one aborted in gloo's
    teardown ("terminate called without an active exception", SIGABRT: 1 CI run in 4)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()
