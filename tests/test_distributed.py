"""Elastic trials: data-parallel digits training agrees across world sizes, and a
checkpoint written at one world size resumes at another.

Tolerance: with the same seed, the same global batch of 64 and synchronous all-reduce
averaging, one process and two compute the same gradient; they differ only in float32
summation order (the per-rank means, the all-reduce, and the thread split of each matmul),
about 1e-7 relative per step. Over 40 SGD steps on this smooth problem that stays far below
1e-4 (measured: 2.4e-7 at most). So losses must agree to ``atol=1e-4``: tight enough that one
wrong sample per batch (about 1/64 of the loss, ~1e-2) or a rank training on its own
un-averaged gradient would fail, loose enough for any reduction order.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from elastune.tasks.distributed import (
    DistContext,
    DistributedError,
    GlobalBatches,
    load_checkpoint,
    mean_across_ranks,
    run_distributed,
    save_checkpoint,
)
from tests.helpers.processes import ROOT, alive, wait_for
from tests.helpers.ranks import hang

pytestmark = pytest.mark.slow  # spawns processes and trains a model

STEPS, SAVE_AT, GLOBAL_BATCH, ATOL = 40, 20, 64, 1e-4
NCCL = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="NCCL with 2 ranks needs 2 CUDA devices"
)


def train_digits(
    ctx: DistContext,
    steps: int,
    save_at: int | None = None,
    save_to: str | None = None,
    resume_from: str | None = None,
) -> list[float]:
    """A small MLP on scikit-learn's digits; returns the global batch's loss at every step."""
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images / 16.0, dtype=torch.float32, device=ctx.device)
    y = torch.tensor(labels, device=ctx.device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    ).to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = 0
    if resume_from is not None:
        step = load_checkpoint(resume_from, model, optimizer)["step"]
    ddp = ctx.wrap(model)
    batches = GlobalBatches(len(x), GLOBAL_BATCH, ctx.rank, ctx.world_size, seed=0)
    losses = []
    while step < steps:
        index = batches.batch(step).to(ctx.device)
        loss = F.cross_entropy(ddp(x[index]), y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(mean_across_ranks(loss))
        step += 1
        if step == save_at:
            save_checkpoint(save_to, ddp, optimizer, step=step)
    return losses


def fail_on_rank_one(ctx: DistContext) -> None:
    torch.distributed.barrier()
    if ctx.rank == 1:
        raise ArithmeticError("rank one broke")
    torch.distributed.barrier()  # rank 0 waits here for a peer that never comes


def die_on_rank_one(ctx: DistContext) -> None:
    if ctx.rank == 1:
        os._exit(3)
    torch.distributed.barrier()


@pytest.fixture(scope="module", params=["gloo", pytest.param("nccl", marks=NCCL)])
def runs(request, tmp_path_factory):
    """Full runs at world sizes 1 and 2, each saving a checkpoint at SAVE_AT."""
    backend, tmp = request.param, tmp_path_factory.mktemp(request.param)
    full = {}
    for world in (1, 2):
        kwargs = {"steps": STEPS, "save_at": SAVE_AT, "save_to": str(tmp / f"ws{world}.pt")}
        full[world] = run_distributed(train_digits, world, kwargs=kwargs, backend=backend)
    return backend, tmp, full


def test_loss_trajectories_agree_across_world_sizes(runs):
    _, _, full = runs
    one, two = full[1], full[2]
    assert len(one) == len(two) == STEPS
    assert max(abs(a - b) for a, b in zip(one, two, strict=True)) < ATOL
    assert sum(one[-5:]) / 5 < 0.5 * sum(one[:5]) / 5  # and it does learn


@pytest.mark.parametrize(("written", "resumed"), [(2, 1), (1, 2)])
def test_checkpoint_resumes_at_another_world_size(runs, written, resumed):
    backend, tmp, full = runs
    kwargs = {"steps": STEPS, "resume_from": str(tmp / f"ws{written}.pt")}
    rest = run_distributed(train_digits, resumed, kwargs=kwargs, backend=backend)
    assert len(rest) == STEPS - SAVE_AT
    for reference in (full[written], full[resumed]):
        assert max(abs(a - b) for a, b in zip(rest, reference[SAVE_AT:], strict=True)) < ATOL


def test_checkpoint_holds_the_unwrapped_module(runs):
    _, tmp, _ = runs
    payload = torch.load(tmp / "ws2.pt", weights_only=True)
    assert set(payload["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert payload["state"] == {"step": SAVE_AT}


def test_a_rank_that_raises_fails_the_run_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(DistributedError, match="rank 1 of 2 failed: ArithmeticError") as info:
        run_distributed(fail_on_rank_one, 2, backend="gloo", timeout=60)
    assert "rank one broke" in str(info.value) and "fail_on_rank_one" in str(info.value)
    assert info.value.rank == 1 and set(info.value.after) <= {0}
    assert time.monotonic() - start < 30  # the peer stuck in a barrier was not waited for


def test_a_rank_that_dies_is_named_not_the_peer_it_takes_down():
    # Rank 0's barrier then fails with "connection reset", often before rank 1's exit is seen.
    with pytest.raises(DistributedError, match="rank 1 of 2 failed: exited with code 3"):
        run_distributed(die_on_rank_one, 2, backend="gloo", timeout=60)


def test_a_hung_run_times_out():
    with pytest.raises(TimeoutError, match=r"within 3 s; ranks \[0\] of 1"):
        run_distributed(hang, 1, backend="gloo", timeout=3)


def test_ranks_end_with_the_process_that_started_them(tmp_path: Path) -> None:
    """A driver killed by SIGKILL leaves no rank training (on a GPU, holding it), nor the
    run's scratch folder."""
    start = "from elastune.tasks.distributed import run_distributed; "
    start += "from tests.helpers.ranks import hang; "
    start += f"run_distributed(hang, 2, args=({str(tmp_path)!r},), backend='gloo', timeout=600)"
    # The driver's temporary folders, and so its run's. Short: the forkserver's socket goes
    # in there too, and a Unix socket's path may not pass 107 bytes (Python 3.11 does not
    # fall back). Under xdist, tmp_path passes it once pytest's run count reaches 100.
    scratch = Path(tempfile.mkdtemp(prefix="elastune-test-"))
    env = {**os.environ, "TMPDIR": str(scratch)}
    driver = subprocess.Popen(
        [sys.executable, "-c", start], cwd=ROOT, env=env, start_new_session=True
    )
    ranks: list[int] = []
    try:
        noted = [tmp_path / "rank0", tmp_path / "rank1"]
        assert wait_for(lambda: all(n.exists() and n.read_text() for n in noted), 120)
        ranks = [int(n.read_text()) for n in noted]
        assert all(alive(rank) for rank in ranks)
        driver.kill()
        driver.wait(10)
        assert wait_for(lambda: not any(alive(rank) for rank in ranks), 15), "ranks left"
        assert not list(scratch.glob("elastune-dist-*")), "the run's scratch folder left"
    finally:
        for pid in [driver.pid, *ranks]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_long_tmpdir_starts_the_ranks_by_spawn(tmp_path: Path) -> None:
    """A ``TMPDIR`` too long for the forkserver's Unix socket ("AF_UNIX path too long" on
    Python 3.11): the ranks start as fresh interpreters instead, and the run works."""
    long = tmp_path / ("t" * 100)
    long.mkdir()
    code = "from elastune.tasks.distributed import _start_method, run_distributed"
    code += "; from tests.helpers.ranks import rank_sum"
    code += "; print(_start_method(), run_distributed(rank_sum, 2, backend='gloo'))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(long)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["spawn", "1.0"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 0}, "world_size must be an integer >= 1, got 0"),
        ({"world_size": 1, "backend": "mpi"}, "backend must be one of gloo, nccl, got 'mpi'"),
        ({"world_size": 1, "timeout": 0}, "timeout must be > 0 seconds, got 0"),
        ({"world_size": 1, "devices": [0]}, "devices apply to the nccl backend only"),
    ],
)
def test_bad_arguments_name_the_value(kwargs, message):
    kwargs.setdefault("backend", "gloo")
    with pytest.raises(ValueError, match=message):
        run_distributed(hang, **kwargs)


def test_a_lambda_cannot_be_spawned():
    with pytest.raises(ValueError, match="must be picklable"):
        run_distributed(lambda ctx: None, 1, backend="gloo")


def test_global_batches_split_one_global_batch_by_rank():
    whole = GlobalBatches(100, 8, 0, 1, seed=3)
    halves = [GlobalBatches(100, 8, rank, 2, seed=3) for rank in (0, 1)]
    for step in (0, 11, 12, 30):  # 12 batches per epoch: steps 11/12 cross an epoch
        joined = torch.cat([h.batch(step) for h in halves])
        assert joined.tolist() == whole.batch(step).tolist()
    assert whole.batch(0).tolist() != whole.batch(12).tolist()  # a new epoch reshuffles
    with pytest.raises(ValueError, match="global_batch 8 is not divisible by world_size 3"):
        GlobalBatches(100, 8, 0, 3)


def test_docstring_examples_run():
    import doctest

    import elastune.tasks.distributed

    assert doctest.testmod(elastune.tasks.distributed).failed == 0
