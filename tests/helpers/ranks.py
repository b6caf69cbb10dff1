"""Functions that data-parallel ranks run in tests (imported by name in child processes)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from elastune.tasks.distributed import DistContext


def rank_sum(ctx: DistContext) -> float:
    """The sum of the ranks, all-reduced: the ranks reached each other."""
    total = torch.tensor([float(ctx.rank)])
    torch.distributed.all_reduce(total)
    return total.item()


def hang(ctx: DistContext, noted: str | None = None) -> None:
    """Sleeps ten minutes; with ``noted`` (a folder), its pid written there first."""
    if noted is not None:
        Path(noted, f"rank{ctx.rank}").write_text(str(os.getpid()))
    time.sleep(600)
