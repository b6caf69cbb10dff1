"""Tiny trainables for tests: fast, deterministic, and each with one way to misbehave."""

from __future__ import annotations

import gc
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from elastune.tasks.context import TrialContext


def quadratic(
    config: dict, ctx: TrialContext, each_epoch: Callable[[int], None] | None = None
) -> None:
    """Accuracy rises with epochs towards 1 - (x - 0.7)^2; its state counts epochs trained."""
    state = torch.nn.Linear(1, 1)
    with torch.no_grad():
        state.bias.zero_()
    start = ctx.restore(model=state)
    for epoch in ctx.range(start):
        if each_epoch is not None:
            each_epoch(epoch)
        with torch.no_grad():
            state.bias += 1.0  # counts every epoch this trial ever trained
        ceiling = 1 - (config["x"] - 0.7) ** 2
        ctx.report(val_accuracy=ceiling * (1 - 0.5**epoch), epochs_trained=state.bias.item())
        ctx.checkpoint(model=state)


def flaky(config: dict, ctx: TrialContext) -> None:
    """Raises for small x; otherwise as :func:`quadratic`."""
    if config["x"] < 0.3:
        raise RuntimeError(f"diverged at x={config['x']:.3f}")
    quadratic(config, ctx)


def nan_for_small_x(config: dict, ctx: TrialContext) -> None:
    start = ctx.restore()
    for _ in ctx.range(start):
        ctx.report(val_accuracy=math.nan if config["x"] < 0.3 else config["x"])


def exits_for_small_x(config: dict, ctx: TrialContext) -> None:
    """Calls ``sys.exit(3)`` for small x, as a script's argument check would."""
    if config["x"] < 0.3:
        sys.exit(3)
    quadratic(config, ctx)


def bad_resource_for_small_x(config: dict, ctx: TrialContext) -> None:
    """Reports at resource NaN for small x (a step computed from a diverged value)."""
    for epoch in ctx.range(ctx.restore()):
        ctx.report(math.nan if config["x"] < 0.3 else epoch, val_accuracy=config["x"])


def silent_for_small_x(config: dict, ctx: TrialContext) -> None:
    """Returns without reporting anything for small x (an early return)."""
    if config["x"] >= 0.3:
        quadratic(config, ctx)


def raises_with_nothing_to_train(config: dict, ctx: TrialContext) -> None:
    """:func:`quadratic`, but raises when called with nothing to train (the registration)."""
    if ctx.stop == ctx.start:
        raise RuntimeError("no epochs, no model")
    quadratic(config, ctx)


def numpy_checkpoint_for_small_x(config: dict, ctx: TrialContext) -> None:
    """Checkpoints a numpy number for small x, which a weights-only restore refuses."""
    for epoch in ctx.range(ctx.restore()):
        ctx.report(val_accuracy=config["x"])
        ctx.checkpoint(epoch=np.int64(epoch) if config["x"] < 0.3 else epoch)


def leaves_a_thread(config: dict, ctx: TrialContext) -> None:
    """:func:`logged_quadratic`, leaving a thread (not a daemon) that outlives the job;
    except trial 0: blocked in a C call for an hour (a CUDA call that never returns, say),
    which no limit raised in its thread can interrupt."""
    if ctx.trial == 0:
        time.sleep(3600)
    threading.Thread(target=time.sleep, args=(3600,), name="left-by-a-trial").start()
    logged_quadratic(config, ctx)


def blocked_in_trial_0(config: dict, ctx: TrialContext) -> None:
    """:func:`quadratic`, except trial 0: blocked in a C call for ever (a CUDA call that
    does not return, say)."""
    if ctx.trial == 0:
        threading.Event().wait()
    quadratic(config, ctx)


def slow_finish_in_trial_0(config: dict, ctx: TrialContext) -> None:
    """:func:`quadratic`, whose trial 0 hands its segment's metrics and checkpoint to MLflow
    (``ctx.finish``) only $ELASTUNE_TEST_FINISH_SECONDS after it trained (a slow store)."""
    if ctx.trial == 0:
        finish = ctx.finish

        def slow() -> None:
            time.sleep(float(os.environ["ELASTUNE_TEST_FINISH_SECONDS"]))
            finish()

        ctx.finish = slow  # type: ignore[method-assign]
    quadratic(config, ctx)


def crashes_in_trial_0(config: dict, ctx: TrialContext) -> None:
    """:func:`quadratic`, except trial 0: its process dies of a segmentation fault (a bug in
    a C extension, say) before it trains."""
    if ctx.trial == 0:
        os.kill(os.getpid(), signal.SIGSEGV)
    quadratic(config, ctx)


def wrong_metric(config: dict, ctx: TrialContext) -> None:
    for _ in ctx.range(ctx.restore()):
        ctx.report(accuracy=0.5)


def logged_quadratic(config: dict, ctx: TrialContext) -> None:
    """:func:`quadratic`, slowed down, appending every epoch it trains to $ELASTUNE_TEST_LOG."""

    def log(epoch: int) -> None:
        time.sleep(0.3)
        with open(os.environ["ELASTUNE_TEST_LOG"], "a") as out:
            out.write(f"{ctx.trial} {epoch}\n")

    quadratic(config, ctx, log)


def hangs_for_small_x(config: dict, ctx: TrialContext) -> None:
    """Never returns for small x (a hung data loader, say); otherwise as :func:`quadratic`."""
    while config["x"] < 0.3:
        time.sleep(0.05)
    quadratic(config, ctx)


def rank_one_raises(config: dict, ctx: TrialContext) -> None:
    """Data-parallel in name: every rank reports, and rank 1 raises after its first epoch."""
    for epoch in ctx.range(ctx.restore()):
        ctx.report(val_accuracy=0.5)
        if ctx.rank == 1:
            raise FloatingPointError(f"rank 1 diverged at epoch {epoch}")
        torch.distributed.barrier()  # rank 0 waits here for a peer that never comes


rank_one_raises.distributed = True  # type: ignore[attr-defined]


def pid_logged_quadratic(config: dict, ctx: TrialContext) -> None:
    """:func:`quadratic` that, before each epoch, appends ``pid trial epoch`` to
    $ELASTUNE_TEST_PIDS and then takes $ELASTUNE_TEST_EPOCH_SECONDS (default 1), longer while
    a file ``$ELASTUNE_TEST_PIDS.hold`` exists: a test can find the process training a
    segment and kill it mid-segment, or hold it there. With $ELASTUNE_TEST_SPANS set, each
    epoch then appends ``pid start end frozen`` there (wall-clock seconds, and how many
    objects the process's garbage collector leaves out)."""

    def log(epoch: int) -> None:
        pids = os.environ["ELASTUNE_TEST_PIDS"]
        with open(pids, "a") as out:
            out.write(f"{os.getpid()} {ctx.trial} {epoch}\n")
        began = time.time()
        time.sleep(float(os.environ.get("ELASTUNE_TEST_EPOCH_SECONDS", "1")))
        while os.path.exists(f"{pids}.hold"):
            time.sleep(0.05)
        if spans := os.environ.get("ELASTUNE_TEST_SPANS"):
            with open(spans, "a") as out:
                out.write(f"{os.getpid()} {began} {time.time()} {gc.get_freeze_count()}\n")

    quadratic(config, ctx, log)


def lingering_quadratic(config: dict, ctx: TrialContext) -> None:
    """:func:`quadratic` that, after its last checkpoint, appends ``pid trial stop`` to
    $ELASTUNE_TEST_PIDS and lingers $ELASTUNE_TEST_LINGER_SECONDS (say, exporting a model):
    a test can kill it once the segment's training is saved but before its report is."""
    quadratic(config, ctx)
    with open(os.environ["ELASTUNE_TEST_PIDS"], "a") as out:
        out.write(f"{os.getpid()} {ctx.trial} {ctx.stop:g}\n")
    time.sleep(float(os.environ.get("ELASTUNE_TEST_LINGER_SECONDS", "0")))


def wide_quadratic(
    config: dict, ctx: TrialContext, each_epoch: Callable[[int], None] | None = None
) -> None:
    """:func:`quadratic`, data-parallel in name: it reports the world size it trained at,
    after an all-reduce that every rank must join (so the ranks really ran together)."""
    state = torch.nn.Linear(1, 1)
    with torch.no_grad():
        state.bias.zero_()
    start = ctx.restore(model=state)
    for epoch in ctx.range(start):
        joined = torch.ones(1)
        if ctx.distributed:
            torch.distributed.all_reduce(joined)
        if each_epoch is not None:
            each_epoch(epoch)
        with torch.no_grad():
            state.bias += 1.0
        ceiling = 1 - (config["x"] - 0.7) ** 2
        ctx.report(val_accuracy=ceiling * (1 - 0.5**epoch), world_size=float(joined.item()))
        ctx.checkpoint(model=state)


wide_quadratic.distributed = True  # type: ignore[attr-defined]


def device_counter(config: dict, ctx: TrialContext) -> None:
    """:func:`quadratic` with its state on ``ctx.device``: reports the epochs the trial ever
    trained and whether this segment's state lived on CUDA, and appends
    ``trial device begin end`` to $ELASTUNE_TEST_DEVICES after each segment."""
    began = time.time()
    state = torch.nn.Linear(1, 1).to(ctx.device)
    with torch.no_grad():
        state.bias.zero_()
    start = ctx.restore(model=state)
    for epoch in ctx.range(start):
        time.sleep(float(os.environ.get("ELASTUNE_TEST_EPOCH_SECONDS", "0")))
        with torch.no_grad():
            state.bias += 1.0
        ceiling = 1 - (config["x"] - 0.7) ** 2
        ctx.report(
            val_accuracy=ceiling * (1 - 0.5**epoch),
            epochs_trained=state.bias.item(),
            on_cuda=float(state.bias.is_cuda),
        )
        ctx.checkpoint(model=state)
    if "ELASTUNE_TEST_DEVICES" in os.environ and ctx.stop > start:  # not a model export
        with open(os.environ["ELASTUNE_TEST_DEVICES"], "a") as out:
            out.write(f"{ctx.trial} {state.bias.device} {began} {time.time()}\n")


def dies_on_the_gpu(config: dict, ctx: TrialContext) -> None:
    """:func:`device_counter`, whose trial ``i`` first dies on the GPU the ``i``-th way
    $ELASTUNE_TEST_GPU_FAULTS names (comma-separated, none if unset): ``oom`` asks for more
    memory than any GPU has; ``assert`` trips a kernel's device-side assert, which poisons
    its process's CUDA context; ``segfault`` ends its process with a CUDA context open.
    Each segment that trains first appends ``trial pid cuda device server`` to
    $ELASTUNE_TEST_WORKERS: ``cuda`` 1 if its process had set CUDA up before it began,
    ``device`` where it trains, ``server`` what its process was forked from: ``forked``, a
    fork of the command or node that runs it, or ``started``, a fork server started as a
    program of its own (tasks/worker_processes.py)."""
    if ctx.stop > ctx.start:  # not a model export
        set_up = int(torch.cuda.is_initialized())
        server = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
        kind = "started" if b"serve_forks" in server else "forked"
        with open(os.environ["ELASTUNE_TEST_WORKERS"], "a") as out:
            out.write(f"{ctx.trial} {os.getpid()} {set_up} {ctx.device} {kind}\n")
    faults = os.environ.get("ELASTUNE_TEST_GPU_FAULTS", "").split(",")
    fault = faults[ctx.trial] if ctx.trial < len(faults) else ""
    if fault == "oom":
        torch.empty(2**50, dtype=torch.uint8, device=ctx.device)  # a pebibyte
    elif fault == "assert":
        index = torch.tensor([2], device=ctx.device)
        torch.zeros(1, device=ctx.device)[index].item()  # out of bounds, found on the GPU
    elif fault == "segfault":
        torch.zeros(1, device=ctx.device)
        os.kill(os.getpid(), signal.SIGSEGV)
    device_counter(config, ctx)


def missing_key(config: dict, ctx: TrialContext) -> None:
    """Every trial fails: a KeyError, as from a config key the space does not have."""
    ctx.restore()
    config["learning_rate"]


def seeded_init(config: dict, ctx: TrialContext) -> None:
    """Reports the weight its model was initialised with under ``ctx.seeded()``."""
    with ctx.seeded():
        weight = torch.nn.Linear(1, 1).weight.item()
    for _ in ctx.range(ctx.restore()):
        ctx.report(val_accuracy=weight)


def collector(config: dict, ctx: TrialContext) -> None:
    """Reports, from inside the job, whether Python's cyclic garbage collector is on, how
    many objects it leaves out (frozen) and the process it trains in."""
    for _ in ctx.range(ctx.restore()):
        frozen, pid = gc.get_freeze_count(), os.getpid()
        ctx.report(val_accuracy=config["x"], gc_on=gc.isenabled(), frozen=frozen, pid=pid)


def checkpoints_until_stopped(config: dict, ctx: TrialContext) -> None:
    """Reports and checkpoints to MLflow over and over, never ending its epoch: the
    segment's time limit is bound to fall due while ctx is writing."""
    for _ in ctx.range(ctx.restore()):
        while True:
            ctx.report(val_accuracy=config["x"])
            ctx.checkpoint(x=config["x"])
            time.sleep(0.005)  # training between checkpoints, in Python code


def slow_wide_quadratic(config: dict, ctx: TrialContext) -> None:
    """:func:`wide_quadratic` whose ranks but 0 take 0.5 s after each epoch's all-reduce:
    rank 0 reaches its next step (and looks at the clock) 0.5 s before them, so a deadline
    passes between the ranks' looks, and the next all-reduce waits for ever unless they
    stop at the same step."""

    def each_epoch(epoch: int) -> None:
        if ctx.rank > 0:
            time.sleep(0.5)

    wide_quadratic(config, ctx, each_epoch)


slow_wide_quadratic.distributed = True  # type: ignore[attr-defined]
