"""A cluster of hosts that share nothing but a network (infra/netns_cluster.py): brought up
once for the module, it must let no host reach an address outside it, refuse whoever lacks
the credentials, leak no secret, run a job from the driver's host, survive the six faults
of benchmarks/faults.py, and leave nothing behind once brought down.

Needs root, ``ip`` (and network namespaces) and PostgreSQL (``.ci/run`` installs it); each
test says why it skips where one is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect.results import ResultRecord

from benchmarks import faults
from elastune.infra import netns_cluster
from elastune.infra.cluster_host import read_secrets
from elastune.infra.cluster_layout import DRIVER, SERVICES, Layout, postgres_bin
from elastune.infra.netns import Net, can_make_namespaces, ip

EPOCH_SECONDS = 0.5


def missing() -> str | None:
    """Why the cluster cannot come up on this machine, if it cannot."""
    cannot = can_make_namespaces()
    if cannot is not None:
        return f"the cluster {cannot}"
    probe = f"elastune-probe-{os.getpid()}"
    if ip("netns", "add", probe, check=False).returncode != 0:
        return "the cluster needs network namespaces (ip netns add failed)"
    ip("netns", "del", probe, check=False)
    if postgres_bin() is None:
        return "the cluster needs PostgreSQL (apt-get install postgresql; .ci/run does)"
    return None


needs_cluster = pytest.mark.skipif(missing() is not None, reason=str(missing()))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Layout]:
    """One cluster for the module, brought down after it; nothing of it may be left. Named
    after the test process: should pytest-xdist split the module, each worker has its own."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    layout = faults.fault_layout(f"elastune-test-{worker}", EPOCH_SECONDS)
    with netns_cluster.brought_up(layout):
        yield layout
    assert faults.leftovers(layout) == []


def on_host(layout: Layout, host: str, code: str, secrets: bool = True) -> str:
    """Run Python ``code`` on ``host`` (without the host's secrets unless ``secrets``); its
    stdout."""
    argv, env = netns_cluster.host_command(layout, host, [sys.executable, "-c", code])
    if not secrets:
        for key in read_secrets(layout.folder(host) / "secrets.env"):
            env.pop(key, None)
        env.pop("PGPASSFILE")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


# --- bringing it up and down ---------------------------------------------------------------


def test_up_refuses_without_root_or_ip_in_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert netns_cluster.main(["up", "--name", "elastune-never"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: needs root (network namespaces): run it as root"
    ]
    monkeypatch.undo()
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert netns_cluster.main(["up", "--name", "elastune-never"]) == 2
    assert "needs the ip command" in capsys.readouterr().err
    assert not Path(netns_cluster.default_root("elastune-never")).exists()


@needs_cluster
def test_an_up_that_fails_half_way_removes_what_it_made(monkeypatch) -> None:
    layout = Layout("elastune-half", netns_cluster.default_root("elastune-half"), Path.cwd())

    def fail(*args: Any) -> None:
        raise netns_cluster.ClusterError("the services host broke")

    monkeypatch.setattr(netns_cluster, "start_host", fail)
    with pytest.raises(netns_cluster.ClusterError, match="broke"):
        netns_cluster.up(layout)
    assert faults.leftovers(layout) == []


# A holder of a cluster, killed once the cluster's namespaces and folder are made: here,
# while it brings the cluster up (the hosts' start never returns).
HOLDER = """
import sys, time
from pathlib import Path
from elastune.infra import netns_cluster
from elastune.infra.cluster_layout import Layout

def never(layout, host):
    print("laid out", flush=True)
    time.sleep(600)

netns_cluster.start_host = never
with netns_cluster.brought_up(Layout(sys.argv[1], Path(sys.argv[2]), Path.cwd())):
    pass
"""


@needs_cluster
def test_a_cluster_goes_down_when_its_holder_is_killed() -> None:
    """A test worker or a CI job killed leaves no cluster behind: its watcher brings it down."""
    layout = Layout("elastune-held", netns_cluster.default_root("elastune-held"), Path.cwd())
    command = [sys.executable, "-c", HOLDER, layout.name, str(layout.root)]
    holder = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "laid out\n"
        assert Net(layout.name).existing() and layout.root.exists()
        holder.kill()
        holder.wait()
        faults.wait_for(lambda: faults.leftovers(layout) == [], 60, "the cluster down")
    finally:
        holder.kill()
        netns_cluster.down(layout)


@pytest.mark.slow
@needs_cluster
def test_a_second_up_is_refused_in_one_line(cluster, capsys) -> None:
    code = netns_cluster.main(["up", "--name", cluster.name, "--root", str(cluster.root)])
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"cluster {cluster.name!r} is up already" in line


# --- the network ----------------------------------------------------------------------------

CONNECT = """
import errno, json, socket, sys
out = {}
for address in json.loads(sys.argv[1]):
    with socket.socket() as s:
        s.settimeout(3)
        try:
            s.connect((address, 80))
            out[address] = "connected"
        except OSError as exc:
            out[address] = errno.errorcode.get(exc.errno, str(exc))
print(json.dumps(out))
"""


def root_addresses() -> list[str]:
    """The root namespace's IPv4 addresses, but loopback (a host's 127.0.0.1 is its own)."""
    listed = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    found = [line.split()[3].split("/")[0] for line in listed.splitlines()]
    return [a for a in found if not a.startswith("127.")]


@pytest.mark.slow
@needs_cluster
def test_no_host_reaches_an_address_outside_the_cluster(cluster) -> None:
    outside = ["1.1.1.1", "10.77.1.1", "192.168.0.1", *root_addresses()]
    for host in cluster.hosts:
        routes = ip("-n", Net(cluster.name).namespace(host), "route", "show").stdout
        assert "default" not in routes and routes.strip(), routes
        code = f"{CONNECT}\n".replace("sys.argv[1]", repr(json.dumps(outside)))
        reached = json.loads(on_host(cluster, host, code))
        assert set(reached.values()) == {"ENETUNREACH"}, (host, reached)
    # Inside, the hosts reach each other: the driver reaches the services host.
    inside = json.loads(on_host(cluster, DRIVER, CONNECT.replace(
        "sys.argv[1]", repr(json.dumps([cluster.address(SERVICES)])))))  # fmt: skip
    assert inside[cluster.address(SERVICES)] in ("connected", "ECONNREFUSED")


# --- who may come in ------------------------------------------------------------------------

KNOCK = """
import base64, json, os, urllib.request, urllib.error
services = os.environ["SERVICES"]
def status(url, auth=None, body=None):
    request = urllib.request.Request(url, data=body, method="POST" if body else "GET")
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    if body:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
mlflow = f"http://{services}:5000/api/2.0/mlflow/experiments/search?max_results=1"
artifact = f"http://{services}:5000/api/2.0/mlflow-artifacts/artifacts/elastune-pools/warm/x"
prefect = f"http://{services}:4200/api/work_pools/filter"
user = os.environ.get("MLFLOW_TRACKING_USERNAME", "elastune")
mine = {"mlflow": f"{user}:{os.environ.get('MLFLOW_TRACKING_PASSWORD')}",
        "prefect": os.environ.get("PREFECT_API_AUTH_STRING")}
out = {}
for name, url, body in (("mlflow", mlflow, None), ("artifacts", artifact, None),
                        ("prefect", prefect, b"{}")):
    key = "prefect" if name == "prefect" else "mlflow"
    out[name] = [status(url, None, body), status(url, "elastune:wrong", body),
                 status(url, mine[key], body) if mine[key] else None]
import psycopg2
for name, user_, password in (("optuna", "optuna", "wrong"), ("prefect", "prefect", None)):
    try:
        psycopg2.connect(host=services, dbname=name, user=user_, password=password,
                         connect_timeout=10).close()
        out["postgres-" + name] = "connected"
    except psycopg2.OperationalError as exc:
        out["postgres-" + name] = str(exc).strip().splitlines()[-1]
print(json.dumps(out))
"""


@pytest.mark.slow
@needs_cluster
def test_the_services_refuse_a_host_without_credentials(cluster) -> None:
    code = KNOCK.replace('os.environ["SERVICES"]', repr(cluster.address(SERVICES)))
    stranger = json.loads(on_host(cluster, DRIVER, code, secrets=False))
    for service in ("mlflow", "artifacts", "prefect"):
        assert stranger[service][:2] == [401, 401], (service, stranger)
    assert "password authentication failed" in stranger["postgres-optuna"]
    assert "no pg_hba.conf entry" in stranger["postgres-prefect"]
    member = json.loads(on_host(cluster, DRIVER, code))
    assert member["mlflow"][2] == 200 and member["prefect"][2] == 200, member
    assert member["artifacts"][2] == 404  # let in: there is no such file


DUMP = """
import json
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
client = MlflowClient()
out = []
for experiment in client.search_experiments():
    for run in client.search_runs([experiment.experiment_id]):
        out += [run.data.params, run.data.tags]
with get_client(sync_client=True) as prefect:
    out += [[log.message for log in prefect.read_logs()]]
    out += [run.parameters for run in prefect.read_flow_runs()]
print(json.dumps(out, default=str))
"""


def secrets_of(layout: Layout) -> list[str]:
    """Every secret of the cluster (the services host holds them all)."""
    held = read_secrets(layout.folder(SERVICES) / "secrets.env")
    return [value.split(":")[-1] for value in held.values() if len(value) > 16]


@pytest.mark.slow
@needs_cluster
def test_no_secret_in_a_log_a_parameter_an_artifact_or_a_command_line(cluster, fault_free) -> None:
    secrets = secrets_of(cluster)
    assert len(secrets) >= 7
    listing = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                listing.append((entry / "cmdline").read_bytes().decode(errors="replace"))
            except OSError:  # it ended meanwhile
                continue
    private = {"secrets.env", ".pgpass", "postgres", "mlflow-auth.db"}
    written, decoded = [], 0
    for path in cluster.root.rglob("*"):
        if path.is_file() and private.isdisjoint(path.relative_to(cluster.root).parts):
            written.append(path.read_bytes().decode(errors="replace"))
            if path.parent.name == "parameters":  # a segment's: pickled and base64-encoded
                written.append(repr(ResultRecord.deserialize(path.read_bytes()).result))
                decoded += 1
    assert decoded, "no segment parameters found to read"
    recorded = on_host(cluster, DRIVER, DUMP)
    for secret in secrets:
        assert not any(secret in line for line in listing), "a secret on a command line"
        assert not any(secret in text for text in written), "a secret in a file"
        assert secret not in recorded, "a secret in MLflow or Prefect"


# --- a job, and the faults ------------------------------------------------------------------


@pytest.fixture(scope="module")
def fault_free(cluster) -> dict[str, Any]:
    """A job from the driver's host, without a fault: the others' reference."""
    return faults.run_job(cluster, cluster.folder(DRIVER), "fault-free")


@pytest.mark.slow
@needs_cluster
def test_a_job_runs_from_the_drivers_host_on_the_nodes(cluster, fault_free) -> None:
    found = faults.checks(fault_free, None)
    assert faults.passed(found), found
    hosts = {epoch.host for epoch in fault_free["epochs"]}
    assert hosts == set(cluster.node_names)  # every node trained, each in its own processes
    assert fault_free["summary"]["optuna_storage"] == cluster.optuna_storage


# The six faults of benchmarks/faults.py, two to a job where they hit different parts (the
# benchmark runs one job per fault, and times each).
FAULT_JOBS = [("link", "worker"), ("prefect", "mlflow"), ("driver",), ("late-node",)]


@pytest.mark.slow
@needs_cluster
@pytest.mark.parametrize("injected", FAULT_JOBS, ids=["+".join(f) for f in FAULT_JOBS])
def test_a_job_survives(cluster, fault_free, injected) -> None:
    name = "-".join(injected)
    result = faults.run_job(cluster, cluster.folder(DRIVER), name, injected)
    found = faults.checks(result, fault_free)
    assert faults.passed(found), (found, result["hits"])
    if {"link", "late-node"} & set(injected):
        assert found["fenced_writes"] >= 1, "the node given up on wrote nothing late"


def test_only_the_work_a_fault_lost_counts_as_trained_twice_rightly() -> None:
    E = faults.Epoch
    cut = faults.Fault("link", "node-2", 5, at=3.0)
    kill = faults.Fault("worker", "node-1", 7, at=10.0)
    began = [
        E("node-1", 7, 0, 1, 6.0),  # checkpointed before the kill: trained again, wrongly
        E("node-1", 7, 0, 2, 8.0),  # under way at the kill, however long it had run
        E("node-0", 9, 0, 1, 11.0),
        E("node-0", 9, 0, 2, 12.0),
        E("node-0", 9, 1, 1, 5.0),  # twice on nodes no fault hit
        E("node-1", 7, 1, 1, 7.0),
        E("node-0", 9, 2, 1, 4.0),  # relaunched off the cut node, which trains it on later
        E("node-2", 5, 2, 1, 4.5),
    ]
    assert faults.retrained(began, [cut, kill]) == [
        "trial 1 epoch 1 again on node-1",
        "trial 0 epoch 1 again on node-0",
    ]
