"""kill the driver of a digits job at random points and resume each time.

The job is ``examples/digits.yaml`` run through the real CLI with fresh MLflow, Optuna and
Prefect stores in a temporary folder. The driver (``python -m elastune.flows.cli run``, in its own
process group) gets SIGKILL, as a preempted machine would, at ``--kills`` points drawn with
``--seed``; each time ``python -m elastune.flows.cli resume JOB_ID`` takes over, and a resuming
driver may itself be killed (a kill point may fall while it is still starting). A kill point is a
number of journaled results and a phase: ``after-result`` kills as soon as that many results
are journaled (between segments, or while a resumed driver is starting), and
``after-checkpoint`` waits for the next checkpoint file, so the kill lands mid-segment or
between a segment's last checkpoint and its report. Phases alternate from a seeded first
one. A second, uninterrupted run of the same job with the same seed runs beside it. The
script prints:

- finished segments re-run (goal 0), measured outside elastune's own bookkeeping: a segment
  (trial, start, stop) whose ``train-segment`` task runs reached Completed more than once
  across every flow run of the job (Prefect API), or whose report, saved in MLflow before a
  kill, was later written again (a report holds its own run time, so only a re-run rewrites
  it);
- results lost (goal 0): journal records present before a kill but missing or changed in
  the final journal, plus segment reports saved before a kill whose result is not in the
  final journal as saved; MLflow metric points (run, metric, step, value) logged before a
  kill but missing at the end are counted apart;
- whether the final leaderboard equals the uninterrupted run's: per trial id, the Optuna
  trial's parameters, state, value and intermediate values; the differences are written
  to the JSON, with the segment each kill interrupted and the checkpoint it had then.

Why ``compute.workers=1``: with two workers Hyperband's brackets overlap, and which bracket
draws the next trial id depends on which segment finishes first; trial ids seed the
sampler, so two uninterrupted runs with the same seed could already differ. One worker makes
the order of every ask and tell a function of the seed alone, so any difference is the kills'.
``scheduler.max_resource=9`` (17 trials, 22 segments) keeps the run to a few minutes.

    python benchmarks/chaos.py [--kills 5] [--seed 0] [--max-resource 9]

writes ``benchmarks/results/chaos.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for annotations; at run time imported where used
    from mlflow.entities import Run

    from elastune.tasks.tracking import Tracker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Reading segment reports back would draw a progress bar per file.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

JOB_FILE = ROOT / "examples" / "digits.yaml"
RESULT = ROOT / "benchmarks" / "results" / "chaos.json"
PHASES = ("after-result", "after-checkpoint")
TIMEOUT = 900.0  # seconds any one driver may take before the benchmark gives up


class Stores:
    """MLflow, Optuna and Prefect stores of one job, under ``root``."""

    def __init__(self, root: Path):
        root.mkdir(parents=True)
        self.root = root
        self.mlflow = f"sqlite:///{root}/mlflow.db"
        self.optuna = f"sqlite:///{root}/optuna.db"
        self.prefect_home = root / "prefect"

    def overrides(self, max_resource: float, extra: list[str]) -> list[str]:
        pairs = {
            "tracking.mlflow_uri": self.mlflow,
            "tracking.optuna_storage": self.optuna,
            "compute.workers": 1,
            "scheduler.max_resource": max_resource,
        }
        assignments = [f"{key}={value}" for key, value in pairs.items()] + extra
        return [arg for assignment in assignments for arg in ("--set", assignment)]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            PREFECT_HOME=str(self.prefect_home),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            # A fresh database migrates first; on a busy 2-core box that outlasts the 20 s
            # Prefect waits for its ephemeral server by default.
            PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
            PYTHONPATH=str(ROOT),
        )
        return env


def start(args: list[str], stores: Stores, log: Path) -> subprocess.Popen:
    """A driver in its own process group (its ephemeral Prefect server goes with it)."""
    with log.open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "elastune.flows.cli", *args, "--json"],
            cwd=ROOT,
            env=stores.env(),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )


def finish(process: subprocess.Popen, log: Path) -> dict[str, Any]:
    out, _ = process.communicate(timeout=TIMEOUT)
    if process.returncode != 0:
        raise RuntimeError(f"driver exited {process.returncode}:\n{log.read_text()[-3000:]}")
    return json.loads(out)


def job_id_of(log: Path, process: subprocess.Popen) -> str:
    """The id the driver prints first on stderr (``job <ID>``)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        lines = log.read_text().splitlines()
        if lines and lines[0].startswith("job "):
            return lines[0].split()[1]
        if process.poll() is not None:
            raise RuntimeError(f"driver exited {process.returncode}:\n{log.read_text()}")
        time.sleep(0.1)
    raise RuntimeError("the driver printed no job id")


def checkpoint_files(stores: Stores) -> set[Path]:
    """Checkpoint files in the job's artifact store and in the spool where a local segment
    keeps them until it ends (both beside its MLflow database, tasks/checkpoint_spool.py)."""
    kept = set((stores.root / "spool").glob("*/resource-*.pt"))
    return set((stores.root / "artifacts").glob("**/checkpoints/*.pt")) | kept


def journal(job_id: str, storage: str) -> list[dict[str, Any]]:
    import optuna

    from elastune.planners.search import StudyJournal

    try:
        study = optuna.load_study(study_name=job_id, storage=storage)
    except KeyError:  # not created yet
        return []
    return StudyJournal(study).records()


def metric_points(job_id: str, stores: Stores) -> set[tuple[str, str, int, float]]:
    """Every (trial run, metric, step, value) the job's MLflow runs hold."""
    from mlflow import MlflowClient

    client = MlflowClient(stores.mlflow)
    experiment = client.get_experiment_by_name("digits-cnn")
    if experiment is None:
        return set()
    runs = client.search_runs(
        [experiment.experiment_id], f"tags.`elastune.job_id` = '{job_id}'", max_results=1000
    )
    points = set()
    for run in runs:
        name = run.info.run_name
        for key in run.data.metrics:
            for m in client.get_metric_history(run.info.run_id, key):
                points.add((name, key, m.step, m.value))
    return points


def child_runs(job_id: str, stores: Stores) -> Counter:
    """MLflow child runs per run name: each trial should have exactly one."""
    from mlflow import MlflowClient

    client = MlflowClient(stores.mlflow)
    experiment = client.get_experiment_by_name("digits-cnn")
    runs = client.search_runs(
        [experiment.experiment_id],
        f"tags.`elastune.job_id` = '{job_id}' and tags.`elastune.trial` != ''",
        max_results=1000,
    )
    return Counter(r.info.run_name for r in runs)


def segment_task_runs(stores: Stores) -> tuple[Counter, int]:
    """From Prefect: Completed ``train-segment`` task runs per segment name, and how many
    task runs were left behind neither completed nor failed (killed with their driver)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName
    from prefect.client.schemas.sorting import TaskRunSort

    completed: Counter = Counter()
    zombies = 0
    runs = []
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_task_runs(
                task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="trial-")),
                sort=TaskRunSort.ID_DESC,
                offset=len(runs),
                limit=200,
            )
            runs += page
            if len(page) < 200:
                break
    for run in runs:
        if run.state_name == "Completed":
            completed[run.name] += 1
        elif run.state is None or not run.state.is_final():
            zombies += 1
    return completed, zombies


def trial_runs(job_id: str, stores: Stores) -> tuple[Tracker, list[Run]]:
    """The MLflow tracker of the digits experiment and the job's trial runs in it."""
    from elastune.tasks.tracking import Tracker

    tracker = Tracker(stores.mlflow, "digits-cnn")
    runs = tracker.client.search_runs(
        [tracker.experiment_id],
        f"tags.`elastune.job_id` = '{job_id}' and tags.`elastune.trial` != ''",
        max_results=1000,
    )
    return tracker, runs


def checkpoints(job_id: str, stores: Stores) -> dict[int, float]:
    """The newest checkpoint (resource) of each trial of the job, as MLflow holds it now."""
    tracker, runs = trial_runs(job_id, stores)
    newest = {}
    for run in runs:
        levels = tracker.checkpoints(run.info.run_id)
        newest[int(run.data.tags["elastune.trial"])] = levels[0][0] if levels else 0.0
    return newest


def saved_reports(job_id: str, stores: Stores) -> dict[tuple[int, str], dict[str, Any]]:
    """Every segment report saved in MLflow (what a finished segment leaves behind), by
    (trial, segment name): the result a resumed driver must use instead of re-running."""
    tracker, runs = trial_runs(job_id, stores)
    reports = {}
    for run in runs:
        trial = int(run.data.tags["elastune.trial"])
        for item in tracker.client.list_artifacts(run.info.run_id, "segments"):
            name = Path(item.path).stem
            report = tracker.load_report(run.info.run_id, name)
            if report is not None:
                reports[(trial, name)] = report["result"]
    return reports


def honoured(saved: dict[str, Any], final: list[dict[str, Any]]) -> bool:
    """Whether the final journal holds this saved segment result as it was saved."""
    keys = ("trial", "resource", "loss", "failed")
    return any(all(r["result"][k] == saved[k] for k in keys) for r in final)


def interrupted(kill: dict[str, Any], final: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The segments a kill interrupted. ``records()`` lists a segment with the result that
    follows it, so those running at the kill are the first handed out after that result."""
    at = kill["results_journaled_at_kill"]
    after = final[at]["handed_out"] if at < len(final) else []
    newest_at_kill = kill.pop("_checkpoints")
    out = []
    for segment in after[:1]:  # one worker: one segment at a time
        newest = newest_at_kill.get(segment["trial"], 0.0)
        out.append(
            {
                "trial": segment["trial"],
                "start": segment["start"],
                "stop": segment["stop"],
                "checkpoint_at_kill": newest,
                "mid_segment": segment["start"] < newest < segment["stop"],
            }
        )
    return out


def board(job_id: str, storage: str) -> dict[int, tuple]:
    import optuna

    study = optuna.load_study(study_name=job_id, storage=storage)
    return {
        t.user_attrs.get("elastune.trial", -1 - t.number): (
            t.params,
            t.state.name,
            t.value,
            t.intermediate_values,
        )
        for t in study.trials
    }


def describe_difference(ours: tuple | None, theirs: tuple | None) -> dict[str, Any]:
    """Which of params, state, value and intermediate values differ for one trial."""
    if ours is None or theirs is None:
        return {"missing_in": "killed run" if ours is None else "uninterrupted run"}
    fields = ("params", "state", "value", "intermediate_values")
    out: dict[str, Any] = {}
    for name, a, b in zip(fields, ours, theirs, strict=True):
        if a == b:
            continue
        if name == "intermediate_values":
            out["steps_differing"] = sorted(s for s in set(a) | set(b) if a.get(s) != b.get(s))
        else:
            out[name] = {"killed": a, "uninterrupted": b}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-resource", type=float, default=9)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override for both runs"
    )
    args = parser.parse_args()

    import optuna

    from elastune.planners.spec import load_job
    from elastune.planners.staging import compile_plan

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    overrides = [f"scheduler.max_resource={args.max_resource}", *args.set]
    total = compile_plan(load_job(JOB_FILE, overrides)).segments
    rng = random.Random(args.seed)
    # A kill point: once this many results are journaled, SIGKILL at once, or once the next
    # checkpoint is written (mid-segment, or between a segment's last checkpoint and its
    # report). Phases alternate from a random first one, so both kinds are always tried.
    points = sorted(rng.sample(range(1, total), args.kills))
    first = rng.randrange(len(PHASES))
    phases = [PHASES[(first + i) % len(PHASES)] for i in range(len(points))]

    with tempfile.TemporaryDirectory(prefix="elastune-chaos-") as tmp:
        chaos, clean = Stores(Path(tmp) / "chaos"), Stores(Path(tmp) / "clean")
        began = time.monotonic()
        run = ["run", str(JOB_FILE), *chaos.overrides(args.max_resource, args.set)]
        clean_run = ["run", str(JOB_FILE), *clean.overrides(args.max_resource, args.set)]
        clean_log = clean.root / "driver.log"
        uninterrupted = start(clean_run, clean, clean_log)

        log = chaos.root / "driver-0.log"
        driver = start(run, chaos, log)
        job_id = job_id_of(log, driver)
        resume = ["resume", job_id, "--storage", chaos.optuna]
        kills: list[dict[str, Any]] = []
        snapshots: list[tuple[list, set, dict]] = []
        for point, phase in zip(points, phases, strict=True):
            started = time.monotonic()
            while len(journal(job_id, chaos.optuna)) < point and driver.poll() is None:
                time.sleep(0.1)
            if phase == "after-checkpoint":
                seen = checkpoint_files(chaos)
                while checkpoint_files(chaos) <= seen and driver.poll() is None:
                    time.sleep(0.02)
            if driver.poll() is not None:
                break  # the job finished before this kill point
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
            records = journal(job_id, chaos.optuna)
            kills.append(
                {
                    "driver": len(kills),
                    "kill_after_results": point,
                    "phase": phase,
                    "results_journaled_at_kill": len(records),
                    "driver_age_s": round(time.monotonic() - started, 1),
                    "_checkpoints": checkpoints(job_id, chaos),
                }
            )
            snapshots.append((records, metric_points(job_id, chaos), saved_reports(job_id, chaos)))
            print(
                f"kill {len(kills)}: driver {len(kills) - 1} killed with "
                f"{len(records)}/{total} results journaled",
                flush=True,
            )
            log = chaos.root / f"driver-{len(kills)}.log"
            driver = start(resume, chaos, log)
        summary = finish(driver, log)
        chaos_seconds = time.monotonic() - began
        reference = finish(uninterrupted, clean_log)

        final = journal(job_id, chaos.optuna)
        for kill in kills:
            kill["interrupted"] = interrupted(kill, final)
        final_points = metric_points(job_id, chaos)
        # A result is lost when a journal record present at a kill is gone or changed, or
        # when a segment report saved before a kill is not in the final journal as saved.
        lost_records = sum(
            sum(1 for i, r in enumerate(records) if i >= len(final) or final[i] != r)
            for records, _, _ in snapshots
        )
        reports: dict[tuple[int, str], dict[str, Any]] = {}
        for _, _, saved in snapshots:  # the first version saved: a re-run may overwrite it
            for key, result in saved.items():
                reports.setdefault(key, result)
        lost_reports = sorted(
            f"trial-{t} {name}" for (t, name), r in reports.items() if not honoured(r, final)
        )
        lost_results = lost_records + len(lost_reports)
        lost_points = len(set().union(*(p for _, p, _ in snapshots)) - final_points)
        steps = Counter((run, key, step) for run, key, step, _ in final_points)
        repeated_steps = sum(1 for n in steps.values() if n > 1)
        journaled = Counter((r["result"]["trial"], r["result"]["resource"]) for r in final)
        # This process reads the chaos job's Prefect database through its own ephemeral server.
        for key in [k for k in os.environ if k.startswith("PREFECT_")]:
            del os.environ[key]
        os.environ.update({k: v for k, v in chaos.env().items() if k.startswith("PREFECT_")})
        completed, zombies = segment_task_runs(chaos)
        # Re-run finished segments, two ways: Prefect completed the same segment's task more
        # than once, or a report saved before a kill was later overwritten (a report records
        # its own run time, so a re-run never rewrites it identically).
        rerun = {name.replace("→", "-"): n - 1 for name, n in completed.items() if n > 1}
        final_reports = saved_reports(job_id, chaos)
        for (trial, name), first in reports.items():
            if final_reports.get((trial, name)) != first:
                rerun.setdefault(f"trial-{trial} {name}", 1)
        runs_per_trial = child_runs(job_id, chaos)

        ours, theirs = board(job_id, chaos.optuna), board(reference["job_id"], clean.optuna)
        differing = sorted(t for t in set(ours) | set(theirs) if ours.get(t) != theirs.get(t))
        differences = {t: describe_difference(ours.get(t), theirs.get(t)) for t in differing}

    figure = {
        "job": "examples/digits.yaml",
        "overrides": {
            "compute.workers": 1,
            "scheduler.max_resource": args.max_resource,
            **dict(a.split("=", 1) for a in args.set),
        },
        "seed": args.seed,
        "kill_points": [
            {"after_results": p, "phase": f} for p, f in zip(points, phases, strict=True)
        ],
        "kills": kills,
        "drivers": len(kills) + 1,
        "segments": total,
        "segments_summary": summary["segments"],
        "trials": summary["trials"],
        "finished_segments_rerun": sum(rerun.values()),
        "rerun_detail": rerun,
        "rerun_seen_by_prefect": sum(n > 1 for n in completed.values()),
        "segments_completed_in_prefect": len(completed),
        "task_runs_left_running_by_kills": zombies,
        "results_lost": lost_results,
        "journal_records_lost": lost_records,
        "saved_segment_reports_not_honoured": lost_reports,
        "metric_points_lost": lost_points,
        "metric_steps_logged_twice": repeated_steps,
        "results_journaled_twice": sum(n - 1 for n in journaled.values() if n > 1),
        "mlflow_runs_per_trial_max": max(runs_per_trial.values()),
        "mlflow_trial_runs": sum(runs_per_trial.values()),
        "leaderboard_equal": not differing,
        "trials_differing": differing,
        "optuna_trials_without_trial_id": sum(t < 0 for t in ours),
        "failed_trials": sum(state == "FAIL" for _, state, _, _ in ours.values()),
        "failed_trials_uninterrupted": sum(state == "FAIL" for _, state, _, _ in theirs.values()),
        "differences": differences,
        "best_equal": summary["best"] == reference["best"],
        "best": summary["best"],
        "best_uninterrupted": reference["best"],
        "seconds_with_kills": round(chaos_seconds, 1),
        "seconds_uninterrupted_flow": reference["wall_seconds"],
        "goals": {"finished_segments_rerun": 0, "results_lost": 0, "leaderboard_equal": True},
    }
    figure["met"] = (
        figure["finished_segments_rerun"] == 0
        and figure["results_lost"] == 0
        and figure["metric_points_lost"] == 0
        and figure["leaderboard_equal"]
    )
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(figure, indent=2, default=str) + "\n")

    print(f"{'kills':>32}  {len(kills)} (drivers {len(kills) + 1})")
    print(f"{'finished segments re-run':>32}  {figure['finished_segments_rerun']}   (goal 0)")
    print(f"{'results lost':>32}  {lost_results}   (goal 0)")
    print(f"{'metric points lost':>32}  {lost_points}   (goal 0)")
    print(f"{'leaderboard equals uninterrupted':>32}  {figure['leaderboard_equal']}   (goal True)")
    if differing:
        print(f"{'trials differing':>32}  {differing}")
    print(
        f"{'failed trials':>32}  {figure['failed_trials']} (uninterrupted: "
        f"{figure['failed_trials_uninterrupted']})"
    )
    print(f"{'metric steps logged twice':>32}  {repeated_steps}")
    print(f"{'task runs left by kills':>32}  {zombies}")
    print(f"{'MLflow runs per trial (max)':>32}  {figure['mlflow_runs_per_trial_max']}")
    print(f"wrote {RESULT.relative_to(ROOT)}")
    return 0 if figure["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
