"""Elastic trials with g > 1: data-parallel training on several processes (torch.distributed).

:func:`run_distributed` runs a training callable on ``world_size`` spawned processes (gloo on
CPU, NCCL when CUDA is available), hands each a :class:`DistContext` (rank, world size,
device) and returns rank 0's return value. A rank that raises or dies ends the whole run
with a :class:`DistributedError` that names it and carries its traceback; a run that hangs
ends with a :class:`TimeoutError`. Every rank leaves through docs/stack.md §6's exit
(``destroy_process_group``; flush; ``os._exit``), so no rank aborts at interpreter exit,
and exits at once when the process that started it dies, even by SIGKILL.

A trial may change its width between segments, so its checkpoint must load at any world
size: :func:`save_checkpoint` writes the unwrapped module's state from rank 0 only, and
:func:`load_checkpoint` loads it into a plain or wrapped module on every rank.
:class:`GlobalBatches` shards the data by rank so that the *global* batch, and with it the
training trajectory, does not depend on the world size.

This module stands alone: it imports nothing else from ``tasks/``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import util
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from elastune.tasks.worker_processes import exit_reason

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class DistContext:
    """What one rank of a data-parallel segment knows about itself."""

    rank: int
    world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: torch.nn.Module) -> DistributedDataParallel:
        """``model`` (already on :attr:`device`) wrapped for synchronous gradient averaging."""
        return wrap(model, self.device)


def wrap(model: torch.nn.Module, device: torch.device) -> DistributedDataParallel:
    """``model``, already on ``device``, wrapped for synchronous gradient averaging over the
    process group."""
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


class DistributedError(RuntimeError):
    """A rank raised or died; the message names the rank and carries its traceback.

    When several ranks fail, the one that failed first is named (a rank that died without a
    word before any that raised); :attr:`after` lists the ranks that failed after it.
    """

    def __init__(self, rank: int, world_size: int, reason: str, remote_traceback: str = ""):
        self.rank = rank
        self.after: list[int] = []
        message = f"rank {rank} of {world_size} failed: {reason}"
        if remote_traceback:
            message += f"\n\n--- traceback of rank {rank} ---\n{remote_traceback.rstrip()}"
        super().__init__(message)


def default_backend() -> str:
    """NCCL when CUDA is there, gloo otherwise."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    backend: str | None = None,
    devices: Sequence[int] | None = None,
    timeout: float = 600.0,
    preload: Sequence[str] = (),
) -> Any:
    """Run ``fn(ctx, *args, **kwargs)`` on ``world_size`` processes; return rank 0's result.

    Args:
        fn: A module-level function (the ranks import it by name).
        world_size: Number of processes (the segment's width ``g``).
        backend: ``gloo`` or ``nccl``; default :func:`default_backend`.
        devices: CUDA device index per rank (NCCL only); default ``0..world_size-1``.
        timeout: Seconds for the whole run, start-up included; also each collective's limit.
        preload: Further modules for the process that forks the ranks to import once, like
            ``fn``'s own module (see below).

    Raises:
        DistributedError: a rank raised, or exited before reporting.
        TimeoutError: the run did not finish within ``timeout``; every rank is killed.
        ValueError: bad arguments (the message names the value).
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    device_ids = _device_ids(backend, world_size, devices)
    payload = _payload(fn, args, kwargs)
    context = mp.get_context(_start_method())
    # The forkserver's ranks fork from one that imported torch (fn's module, ``preload``) once:
    # about 1 s per run instead of a fresh interpreter importing them per rank. The server
    # never touches CUDA, so each rank still initialises its own device. The list counts
    # when the server first starts (once per process); a module it cannot import is skipped.
    modules = ["torch", "torch.distributed", __name__, getattr(fn, "__module__", __name__)]
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload([*dict.fromkeys([*modules, *preload])])
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="elastune-dist-") as scratch:
        # A file store, not a TCP port: no port can be taken by someone else meanwhile.
        store = Path(scratch, "store").as_posix()
        processes: list[Any] = []
        try:
            pipes = _spawn(context, processes, backend, store, device_ids, payload, timeout)
            return _collect(processes, pipes, deadline, timeout)
        finally:
            for process in processes:
                process.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
                if process.is_alive():
                    process.kill()
                    process.join()


def _start_method() -> str:
    """``forkserver``, unless the Unix socket it listens on would not fit a socket's path
    (104 bytes on macOS, 108 on Linux) in this process's temporary folder, under a long
    ``TMPDIR``: then ``spawn``, each rank a fresh interpreter. Python 3.11 does not fall
    back by itself (the forkserver fails with "AF_UNIX path too long")."""
    listener = os.path.join(util.get_temp_dir(), "listener-12345678")
    return "forkserver" if len(listener.encode()) < 104 else "spawn"


def _payload(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any] | None
) -> bytes:
    try:
        return pickle.dumps((fn, tuple(args), dict(kwargs or {})))
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ValueError(
            f"fn {getattr(fn, '__qualname__', fn)!r} and its arguments must be picklable "
            f"(a module-level function) so that spawned ranks can import them: {exc}"
        ) from None


def _spawn(
    context: Any,
    processes: list[Any],
    backend: str,
    store: str,
    device_ids: list[int | None],
    payload: bytes,
    timeout: float,
) -> dict[Connection, int]:
    """Start one process per rank, appending each to ``processes`` as it starts (so the
    caller can end those started if a later one fails); the pipe each reports on."""
    world_size = len(device_ids)
    pipes: dict[Connection, int] = {}
    for rank in range(world_size):
        receive, send = context.Pipe(duplex=False)
        process = context.Process(
            target=_rank_main,
            args=(rank, world_size, backend, store, device_ids[rank], payload, send, timeout),
            name=f"elastune-rank-{rank}",
        )
        process.start()
        send.close()  # the child holds its end; EOF here then means it is gone
        processes.append(process)
        pipes[receive] = rank
    return pipes


def _device_ids(backend: str, world_size: int, devices: Sequence[int] | None) -> list[int | None]:
    if backend == "gloo":
        if devices is not None:
            raise ValueError("devices apply to the nccl backend only; gloo runs on the CPU")
        return [None] * world_size
    if not torch.cuda.is_available():
        raise ValueError("backend nccl needs CUDA, which this machine lacks; use gloo")
    ids = list(range(world_size)) if devices is None else list(devices)
    if len(ids) != world_size:
        raise ValueError(f"devices lists {len(ids)} CUDA devices for world_size {world_size}")
    count = torch.cuda.device_count()
    for i in ids:
        if not 0 <= i < count:
            raise ValueError(f"CUDA device {i} does not exist (this machine has {count})")
    if len(set(ids)) != len(ids):
        raise ValueError(f"NCCL needs one CUDA device per rank, got devices {ids}")
    return list(ids)


# After the first failure, how long to gather the others so the root cause can be named:
# a rank that dies takes its peers down with "connection reset" errors a moment later.
FAILURE_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class _Failure:
    rank: int
    silent: bool  # died without a message: the root cause before any peer's error
    when: float  # wall clock the rank sent its error (or we saw it die)
    reason: str
    remote_traceback: str = ""


def _collect(
    processes: list[Any], pipes: dict[Connection, int], deadline: float, timeout: float
) -> Any:
    world_size = len(processes)
    finished: set[int] = set()
    failures: dict[int, _Failure] = {}
    result = None
    exits = {p.sentinel: rank for rank, p in enumerate(processes)}
    give_up = deadline
    while len(finished) + len(failures) < world_size:
        left = give_up - time.monotonic()
        if left <= 0:
            break
        for ready in wait([*pipes, *exits], timeout=left):
            if ready in pipes:
                rank = pipes.pop(ready)
                try:
                    status, *message = pickle.loads(ready.recv_bytes())
                except EOFError:
                    continue  # died without a word: its exit code tells the rest
                if status == "error":
                    failures[rank] = _Failure(rank, False, *message)
                else:
                    finished.add(rank)
                    result = message[0] if rank == 0 else result
            elif ready in exits:
                rank = exits.pop(ready)
                process = processes[rank]
                process.join()
                pipe = next((c for c, r in pipes.items() if r == rank), None)
                if pipe is not None and pipe.poll():
                    exits[ready] = rank  # its last message is still in the pipe
                    continue
                if rank not in finished and rank not in failures:
                    reason = f"{exit_reason(process.exitcode)} before reporting a result"
                    failures[rank] = _Failure(rank, True, time.time(), reason)
            if failures:
                give_up = min(give_up, time.monotonic() + FAILURE_GRACE_SECONDS)
    if failures:
        first = min(failures.values(), key=lambda f: (not f.silent, f.when, f.rank))
        error = DistributedError(first.rank, world_size, first.reason, first.remote_traceback)
        error.after = sorted(set(failures) - {first.rank})
        raise error
    if len(finished) < world_size:
        running = sorted(set(range(world_size)) - finished)
        raise TimeoutError(
            f"distributed run did not finish within {timeout:g} s; "
            f"ranks {running} of {world_size} were still running and were killed"
        )
    return result


def _rank_main(
    rank: int,
    world_size: int,
    backend: str,
    store: str,
    device_id: int | None,
    payload: bytes,
    pipe: Connection,
    timeout: float,
) -> None:
    failed = False
    scratch = os.path.dirname(store)
    threading.Thread(
        target=_exit_with_parent, args=(scratch,), name="rank-watchdog", daemon=True
    ).start()
    try:
        fn, args, kwargs = pickle.loads(payload)
        if backend == "nccl":
            torch.cuda.set_device(device_id)
            device = torch.device("cuda", device_id)
        else:
            device = torch.device("cpu")
            # Ranks share the CPU: without this each one starts a thread per core.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        dist.init_process_group(
            backend,
            init_method=f"file://{store}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout),
        )
        result = fn(DistContext(rank, world_size, device, backend), *args, **kwargs)
        pipe.send_bytes(pickle.dumps(("ok", result if rank == 0 else None)))
    except BaseException as exc:
        failed = True
        try:
            reason = f"{type(exc).__name__}: {exc}"
            error = ("error", time.time(), reason, traceback.format_exc())
            pipe.send_bytes(pickle.dumps(error))
        except Exception:
            pass  # the parent then reports the exit code
    finally:
        # A failed rank skips destroy: its peers may be blocked in a collective with it.
        if not failed and dist.is_initialized():
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        # docs/stack.md §6: a normal interpreter exit after destroy aborts 10-20% of the time.
        os._exit(1 if failed else 0)


def _exit_with_parent(scratch: str) -> None:
    """End this rank when the process that started it dies, however it dies (SIGKILL
    included): a rank left training would hold its GPU until its segment ended, for nobody.
    The sentinel is multiprocessing's own, a pipe only the starting process writes to. The
    run's ``scratch`` folder (its file store) goes too: the dead process cannot remove it."""
    parent = mp.parent_process()
    if parent is not None:
        wait([parent.sentinel])
        shutil.rmtree(scratch, ignore_errors=True)  # every rank tries; one is enough
        os._exit(1)


# --- world-size independent checkpoints ---------------------------------------------------


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel wrapper (or ``model`` itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


def save_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    **state: Any,
) -> None:
    """Write ``model`` (unwrapped, on CPU), ``optimizer`` and ``state`` to ``path``.

    Only rank 0 writes, atomically (temporary file, then rename); with a process group, every
    rank waits at a barrier until the file is complete. Data-parallel ranks hold identical
    parameters and optimizer state, so the file is the same whatever the world size.
    """
    path = Path(path)
    if not dist.is_initialized() or dist.get_rank() == 0:
        payload = {
            "model": _to_cpu(unwrap(model).state_dict()),
            "optimizer": None if optimizer is None else _to_cpu(optimizer.state_dict()),
            "state": state,
        }
        partial = path.with_name(path.name + ".partial")
        torch.save(payload, partial)
        os.replace(partial, path)
    if dist.is_initialized():
        dist.barrier()


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, Any]:
    """Load a :func:`save_checkpoint` file at any world size; returns its ``state``.

    The optimizer's tensors follow its parameters' device (``Optimizer.load_state_dict``).
    """
    device = next(unwrap(model).parameters()).device
    payload = torch.load(Path(path), map_location=device, weights_only=True)
    unwrap(model).load_state_dict(payload["model"])
    if optimizer is not None and payload["optimizer"] is not None:
        optimizer.load_state_dict(payload["optimizer"])
    return payload["state"]


# --- sharding with a fixed global batch ---------------------------------------------------


class GlobalBatches:
    """Index batches whose *global* composition does not depend on the world size.

    Each epoch draws a permutation seeded by ``(seed, epoch)``; global batch ``step`` is the
    next ``global_batch`` indices, cut into ``world_size`` equal slices, and a rank trains on
    its own slice. The last incomplete batch of an epoch is dropped, so every slice has the
    same size and averaging gradients over ranks equals the gradient of the global batch.
    Batches are addressed by global step, so a resumed trial continues exactly where it
    stopped, at any world size.

    Example:
        >>> [GlobalBatches(10, 4, rank, 2, seed=0).batch(0).tolist() for rank in (0, 1)]
        [[4, 1], [7, 5]]
        >>> GlobalBatches(10, 4, 0, 1, seed=0).batch(0).tolist()
        [4, 1, 7, 5]
    """

    def __init__(self, size: int, global_batch: int, rank: int, world_size: int, seed: int = 0):
        if not 1 <= global_batch <= size:
            raise ValueError(
                f"global_batch must lie in 1..{size} (the data size), got {global_batch}"
            )
        if global_batch % world_size:
            raise ValueError(
                f"global_batch {global_batch} is not divisible by world_size {world_size}"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in 0..{world_size - 1}, got {rank}")
        self.size, self.global_batch = size, global_batch
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self._epoch: tuple[int, torch.Tensor] | None = None

    def __len__(self) -> int:
        """Global batches per epoch."""
        return self.size // self.global_batch

    def batch(self, step: int) -> torch.Tensor:
        """This rank's indices of global batch ``step`` (counted from the start of training)."""
        epoch, index = divmod(step, len(self))
        if self._epoch is None or self._epoch[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch = (epoch, torch.randperm(self.size, generator=generator))
        local = self.global_batch // self.world_size
        start = index * self.global_batch + self.rank * local
        return self._epoch[1][start : start + local]


def mean_across_ranks(value: torch.Tensor) -> float:
    """The mean of a scalar over all ranks (e.g. the global batch's loss, for reporting)."""
    if not dist.is_initialized():
        return float(value)
    total = value.detach().clone().float().reshape(1)
    dist.all_reduce(total)
    return float(total) / dist.get_world_size()
