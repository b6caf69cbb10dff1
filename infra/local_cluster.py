"""A warm cluster on this machine: a Prefect server on loopback and N warm node workers
(docs/prefect-server.md, "Workers").

``python -m elastune.infra.local_cluster --nodes 2 --gpus-per-node 1`` starts them, prints the
``export`` lines that point a job at them (``elastune run JOB --pool $ELASTUNE_POOL``) and
stays in the foreground until Ctrl-C or SIGTERM, when it stops everything it started. Its
children get SIGTERM if it is SIGKILLed (:func:`elastune.infra.server.die_with_parent`), so nothing
is left behind. A node worker that dies is started again, as an ECS service replaces a
stopped task; the driver retries what it was running elsewhere.

:func:`running_cluster` is the context-manager core, which tests use::

    with running_cluster(Path("/tmp/cluster"), nodes=2, gpus_per_node=1) as cluster:
        print(cluster.api, cluster.pool)
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
from prefect.exceptions import ObjectAlreadyExists
from prefect.filesystems import LocalFileSystem, WritableFileSystem
from prefect.settings import PREFECT_API_URL, temporary_settings

from elastune.infra.prefect_pools import read_pool
from elastune.infra.server import die_with_parent, isolated_env, running_server, stop_group
from elastune.infra.warm_nodes import WARM_TYPE

DEFAULT_POOL = "warm"


def warm_template(storage: str) -> dict:
    """A warm pool's base job template: it records where segment parameters are stored."""
    return {
        "job_configuration": {"storage": "{{ storage }}"},
        "variables": {
            "type": "object",
            "properties": {"storage": {"type": "string", "default": storage}},
        },
    }


def create_warm_pool(pool: str, storage: Path | WritableFileSystem) -> str:
    """Create warm pool ``pool`` and the block its parameters are stored in (a folder here;
    across hosts, MLflow's artifact proxy: infra/netns_cluster.py; on ECS, a bucket:
    docs/ecs.md); returns the block's slug."""
    block = f"{pool}-segments"
    if isinstance(storage, Path):
        storage = LocalFileSystem(basepath=str(storage.resolve()))
    storage.save(block, overwrite=True)
    slug = f"{storage.get_block_type_slug()}/{block}"
    template = warm_template(slug)
    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(
                WorkPoolCreate(name=pool, type=WARM_TYPE, base_job_template=template)
            )
        except ObjectAlreadyExists:  # a server that had this cluster before
            read_pool(pool, WARM_TYPE)
            client.update_work_pool(pool, WorkPoolUpdate(base_job_template=template))
    return slug


@dataclass
class NodeProcess:
    """One node's warm worker, started again whenever it exits while the cluster runs."""

    name: str
    command: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen | None = None
    starts: int = 0

    def start(self) -> None:
        with self.log.open("a") as out:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.starts += 1


@dataclass
class Cluster:
    """A running cluster: its API URL, its warm pool and its node workers."""

    api: str
    pool: str
    nodes: list[NodeProcess]
    stopping: threading.Event = field(default_factory=threading.Event)

    def exports(self) -> str:
        return f"export PREFECT_API_URL={self.api}\nexport ELASTUNE_POOL={self.pool}"

    def wait_up(self, timeout: float = 120.0) -> None:
        """Wait until every node has sent a heartbeat (imports take seconds on a busy box)."""
        deadline = time.monotonic() + timeout
        with get_client(sync_client=True) as client:
            while True:
                named = {w.name.split("/")[0] for w in client.read_workers_for_work_pool(self.pool)}
                if named >= {node.name for node in self.nodes}:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"warm nodes of {self.pool!r} not up after {timeout:g} s")
                time.sleep(0.3)

    def supervise(self, poll: float = 0.5) -> None:
        """Start again every node worker that exits, until the cluster stops."""
        while not self.stopping.wait(poll):
            for node in self.nodes:
                if node.process is not None and node.process.poll() is not None:
                    node.start()


@contextlib.contextmanager
def running_cluster(
    home: Path,
    nodes: int,
    gpus_per_node: float,
    pool: str = DEFAULT_POOL,
    database: str | None = None,
) -> Iterator[Cluster]:
    """A server and ``nodes`` warm workers of ``gpus_per_node`` GPUs (CPU slots) each, all
    stopped at exit; this process's Prefect client talks to the server meanwhile.
    ``database``: the server's database URL (None: SQLite in ``home``)."""
    with (
        running_server(home / "server", database=database) as api,
        temporary_settings({PREFECT_API_URL: api}),
        warm_nodes(api, home, nodes, gpus_per_node, pool) as cluster,
    ):
        yield cluster


@contextlib.contextmanager
def warm_nodes(
    api: str, home: Path, nodes: int, gpus_per_node: float, pool: str = DEFAULT_POOL
) -> Iterator[Cluster]:
    """Create warm pool ``pool`` on the server at ``api`` (this process's client must talk
    to it) and run ``nodes`` warm workers for it, restarted if they die, stopped at exit."""
    if nodes < 1 or gpus_per_node <= 0:
        raise ValueError(f"need nodes >= 1 and gpus_per_node > 0, got {nodes}, {gpus_per_node}")
    storage = create_warm_pool(pool, home / f"{pool}-segments")
    # The nodes share this machine's cores, as local mode's workers share the driver's.
    threads = max(1, (os.cpu_count() or 1) // math.ceil(nodes * gpus_per_node))
    cluster = Cluster(api, pool, [])
    for index in range(nodes):
        name = f"node-{index}"
        command = [sys.executable, "-m", "elastune.flows.segment", "--pool", pool, "--node", name]
        command += ["--gpus", f"{gpus_per_node:g}", "--storage", storage]
        command += ["--threads", str(threads)]
        folder = home / f"{pool}-{name}"
        folder.mkdir(parents=True, exist_ok=True)
        env = isolated_env(folder, PREFECT_API_URL=api)
        cluster.nodes.append(NodeProcess(name, command, env, folder / "worker.log"))
    for node in cluster.nodes:
        node.start()
    supervisor = threading.Thread(target=cluster.supervise, daemon=True)
    supervisor.start()
    try:
        cluster.wait_up()
        yield cluster
    finally:
        cluster.stopping.set()
        supervisor.join()
        for node in cluster.nodes:
            if node.process is not None:
                stop_group(node.process, signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A Prefect server and warm node workers.")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus-per-node", type=float, default=1.0)
    parser.add_argument("--pool", default=DEFAULT_POOL)
    parser.add_argument("--home", type=Path, default=Path(".elastune/cluster"))
    parser.add_argument("--api", help="a running server's API URL: start no server, only nodes")
    parser.add_argument(
        "--database",
        help="the server's database, e.g. postgresql+asyncpg://user@host:5432/prefect "
        "(default: SQLite in --home; Prefect recommends PostgreSQL for many writers)",
    )
    args = parser.parse_args(argv)
    if args.api is not None and args.database is not None:
        parser.error("--database: the server at --api has its own database")
    # SIGTERM unwinds like Ctrl-C, through the clean-up of the context managers.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.api is None:
        cluster = running_cluster(
            args.home, args.nodes, args.gpus_per_node, args.pool, args.database
        )
    else:
        cluster = on_server(args.api, args.home, args.nodes, args.gpus_per_node, args.pool)
    with contextlib.suppress(KeyboardInterrupt), cluster as running:
        print(running.exports(), flush=True)
        threading.Event().wait()


@contextlib.contextmanager
def on_server(
    api: str, home: Path, nodes: int, gpus_per_node: float, pool: str
) -> Iterator[Cluster]:
    """:func:`warm_nodes` for the server at ``api``."""
    with (
        temporary_settings({PREFECT_API_URL: api}),
        warm_nodes(api, home, nodes, gpus_per_node, pool) as cluster,
    ):
        yield cluster


if __name__ == "__main__":
    main()
