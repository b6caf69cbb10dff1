"""A cluster of hosts on this machine that share nothing but a network: each host a Linux
network namespace with its own address and its own folder (:mod:`elastune.infra.netns`,
:mod:`elastune.infra.cluster_layout`).

::

    python -m elastune.infra.netns_cluster up        # prints how to run a job on it
    python -m elastune.infra.netns_cluster run driver -- elastune run JOB --pool warm ...
    python -m elastune.infra.netns_cluster cut node-1 / mend node-1   # its link down / up
    python -m elastune.infra.netns_cluster down      # leaves nothing behind

``up`` needs root and ``ip``, and refuses (one line, exit 2) when the cluster is up already;
one that fails half way removes what it made. It starts one supervisor per host
(:mod:`elastune.infra.cluster_host`) and returns once every host is ready and every node
worker beats. ``down`` stops the supervisors, kills whatever else still runs in the hosts'
namespaces (a job's driver, say), deletes the namespaces (their links and the bridge with
them) and the cluster's folder. ``run HOST -- CMD`` runs CMD on a host, with the host's
environment and secrets (by environment, never on a command line).

From Python, :func:`brought_up` holds a cluster for a block (the tests' and the benchmarks'
clusters): it goes down after the block, and also when the process holding it is killed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from elastune.infra.cluster_host import read_secrets, secrets_text, write_private
from elastune.infra.cluster_layout import (
    DRIVER,
    POOL,
    SERVICES,
    Layout,
    basic_auth_ini,
    client_secrets,
    host_env,
    host_spec,
    new_secrets,
    pg_hba,
    pgpass,
    postgres_bin,
    services_secrets,
)
from elastune.infra.netns import Net, NetnsError, can_make_namespaces
from elastune.infra.postgres import PostgresError, ensure_postgres, initdb

DEFAULT_NAME = "elastune"
READY_TIMEOUT = 300.0


class ClusterError(RuntimeError):
    """The cluster could not be brought up or used; the message is one line."""


class Refused(ClusterError):
    """The cluster cannot come up here (not root, no ip, up already): exit 2."""


def default_root(name: str) -> Path:
    return Path(tempfile.gettempdir()) / f"{name}-cluster"


def layout_of(root: Path) -> Layout:
    """The layout of the cluster whose folder is ``root`` (written by :func:`up`)."""
    data = json.loads((root / "cluster.json").read_text())
    return Layout(**{**data, "root": Path(data["root"]), "code": Path(data["code"])})


def refusal(layout: Layout) -> str | None:
    """Why cluster ``layout`` cannot come up here; None when it can."""
    cannot = can_make_namespaces()
    if cannot is not None:
        return cannot
    if Net(layout.name).existing() or layout.root.exists():
        return f"cluster {layout.name!r} is up already ({layout.root}); bring it down first"
    if postgres_bin() is None and shutil.which("apt-get") is None:
        return "needs PostgreSQL (Debian: apt-get install postgresql)"
    return None


def up(layout: Layout) -> None:
    """Bring the cluster up; on any failure, remove what was made and raise."""
    problem = refusal(layout)
    if problem is not None:
        raise Refused(problem)
    ensure_postgres()
    try:
        lay_out(layout)
        supervisors = {SERVICES: start_host(layout, SERVICES)}
        wait_ready(layout, SERVICES, supervisors[SERVICES])
        supervisors.update({node: start_host(layout, node) for node in layout.node_names})
        for node in layout.node_names:
            wait_ready(layout, node, supervisors[node])
        wait_nodes(layout)
    except BaseException:
        down(layout)
        raise


# What a cluster's holder tells its watcher once it has brought the cluster down itself.
KEPT = "down already"


@contextlib.contextmanager
def brought_up(layout: Layout) -> Iterator[Layout]:
    """Cluster ``layout``, up for the block and down after it, whatever happens to this
    process: a watcher of its own, in a session of its own, holds a pipe from it and brings
    the cluster down when the pipe closes unsaid, this process killed (a cancelled CI job,
    a test worker ended) before it could."""
    watch = "import sys; from elastune.infra.netns_cluster import down_unless_kept as d; d()"
    watcher = subprocess.Popen(
        [sys.executable, "-c", watch, "--name", layout.name, "--root", str(layout.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        up(layout)
        yield layout
    finally:
        down(layout)
        watcher.communicate(KEPT, timeout=30)


def down_unless_kept() -> None:
    """A watcher's life: wait for its holder's word on stdin, and bring the cluster
    (``sys.argv``: ``--name N --root R``) down unless it is :data:`KEPT`."""
    if sys.stdin.read() != KEPT:
        main([*sys.argv[1:], "down"])


def lay_out(layout: Layout) -> None:
    """The namespaces, folders, secrets and PostgreSQL's data folder of a new cluster."""
    layout.root.mkdir(parents=True, mode=0o711)
    (layout.root / "cluster.json").write_text(
        json.dumps({**asdict(layout), "root": str(layout.root), "code": str(layout.code)})
    )
    net = Net(layout.name)
    net.make_switch()
    made = new_secrets()
    for host in layout.hosts:
        net.add_host(host, layout.address(host), 24)
        folder = layout.folder(host)
        for sub in ("", "tmp", "prefect", "cache"):
            (folder / sub).mkdir(mode=0o711, exist_ok=True)
        secrets = services_secrets(layout, made) if host == SERVICES else client_secrets(made)
        write_private(folder / "secrets.env", secrets_text(secrets))
        write_private(folder / ".pgpass", pgpass(layout, made, host))
        host_spec(layout, host).save(folder / "host.json")
    services = layout.folder(SERVICES)
    (services / "basic_auth.ini").write_text(basic_auth_ini(layout))
    initdb(services / "postgres", services / "pg-socket", pg_hba(layout))


def start_host(layout: Layout, host: str) -> subprocess.Popen:
    """Start ``host``'s supervisor in its namespace, in a session of its own: it outlives
    this command."""
    folder = layout.folder(host)
    command = ["ip", "netns", "exec", Net(layout.name).namespace(host)]
    command += [sys.executable, "-m", "elastune.infra.cluster_host", str(folder / "host.json")]
    with (folder / "supervisor.log").open("a") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **host_env(layout, host)},
            cwd=folder,
        )
    (folder / "supervisor.pid").write_text(str(process.pid))
    return process


def status(layout: Layout, host: str) -> dict:
    """What ``host``'s supervisor last wrote of its programs (empty before it wrote)."""
    path = layout.folder(host) / "status.json"
    return json.loads(path.read_text()) if path.exists() else {}


def wait_ready(
    layout: Layout, host: str, supervisor: subprocess.Popen, timeout: float = READY_TIMEOUT
) -> None:
    deadline = time.monotonic() + timeout
    while not status(layout, host).get("ready"):
        if supervisor.poll() is not None:
            log = layout.folder(host) / "supervisor.log"
            tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
            raise ClusterError(f"host {host} did not come up: {' '.join(tail) or 'see its logs'}")
        if time.monotonic() > deadline:
            raise ClusterError(f"host {host} not ready after {timeout:g} s")
        time.sleep(0.2)


def wait_nodes(layout: Layout) -> None:
    """Wait, from the driver's host, until every node worker beats."""
    code = (
        "import sys, time; from elastune.infra.warm_nodes import live_nodes\n"
        "deadline = time.monotonic() + 180\n"
        "while len({n.name for n in live_nodes(sys.argv[1])}) < int(sys.argv[2]):\n"
        "    assert time.monotonic() < deadline, 'node workers not beating after 180 s'\n"
        "    time.sleep(0.5)\n"
    )
    done = run(layout, DRIVER, [sys.executable, "-c", code, POOL, str(layout.nodes)], capture=True)
    if done.returncode != 0:
        raise ClusterError(f"node workers did not come up: {done.stderr.strip()[-300:]}")


def host_command(
    layout: Layout, host: str, command: list[str], env: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``command`` on ``host``, with the host's
    environment and secrets, and ``env`` (each value's "{folder}" the host's folder)."""
    folder = layout.folder(host)
    extra = {key: value.replace("{folder}", str(folder)) for key, value in (env or {}).items()}
    secrets = read_secrets(folder / "secrets.env")
    full = {**os.environ, **host_env(layout, host), **secrets, **extra}
    return ["ip", "netns", "exec", Net(layout.name).namespace(host), *command], full


def run(
    layout: Layout, host: str, command: list[str], capture: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on ``host`` with the host's environment and secrets."""
    argv, env = host_command(layout, host, command)
    return subprocess.run(argv, env=env, capture_output=capture, text=True, check=False)


def down(layout: Layout) -> None:
    """Stop every host's supervisor and whatever else runs on the hosts; delete the
    namespaces and the cluster's folder."""
    for host in reversed(layout.hosts):
        pid_file = layout.folder(host) / "supervisor.pid"
        if pid_file.exists():
            stop_supervisor(int(pid_file.read_text()))
    Net(layout.name).remove(layout.hosts)
    shutil.rmtree(layout.root, ignore_errors=True)


def stop_supervisor(pid: int, grace: float = 30.0) -> None:
    """SIGTERM a supervisor (it stops its programs) and wait for it to go, at most ``grace``."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                with contextlib.suppress(ChildProcessError):  # reaped here if it is ours
                    os.waitpid(pid, 0)
                return
        time.sleep(0.1)


def usage(layout: Layout) -> str:
    here = "python -m elastune.infra.netns_cluster"
    name = "" if layout.name == DEFAULT_NAME else f" --name {layout.name}"
    sets = " ".join(f"--set {value}" for value in layout.job_overrides())
    return (
        f"cluster {layout.name} is up: services {layout.address(SERVICES)} (PostgreSQL, "
        f"Prefect {layout.prefect_api}, MLflow {layout.mlflow_uri}), driver "
        f"{layout.address(DRIVER)}, nodes {', '.join(layout.node_names)}\n"
        f"run a job from the driver's host:\n"
        f"  {here}{name} run driver -- elastune run examples/digits.yaml --pool {POOL} {sets}\n"
        f"bring it down:\n  {here}{name} down"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # run's command is what follows "--", so that its own options are its own.
    split = argv.index("--") if "--" in argv else len(argv)
    argv, command = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(description="A cluster of hosts in network namespaces.")
    parser.add_argument("action", choices=["up", "down", "run", "cut", "mend"])
    parser.add_argument("host", nargs="?", help="run, cut, mend: the host")
    parser.add_argument("--name", default=DEFAULT_NAME, help="namespaces' prefix")
    parser.add_argument("--root", type=Path, help="the cluster's folder (default: in $TMPDIR)")
    parser.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args(argv)
    args.command = command
    if args.action == "run" and not command:
        parser.error("run: give the command after --, e.g. run driver -- elastune run JOB")
    root = args.root or default_root(args.name)
    try:
        return act(args, root)
    except (ClusterError, NetnsError, PostgresError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, Refused) else 1


def act(args: argparse.Namespace, root: Path) -> int:
    if args.action == "up":
        if args.nodes < 1:
            raise Refused(f"--nodes: need at least 1, got {args.nodes}")
        layout = Layout(args.name, root.resolve(), Path.cwd(), nodes=args.nodes)
        up(layout)
        print(usage(layout))
        return 0
    if not (root / "cluster.json").exists():
        left = Net(args.name).existing()
        if args.action == "down" and left:  # namespaces of a cluster whose folder is gone
            Net(args.name).remove([ns.removeprefix(f"{args.name}-") for ns in left])
        print(f"cluster {args.name!r} is not up", file=sys.stderr)
        return 0 if args.action == "down" else 2
    layout = layout_of(root)
    if args.action == "down":
        down(layout)
        return 0
    if args.host not in layout.hosts:
        raise Refused(f"host: {args.host!r} is none of {', '.join(layout.hosts)}")
    if args.action == "run":
        return run(layout, args.host, args.command).returncode
    getattr(Net(layout.name), args.action)(args.host)
    return 0


if __name__ == "__main__":
    sys.exit(main())
