"""The faults a team meets, injected mid-job on a cluster of hosts (infra/netns_cluster.py).

On one cluster (services, driver, three warm nodes of one slot), a job of six trials of
:func:`logged` (each trains 4 epochs of ``--epoch-seconds``, checkpointing each, and logs
``host pid trial epoch time`` to its host's own file) runs once without a fault, then once
per fault, each injected once the job's third epoch 2 starts:

- ``link``: the link of the node training it is cut (at the switch, inside the switch's
  namespace); mended once the driver has relaunched the segment elsewhere, so the node's
  late writes arrive, and are refused (fenced);
- ``worker``: that node's worker process gets SIGKILL; its supervisor starts it again;
- ``prefect``, ``mlflow``: the Prefect server, or MLflow's, gets SIGKILL (its whole
  process group); the services host's supervisor starts it again;
- ``driver``: the job's driver gets SIGKILL; ``elastune resume JOB_ID`` runs from node-2's host;
- ``late-node``: as ``link``, but mended only after the job has ended: the node that comes
  back must change nothing of the finished job.

For each it checks that the job completed with the fault-free run's best (same seed, one
slot per node: the same configurations, trained the same), that no epoch was trained twice
but on the failed node or process after its last checkpoint, that MLflow holds each epoch's
metric once, and for ``late-node`` that MLflow is unchanged after the node came back; and
it prints the time each fault cost against the fault-free run. The cluster is brought down
at the end, and nothing of it may be left.

    python benchmarks/faults.py [--faults link,worker,...] [--epoch-seconds 1]

writes ``benchmarks/results/faults.json``. Needs root, ``ip`` and PostgreSQL (installed if
missing), as the cluster does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULT = ROOT / "benchmarks" / "results" / "faults.json"
FAULTS = ("link", "worker", "prefect", "mlflow", "driver", "late-node")
LOG = "ELASTUNE_FAULTS_LOG"
TRIALS, EPOCHS = 6, 4
TIMEOUT = 300.0  # a job, faults and all


def logged(config: dict, ctx: Any) -> None:
    """Accuracy rising with epochs towards ``1 - (x - 0.7)^2``, each epoch logged (with its
    host and time) to ``$ELASTUNE_FAULTS_LOG`` and taking ``$ELASTUNE_FAULTS_EPOCH`` s."""
    import torch

    state = torch.nn.Linear(1, 1)
    start = ctx.restore(model=state)
    for epoch in ctx.range(start):
        with open(os.environ[LOG], "a") as out:
            out.write(f"{os.environ['ELASTUNE_HOST']} {os.getpid()} {ctx.trial} {epoch} ")
            out.write(f"{time.time()}\n")
        time.sleep(float(os.environ["ELASTUNE_FAULTS_EPOCH"]))
        ceiling = 1 - (config["x"] - 0.7) ** 2
        ctx.report(val_accuracy=ceiling * (1 - 0.5**epoch))
        ctx.checkpoint(model=state)


def job_file(folder: Path, name: str) -> Path:
    import yaml

    job = {
        "name": name,
        "trainable": "benchmarks.faults:logged",
        "metric": "val_accuracy",
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "sampler": {"name": "random", "seed": 7},
        "scheduler": {"name": "random", "max_resource": EPOCHS, "max_trials": TRIALS},
        "compute": {"workers": 3, "pool": "warm"},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@dataclass(frozen=True)
class Epoch:
    host: str
    pid: int
    trial: int
    epoch: int
    at: float


def epochs(layout: Any) -> list[Epoch]:
    """Every epoch the nodes began for the job running now (each job starts the nodes' logs
    anew), oldest first."""
    found = []
    for host in layout.node_names:
        path = layout.folder(host) / "epochs.log"
        if path.exists():
            for line in path.read_text().splitlines():
                host_, pid, trial, epoch, at = line.split()
                found.append(Epoch(host_, int(pid), int(trial), int(epoch), float(at)))
    return sorted(found, key=lambda e: e.at)


@dataclass
class Running:
    """A job started on the driver's host."""

    name: str
    process: subprocess.Popen
    began: float = field(default_factory=time.monotonic)

    def job_id(self, timeout: float = 120.0) -> str:
        """The job's id, from the first line of its stderr (``job <ID>``)."""
        deadline = time.monotonic() + timeout
        line = self.process.stderr.readline() if self.process.stderr else ""
        while not line.startswith("job ") and time.monotonic() < deadline:
            line = self.process.stderr.readline()
        return line.split()[1]


def start_job(layout: Any, folder: Path, name: str, host: str = "driver") -> Running:
    from elastune.infra.netns_cluster import host_command

    command = [sys.executable, "-m", "elastune.flows.cli", "run", str(job_file(folder, name))]
    command += ["--json", *[a for v in layout.job_overrides() for a in ("--set", v)]]
    for node in layout.node_names:
        (layout.folder(node) / "epochs.log").unlink(missing_ok=True)
    argv, env = host_command(layout, host, command)
    process = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    return Running(name, process)


def finish(running: Running, timeout: float = TIMEOUT) -> dict[str, Any]:
    """The job's summary once it ends (its last stdout line, ``--json``)."""
    out, err = running.process.communicate(timeout=timeout)
    if running.process.returncode != 0:
        raise RuntimeError(f"job {running.name} exited {running.process.returncode}: {err[-800:]}")
    return json.loads(out.strip().splitlines()[-1])


def wait_for(condition: Any, timeout: float, what: str, pause: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(pause)
    raise AssertionError(f"{what}: not within {timeout:g} s")


def metric_steps(layout: Any, experiment: str) -> dict[int, list[int]]:
    """Each trial's logged steps of the metric, as MLflow holds them (read from the driver's
    host: the root namespace has no route to the cluster)."""
    from elastune.infra.netns_cluster import run

    command = [sys.executable, str(Path(__file__)), "steps", experiment]
    done = run(layout, "driver", command, capture=True)
    if done.returncode != 0:
        raise RuntimeError(f"reading MLflow failed: {done.stderr[-500:]}")
    return {int(k): v for k, v in json.loads(done.stdout).items()}


def print_steps(experiment: str) -> None:
    """Print :func:`metric_steps` (on a host of the cluster)."""
    from mlflow import MlflowClient

    client = MlflowClient()
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], "tags.`elastune.trial` != ''")
    steps = {
        run.data.tags["elastune.trial"]: sorted(
            m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")
        )
        for run in runs
    }
    print(json.dumps(steps))


# --- the faults -----------------------------------------------------------------------------


@dataclass
class Fault:
    """What a fault did: the host and process it hit, and when."""

    name: str
    host: str | None = None
    pid: int | None = None
    at: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)


def started_epoch(layout: Any, running: Running, since: float | None) -> Epoch:
    """The job's third epoch 2 (``since`` None: a first fault), or else the first epoch
    begun after ``since`` on a node that does not run the job's driver; once begun."""

    def begun() -> Epoch | None:
        if running.process.poll() is not None:
            raise AssertionError(f"the job ended before its fault: {running.process.stderr.read()}")
        found = epochs(layout)
        if since is None:
            found = [e for e in found if e.epoch == 2]
            return found[2] if len(found) >= 3 else None
        return next((e for e in found if e.at > since and e.host != RESUMING), None)

    return wait_for(begun, TIMEOUT, "an epoch begun")


def supervised_pid(layout: Any, host: str, program: str) -> int:
    from elastune.infra.netns_cluster import status

    return status(layout, host)["programs"][program]["pid"]


def restarted(layout: Any, host: str, program: str, pid: int) -> bool:
    from elastune.infra.netns_cluster import status

    now = status(layout, host).get("programs", {}).get(program)
    return now is not None and now["pid"] != pid


def kill_program(layout: Any, host: str, program: str) -> int:
    """SIGKILL a supervised program's process group; its pid (the supervisor restarts it)."""
    pid = supervised_pid(layout, host, program)
    os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: restarted(layout, host, program, pid), 60, f"{program} restarted")
    return pid


def inject(fault: str, layout: Any, running: Running, since: float | None) -> Fault:
    """Inject ``fault`` into the job once its third epoch 2 has begun (a first fault), or
    else the first epoch begun after ``since``."""
    from elastune.infra.netns import Net

    target = started_epoch(layout, running, since)
    hit = Fault(fault, target.host, target.pid, time.time())
    if fault in ("link", "late-node"):
        Net(layout.name).cut(target.host)
        # Until the driver has given the segment to another node.
        relaunched = lambda: [  # noqa: E731
            e for e in epochs(layout)
            if e.trial == target.trial and e.host != target.host and e.at > hit.at
        ]  # fmt: skip
        wait_for(relaunched, 120, f"trial {target.trial} relaunched off {target.host}")
        if fault == "link":
            Net(layout.name).mend(target.host)
    elif fault == "worker":
        hit.pid = kill_program(layout, target.host, "worker")
    elif fault in ("prefect", "mlflow"):
        hit.host, hit.pid = "services", kill_program(layout, "services", fault)
    elif fault == "driver":
        hit.host, hit.notes["job_id"] = "driver", running.job_id()
        os.killpg(running.process.pid, signal.SIGKILL)
        running.process.wait()
        running.process = resume(layout, hit.notes["job_id"])
    return hit


RESUMING = "node-2"  # where a killed driver's job is resumed from


def resume(layout: Any, job_id: str) -> subprocess.Popen:
    """``elastune resume`` of a killed driver's job, run from :data:`RESUMING`'s host."""
    from elastune.infra.netns_cluster import host_command

    command = [sys.executable, "-m", "elastune.flows.cli", "resume", job_id, "--json"]
    command += ["--storage", layout.optuna_storage]
    argv, env = host_command(layout, RESUMING, command)
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def fenced_writes(layout: Any, host: str) -> int:
    """Launches on ``host`` whose writes MLflow refused as fenced (its node worker's log
    says so: the segment's task run failed on the refusal)."""
    log = layout.folder(host) / "worker.log"
    if not log.exists():
        return 0
    lines = log.read_text(errors="replace").splitlines()
    return sum("Task run failed" in line and "ABORTED: fenced" in line for line in lines)


def late_node(layout: Any, running: Running, hit: Fault) -> None:
    """Mend the link of the node cut off during the job, once the job has ended, and wait
    until the node has had its late say: its segment's writes refused (or none left)."""
    from elastune.infra.netns import Net

    Net(layout.name).mend(hit.host)
    zombie = [e for e in epochs(layout) if e.host == hit.host and e.at >= hit.at]
    if zombie:  # it trained on while cut off: its next write is its late say
        wait_for(lambda: fenced_writes(layout, hit.host), 120, f"{hit.host}'s writes refused")


# --- a run and its checks -----------------------------------------------------------------


def run_job(layout: Any, folder: Path, name: str, faults: tuple[str, ...] = ()) -> dict:
    """The job, with ``faults`` injected mid-job one after the other; its summary, what
    the faults hit, and what MLflow holds."""
    running = start_job(layout, folder, name)
    refused_before = {h: fenced_writes(layout, h) for h in layout.node_names}
    hits: list[Fault] = []
    for fault in faults:
        hits.append(inject(fault, layout, running, hits[-1].at if hits else None))
    summary = finish(running)
    seconds = time.monotonic() - running.began
    late = [hit for hit in hits if hit.name == "late-node"]
    before_late = metric_steps(layout, name) if late else None
    for hit in late:
        late_node(layout, running, hit)
    steps = metric_steps(layout, name)
    return {
        "epochs": epochs(layout),
        "summary": summary,
        "seconds": seconds,
        "hits": hits,
        "steps": steps,
        "changed_after_end": before_late is not None and steps != before_late,
        "fenced": sum(fenced_writes(layout, h) - refused_before[h] for h in layout.node_names),
    }


def retrained(began: list[Epoch], hits: list[Fault]) -> list[str]:
    """Epochs trained twice other than work lost on a failed node or process: one begun
    there at or after its fault (a node cut off trains on, even a segment queued there that
    the job relaunched elsewhere, until its writes are refused), or the one it was in when
    the fault came (the last begun there before it, however long its checkpoint took)."""
    lost: set[Epoch] = set()
    for hit in hits:
        there = [e for e in began if e.host == hit.host]
        lost |= {e for e in there if e.at >= hit.at}
        before = [e for e in there if e.at < hit.at]
        if before:
            lost.add(max(before, key=lambda e: e.at))
    wrong, trained = [], set()
    for e in sorted((e for e in began if e not in lost), key=lambda e: e.at):
        if (e.trial, e.epoch) in trained:
            wrong.append(f"trial {e.trial} epoch {e.epoch} again on {e.host}")
        trained.add((e.trial, e.epoch))
    return wrong


def checks(result: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, Any]:
    """What is asked of a job a fault hit (the module docstring lists it)."""
    summary = result["summary"]
    best = summary["best"]["metric"] if summary.get("best") else None
    return {
        "completed": summary.get("trials") == TRIALS,
        "best": best,
        "best_as_fault_free": baseline is None or best == baseline["summary"]["best"]["metric"],
        "retrained_outside_lost_work": retrained(result["epochs"], result["hits"]),
        "each_epoch_metric_once": all(
            steps == list(range(1, EPOCHS + 1)) for steps in result["steps"].values()
        )
        and len(result["steps"]) == TRIALS,
        "unchanged_after_end": not result["changed_after_end"],
        "fenced_writes": result["fenced"],
    }


# --- the cluster ----------------------------------------------------------------------------


def fault_layout(name: str, epoch: float) -> Any:
    from elastune.infra.cluster_layout import Layout
    from elastune.infra.netns_cluster import default_root

    env = {"ELASTUNE_FAULTS_EPOCH": f"{epoch:g}", LOG: "{folder}/epochs.log"}
    return Layout(name, default_root(name), ROOT, env=env)


def leftovers(layout: Any) -> list[str]:
    """What a cluster brought down left: namespaces, its folder, processes that name it."""
    from elastune.infra.netns import Net

    left = sorted(Net(layout.name).existing())
    if layout.root.exists():
        left.append(str(layout.root))
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and str(layout.root) in (entry / "cmdline").read_text():
                left.append(f"process {entry.name}")
    return left


def row(fault: str, result: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, Any]:
    found = checks(result, baseline)
    cost = None if baseline is None else round(result["seconds"] - baseline["seconds"], 1)
    return {"fault": fault, "seconds": round(result["seconds"], 1), "cost_seconds": cost, **found}


def passed(found: dict[str, Any]) -> bool:
    return (
        found["completed"]
        and found["best_as_fault_free"]
        and not found["retrained_outside_lost_work"]
        and found["each_epoch_metric_once"]
        and found["unchanged_after_end"]
    )


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| fault | job s | cost s | completed | best as fault-free | retrained outside lost "
        "work | each epoch's metric once | fenced writes | passed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cost = "-" if r["cost_seconds"] is None else r["cost_seconds"]
        lines.append(
            f"| {r['fault']} | {r['seconds']} | {cost} | {r['completed']} "
            f"| {r['best_as_fault_free']} ({r['best']:.4f}) "
            f"| {len(r['retrained_outside_lost_work'])} | {r['each_epoch_metric_once']} "
            f"| {r['fenced_writes']} | {passed(r)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="run", choices=["run", "steps"])
    parser.add_argument("experiment", nargs="?", help="steps: the experiment to read")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated faults")
    parser.add_argument("--epoch-seconds", type=float, default=1.0)
    parser.add_argument("--name", default="elastune-faults", help="the cluster's name")
    args = parser.parse_args(argv)
    if args.mode == "steps":
        print_steps(args.experiment)
        return 0
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        parser.error(f"--faults: unknown {', '.join(unknown)} (known: {', '.join(FAULTS)})")
    from elastune.infra.netns_cluster import brought_up

    layout = fault_layout(args.name, args.epoch_seconds)
    os.environ["ELASTUNE_FAULTS_EPOCH"] = f"{args.epoch_seconds:g}"
    rows = []
    with brought_up(layout):
        folder = layout.folder("driver")
        baseline = run_job(layout, folder, "fault-free")
        rows.append(row("fault-free", baseline, None))
        for fault in faults:
            rows.append(row(fault, run_job(layout, folder, fault, (fault,)), baseline))
    left = leftovers(layout)
    print(table(rows))
    print(f"left behind after down: {left or 'nothing'}")
    results = {"epoch_seconds": args.epoch_seconds, "trials": TRIALS, "epochs": EPOCHS,
               "rows": rows, "left_behind": left}  # fmt: skip
    RESULT.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULT.relative_to(ROOT)}")
    return 0 if all(passed(r) for r in rows) and not left else 1


if __name__ == "__main__":
    sys.exit(main())
