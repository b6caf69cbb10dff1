"""What a work-pool segment costs to hand out: warm workers against local mode.

On one Prefect server on loopback (``elastune.infra.local_cluster``), with 2 slots each way:

- ``dispatch``: a job of one-epoch trials whose trainable does no work (``idle``: one report,
  nothing else), one slot per segment. Printed per mode: the job's
  ``wall_seconds x slots / segments``, the seconds one slot spends per segment. Modes:
  ``local`` (the driver's process, ``compute.workers: 2``), ``warm`` (2 warm nodes of 1
  slot) and, with ``--flow-runs``, ``flow-run`` (a process pool whose worker starts a flow
  run per segment, ``compute.workers: 2``).
- ``digits``: ``examples/digits.yaml`` in local mode and on the 2 warm nodes, three times
  each way in turns; trained epochs per second, and the median of warm over local.

Run: ``python benchmarks/dispatch.py`` (``--quick`` for a small run that proves it works);
writes ``benchmarks/results/dispatch.json``. ``--database URL`` puts the cluster's server on
another database (``postgresql+asyncpg://...``; Prefect's advice for a server with many
writers) and writes ``dispatch_<database>.json``. ``--hosts`` adds ``warm-hosts``: the same
job on warm nodes on hosts that share nothing but a network (``elastune.infra.netns_cluster``:
PostgreSQL, credentials, the job run from the driver's host; needs root), and writes
``dispatch_hosts.json``. The cost planner prices a segment's overhead
from the job's ``profile.overhead_s`` (docs/job-file.md): on a warm pool, add the ``warm``
figure to it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULT = ROOT / "benchmarks" / "results" / "dispatch.json"
SLOTS = 2  # both ways: 2 workers in local mode, 2 nodes of 1 slot on the warm pool
DIGITS_PAIRS = 3


def idle(config: dict, ctx: Any) -> None:
    """A trainable that does no work: one report per epoch, no checkpoint."""
    for epoch in ctx.range(ctx.start):
        ctx.report(val_accuracy=config["x"] * epoch / ctx.stop)


def idle_job(folder: Path, trials: int) -> Path:
    """A job of ``trials`` one-epoch trials of :func:`idle`."""
    import yaml

    job = {
        "name": f"dispatch-{folder.name}",
        "trainable": "benchmarks.dispatch:idle",
        "metric": "val_accuracy",
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "sampler": {"name": "random", "seed": 0},
        "scheduler": {"name": "random", "max_resource": 1, "max_trials": trials},
        "compute": {"workers": SLOTS},
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def run_job(path: Path, folder: Path, *args: str) -> dict[str, Any]:
    """Run the job file at ``path`` with its stores in ``folder``; its summary."""
    from elastune.flows.cli import main

    stores = [
        f"tracking.mlflow_uri=sqlite:///{folder}/mlflow.db",
        f"tracking.optuna_storage=sqlite:///{folder}/optuna.db",
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["run", str(path), "--json", *args, "--set", stores[0], "--set", stores[1]])
    if code != 0:
        raise RuntimeError(f"job {path} failed with exit code {code}")
    return json.loads(out.getvalue())


def per_slot(summary: dict[str, Any]) -> dict[str, float]:
    seconds = summary["wall_seconds"] * SLOTS / summary["segments"]
    return {
        "segments": summary["segments"],
        "wall_seconds": summary["wall_seconds"],
        "seconds_per_segment_per_slot": round(seconds, 3),
    }


def epochs_trained(folder: Path, experiment: str, metric: str) -> int:
    """Epochs the job's trials trained: their metric's history in MLflow."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], "tags.`elastune.trial` != ''")
    return sum(len(client.get_metric_history(r.info.run_id, metric)) for r in runs)


def digits(tmp: Path, pool: str, quick: bool) -> dict[str, Any]:
    """The digits example in local mode and on the warm pool, :data:`DIGITS_PAIRS` times
    in turns (one run each way per pair; quick: one pair): trained epochs per second, and
    the median over the pairs of warm over local (on 2 shared cores one pair's ratio
    ranged from 65% to 85%)."""
    size = ["--set", "scheduler.max_resource=9"] if quick else []
    pairs: list[dict[str, Any]] = []
    for pair in range(1 if quick else DIGITS_PAIRS):
        figures: dict[str, Any] = {}
        for mode, args in (("local", []), ("warm", ["--pool", pool])):
            folder = tmp / f"digits-{mode}-{pair}"
            folder.mkdir()
            summary = run_job(ROOT / "examples" / "digits.yaml", folder, *size, *args)
            epochs = epochs_trained(folder, "digits-cnn", "val_accuracy")
            figures[mode] = {
                "epochs": epochs,
                "wall_seconds": summary["wall_seconds"],
                "epochs_per_second": round(epochs / summary["wall_seconds"], 3),
            }
        ratio = figures["warm"]["epochs_per_second"] / figures["local"]["epochs_per_second"]
        pairs.append({**figures, "warm_over_local": round(ratio, 3)})
    ratios = [pair["warm_over_local"] for pair in pairs]
    return {"pairs": pairs, "warm_over_local": round(statistics.median(ratios), 3)}


def flow_runs(tmp: Path, api: str, trials: int) -> dict[str, float]:
    """The old mode: a process pool whose worker starts a flow run per segment."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from elastune.infra.server import running_worker

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="flow-runs", type="process"))
    folder = tmp / "flow-run"
    folder.mkdir()
    with running_worker(api, "flow-runs", tmp / "process-worker"):
        return per_slot(run_job(idle_job(folder, trials), folder, "--pool", "flow-runs"))


def across_hosts(trials: int) -> dict[str, float]:
    """Warm nodes on hosts that share nothing but a network (infra/netns_cluster.py: a
    services host with PostgreSQL, Prefect's server and MLflow's, both behind credentials;
    the job run from the driver's host; :data:`SLOTS` nodes of 1 slot)."""
    from elastune.infra.cluster_layout import DRIVER, POOL, Layout
    from elastune.infra.netns_cluster import brought_up, default_root, run

    name = "elastune-dispatch"
    with brought_up(Layout(name, default_root(name), ROOT, nodes=SLOTS)) as layout:
        path = idle_job(layout.folder(DRIVER), trials)
        command = [sys.executable, "-m", "elastune.flows.cli", "run", str(path), "--json"]
        command += ["--pool", POOL, *[a for v in layout.job_overrides() for a in ("--set", v)]]
        done = run(layout, DRIVER, command, capture=True)
        if done.returncode != 0:
            raise RuntimeError(f"the job across hosts failed: {done.stderr[-800:]}")
        return per_slot(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run that proves it works")
    parser.add_argument("--trials", type=int, help="idle trials per mode (default 200, 20)")
    parser.add_argument("--flow-runs", action="store_true", help="measure the flow-run mode")
    parser.add_argument("--no-digits", action="store_true", help="skip the digits example")
    parser.add_argument("--database", help="the cluster server's database URL (default SQLite)")
    parser.add_argument(
        "--hosts",
        action="store_true",
        help="also warm nodes on hosts in network namespaces (needs root; writes "
        "dispatch_hosts.json)",
    )
    args = parser.parse_args(argv)
    trials = args.trials or (20 if args.quick else 200)
    # The node workers import this module's trainable.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    from elastune.infra.local_cluster import running_cluster
    from elastune.tasks.worker_processes import warm_fork_server

    # Local jobs' workers fork from a server this process starts once (tasks/worker_processes.py):
    # started before the timing, as `elastune run` has its own from its start.
    warm_fork_server()

    database = args.database.split(":")[0].split("+")[0] if args.database else "sqlite"
    results: dict[str, Any] = {
        "quick": args.quick,
        "slots": SLOTS,
        "server_database": database,
        "dispatch": {},
    }
    with tempfile.TemporaryDirectory(prefix="elastune-dispatch-") as name:
        tmp = Path(name)
        cluster_home = tmp / "cluster"
        with running_cluster(cluster_home, SLOTS, 1, database=args.database) as cluster:
            for mode, pool in (("local", []), ("warm", ["--pool", cluster.pool])):
                folder = tmp / mode
                folder.mkdir()
                results["dispatch"][mode] = per_slot(
                    run_job(idle_job(folder, trials), folder, *pool)
                )
            if args.hosts:
                results["dispatch"]["warm-hosts"] = across_hosts(trials)
            if args.flow_runs:
                results["dispatch"]["flow-run"] = flow_runs(tmp, cluster.api, min(trials, 10))
            if not args.no_digits:
                results["digits"] = digits(tmp, cluster.pool, args.quick)
    for mode, row in results["dispatch"].items():
        print(
            f"{mode:>9}: {row['seconds_per_segment_per_slot']:.3f} s per segment per slot "
            f"({row['segments']} segments in {row['wall_seconds']:.1f} s)"
        )
    if "digits" in results:
        for pair in results["digits"]["pairs"]:
            print(
                f"   digits: {pair['local']['epochs_per_second']:.2f} epochs/s local, "
                f"{pair['warm']['epochs_per_second']:.2f} warm ({pair['warm_over_local']:.0%})"
            )
        print(f"   digits: warm over local, median {results['digits']['warm_over_local']:.0%}")
    out = RESULT if database == "sqlite" else RESULT.with_name(f"dispatch_{database}.json")
    if args.hosts:
        out = out.with_name(out.stem + "_hosts.json")
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"server on {database}; wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
