"""Where a work-pool segment trains: a warm node worker (``warm_segment``) or a flow run.

Warm workers (docs/prefect-server.md, "A job in work-pool mode"): each node runs one
long-lived Prefect task worker, ``python -m elastune.flows.segment --pool POOL --node NAME --gpus
G``, that serves the background task ``warm-segment`` under a task key of its own
(:func:`node_key`), so the driver decides which node a segment goes to. Each segment trains
in a worker process forked from the node (tasks/worker_processes.py): imports are paid
once per node, and a worker, with its data and CUDA context, is kept for the next segment. A segment
the driver queued behind others waits for the node's GPUs (:class:`GpuGate`). The
node also heartbeats to the work pool as a Prefect worker named after itself, its GPUs and
its process (:class:`Node`): that is how the driver finds live nodes and notices a dead
one.

The flow-run mode (process and ECS pools): the tune flow launches ``train-segment`` through
the pool's deployment, one flow run (a fresh process) per segment.

Checkpoints and the segment's report travel through the MLflow artifact store in both modes,
so any node can resume any trial and the driver reads the result from the same place.

Example (the task key of a node):
    >>> node_key("warm", "node-0")
    'elastune-segment/warm/node-0'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import math
import os
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import torch
from prefect import flow, task
from prefect.blocks.core import Block
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.context import AsyncClientContext, SyncClientContext
from prefect.task_worker import StopTaskWorker, TaskWorker
from prefect.tasks import Task

from elastune.flows.gc_freeze import exit_uncollected
from elastune.infra import artifact_storage  # noqa: F401  (its block type, for Block.aload)
from elastune.infra.warm_nodes import HEARTBEAT_SECONDS, Node
from elastune.planners.search import Segment
from elastune.planners.staging.devices import LocalDevices
from elastune.planners.staging.placement import fits
from elastune.tasks.contract import JobRef
from elastune.tasks.fence import fenced_call
from elastune.tasks.gpus import cuda_devices
from elastune.tasks.train import run_segment, train_in_worker
from elastune.tasks.worker_processes import NVML_CHECK, WorkerProcesses, fork_server_here

FLOW_NAME = "train-segment"


class WorkerLost(RuntimeError):
    """A segment ended without a report: its worker, node or instance died."""


def node_key(pool: str, node: str) -> str:
    """The task key a node serves: a segment sent under it runs on that node only."""
    return f"elastune-segment/{pool}/{node}"


@flow(name=FLOW_NAME, flow_run_name="{job[job_id]} trial-{segment[trial]}")
def train_segment_flow(
    job: dict[str, Any], segment: dict[str, Any], config: dict[str, Any], run_id: str
) -> dict[str, Any]:
    exit_uncollected()  # the flow run's process ends with it, 2-3 s of a core sooner
    return run_segment(JobRef(**job), Segment(**segment), config, run_id).to_dict()


def flow_parameters(job: JobRef, segment: Segment, config: dict[str, Any], run_id: str) -> dict:
    return {"job": asdict(job), "segment": asdict(segment), "config": config, "run_id": run_id}


# The node's devices, set once by serve(); None on a machine without CUDA.
_devices: LocalDevices | None = None
_devices_lock = threading.Lock()


class GpuGate:
    """A node's GPUs (CPU slots) as its segments hold them: a segment the driver queued
    behind others waits here until as many are free as it needs.

    Example:
        >>> gate = GpuGate(2.0)
        >>> with gate.held(1.0), gate.held(1.0):
        ...     gate.free
        0.0
        >>> gate.free
        2.0
    """

    def __init__(self, gpus: float) -> None:
        self.free = gpus
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def held(self, gpus: float) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: fits(self.free, gpus))
            self.free -= gpus
        try:
            yield
        finally:
            with self._changed:
                self.free += gpus
                self._changed.notify_all()


# The node's GPUs, set once by serve(); the default never blocks (a test's worker).
_gate = GpuGate(math.inf)
# The node's worker processes, where its segments train (set by serve()).
_workers: WorkerProcesses | None = None


@task(name="warm-segment", cache_policy=NO_CACHE)
def warm_segment(
    job: JobRef,
    segment: Segment,
    config: dict[str, Any],
    run_id: str,
    fence: str,
    artifacts: str | None = None,
) -> None:
    """Train one segment on this node once its GPUs are free (within ``job.segment_timeout``,
    as in local mode), in a worker process of the node's; the report goes to MLflow, where
    the driver reads it. ``fence`` is the launch's token: once the driver gives up on this
    launch, MLflow refuses its writes (tasks/fence.py); and it makes each launch's inputs
    unique, so no cache ever answers for a retry. ``artifacts``: the run's artifact
    location, which the node would otherwise ask MLflow for."""
    with _gate.held(segment.gpus):
        with _devices_lock:
            ids = None if _devices is None else _devices.take(segment.trial, segment.gpus)
        try:
            if _workers is None:  # a test's worker, in this process
                fenced_call(
                    fence,
                    run_segment,
                    job,
                    segment,
                    config,
                    run_id,
                    gpu_ids=ids,
                    artifacts=artifacts,
                )
                return
            train_in_worker(
                _workers, job, segment, config, run_id, ids, fence=fence, artifacts=artifacts
            )
        finally:
            if _devices is not None:
                with _devices_lock:
                    _devices.release(segment.trial)


def keyed(segment_task: Task[..., Any], key: str) -> Task[..., Any]:
    """``segment_task`` under task key ``key`` (Prefect derives keys from the function, so
    every node's runs would otherwise share one queue)."""
    segment_task.task_key = key
    return segment_task


def heartbeat(pool: str, node: Node, stop: threading.Event) -> None:
    """Tell the pool this node is alive, every :data:`HEARTBEAT_SECONDS`, until ``stop``."""
    with get_client(sync_client=True) as client:
        while not stop.is_set():
            try:
                client.send_worker_heartbeat(pool, node.worker_name, HEARTBEAT_SECONDS)
            except Exception as exc:  # the server restarts, or this node's link is down
                logging.getLogger("elastune").warning("heartbeat not sent: %s", exc)
            stop.wait(HEARTBEAT_SECONDS)


async def serve(pool: str, node: Node, storage: str, threads: int | None = None) -> None:
    """Run ``node``'s warm worker until cancelled: segments sent to its key, each training
    once the node's GPUs it needs are free (the driver queues at most the node's GPUs'
    worth behind them). ``threads``: torch's threads per segment; default, the machine's
    cores shared by the node's slots."""
    global _devices, _gate, _workers
    count = cuda_devices()
    _devices = LocalDevices(count) if count else None
    _gate = GpuGate(node.gpus)
    # Threads share the cores: more threads than cores make torch's workers spin-wait.
    slots = max(1, round(node.gpus))
    _workers = WorkerProcesses(threads or max(1, torch.get_num_threads() // slots))
    key = node_key(pool, node.name)
    # The block is read once, not once per segment.
    block = await Block.aload(storage)
    worker = TaskWorker(keyed(warm_segment.with_options(result_storage=block), key), limit=None)
    for served in worker.tasks:  # TaskWorker re-derives the key when it copies the task
        keyed(served, key)
        # TaskWorker gives an uncached task Prefect's default policy, whose lookup of a
        # cached result costs each segment a read of the storage block; a launch's fence
        # token makes its inputs unique, so that lookup never finds one.
        served.cache_policy = NO_CACHE
    stop = threading.Event()
    beat = threading.Thread(target=heartbeat, args=(pool, node, stop), daemon=True)
    beat.start()
    try:
        # One client of each kind for every run on this node: without them, a run builds
        # three (the parameters' storage, the run's context, its engine), each loading
        # the CA bundle into a new SSL context (docs/prefect-server.md, "What a Prefect
        # server costs").
        async with AsyncClientContext.get_or_create():
            with SyncClientContext.get_or_create():
                await worker.start()
    finally:
        stop.set()
        _workers.close()


def ecs_task_id(metadata_uri: str) -> str:
    """The id of the ECS task this container runs in, read from the task metadata endpoint
    v4 (``$ECS_CONTAINER_METADATA_URI_V4/task``). A DAEMON service runs one warm worker
    per instance (docs/ecs.md, "5. The warm workers"), so the id names the node."""
    with urllib.request.urlopen(f"{metadata_uri}/task", timeout=10) as response:
        return json.load(response)["TaskARN"].rsplit("/", 1)[-1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="One node's warm segment worker.")
    parser.add_argument("--pool", required=True, help="the warm work pool (type elastune-warm)")
    naming = parser.add_mutually_exclusive_group(required=True)
    naming.add_argument("--node", help="this node's name, unique in the pool")
    naming.add_argument(
        "--node-from-ecs", action="store_true", help="name the node after its ECS task's id"
    )
    parser.add_argument("--gpus", type=float, required=True, help="GPUs (CPU slots) offered")
    parser.add_argument("--storage", required=True, help="block slug for segment parameters")
    parser.add_argument("--threads", type=int, help="torch threads per segment")
    args = parser.parse_args(argv)
    name = args.node
    if args.node_from_ecs:
        uri = os.environ.get("ECS_CONTAINER_METADATA_URI_V4")
        if not uri:
            parser.error("--node-from-ecs: ECS_CONTAINER_METADATA_URI_V4 is not set (not on ECS?)")
        name = ecs_task_id(uri)
    # What the node imported (torch, Prefect: about a million objects) is left out of the
    # full collections that would each stop its segments' threads (flows/cli.py).
    gc.freeze()
    # Its segments train in worker processes forked from a copy of it made now, its imports
    # done and no thread started, and CUDA never set up here: torch asks NVML whether
    # there is a GPU (tasks/worker_processes.py).
    os.environ.setdefault(NVML_CHECK, "1")
    fork_server_here()
    # SIGTERM (the cluster stopping) ends the worker through StopTaskWorker: a clean exit.
    with contextlib.suppress(StopTaskWorker):
        node = Node(name, args.gpus, os.getpid())
        asyncio.run(serve(args.pool, node, args.storage, args.threads))


if __name__ == "__main__":
    main()
