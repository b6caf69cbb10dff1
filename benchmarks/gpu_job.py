"""A whole job on one GPU, packed against unpacked: the same job run with
``compute.packing: on`` and ``off``, each forecast by the user's loop and measured.

The job is ``examples/cnn.yaml`` (SHA, 27 trials of TPE seed 0, R = 9: 39 segments of the
CNN on CIFAR-sized images made in memory), planned on this machine (its one GPU one slot).
It is profiled once, ``elastune profile --shares 1,0.5,0.25 --repeats 2`` in a fresh process
(:func:`benchmarks.forecast.profiled`): the two job files differ in ``compute.packing``
alone, and calibration runs its small jobs unpacked whatever the job says, so one profile
is both jobs' profile. Two calibration runs of each small job, not three, keep the whole
measurement within one command's minutes on an H100 (the runs' spreads then have 2 degrees
of freedom, which widens the p95). Then for each job, in fresh processes and fresh stores,
the profile and a deadline added to the job file (:func:`benchmarks.forecast.planned`),
``elastune plan --json`` and ``elastune run --json``, unpacked first. Where
``nvidia-cuda-mps-control`` exists, one MPS daemon with a private pipe folder
(:func:`benchmarks.gpu.mps_daemon`) serves the profile and both runs, started here and
stopped at the end whatever happens (SIGTERM included): the jobs differ in packing alone,
and the shares the packer plans with are timed as the packed run shares the GPU.

Per job: the run's ``wall_seconds``; its forecast p50 and p95 and error
(``measured / p50 - 1``), within 10% of p50 or not, above p95 or not
(:func:`benchmarks.forecast.held`); the best metric; trained samples per second, each
trial's epochs (the distinct steps of its ``val_accuracy`` history in the job's MLflow
store) times the images an epoch trains on (``samples`` of its config, else
``examples.cnn.SAMPLES``, which the space's batch sizes divide), summed over the trials,
over ``wall_seconds``; the GPU's mean utilisation and peak used memory, from NVML every
0.2 s while the run's process lives (:func:`benchmarks.gpu.gpu_sampler`). And the packed
job's wall over the unpacked one's. Goal: the packed job in at most half the time with the
same best metric; each job within 10% of its p50 and not above its p95. The results file
names the device (``nvidia-smi``'s output) and is written after each step, so a run cut
short keeps what it measured (``complete`` false).

    python benchmarks/gpu_job.py              # on a CUDA machine: benchmarks/results/gpu_job.json
    python benchmarks/gpu_job.py --dry-run    # no GPU: a small CNN, the same loop on the CPU,
                                              # uncalibrated (--repeats 0), to a temporary file
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.forecast import elastune, held, planned, profiled  # noqa: E402
from benchmarks.gpu import device_name, gpu_sampler, mps_available, mps_daemon  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "gpu_job.json"
JOB = ROOT / "examples" / "cnn.yaml"
SHARES = "1,0.5,0.25"
# The dry run's job: examples/cnn.yaml cut to narrow nets on a few images, 13 segments, so
# that the same loop runs in minutes on a CPU.
DRY = {
    "space": {
        "lr": {"type": "float", "low": 1.0e-3, "high": 0.3, "log": True},
        "width": {"type": "int", "low": 4, "high": 8},
        "batch_size": {"type": "categorical", "choices": [64]},
        "samples": {"type": "categorical", "choices": [256]},
    },
    "scheduler": {"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 9, "max_trials": 9},
    "compute": {"workers": 2},
}


def the_job(dry_run: bool) -> tuple[str, dict[str, Any]]:
    """The job's name and its file, less its name and stores (each run gets fresh ones)."""
    job = yaml.safe_load(JOB.read_text())
    job.pop("tracking", None)
    if dry_run:
        job.update(DRY)
    return job.pop("name"), job


def nvidia_smi(device: str) -> str:
    """``nvidia-smi``'s report of this machine's GPUs; ``cpu`` without CUDA."""
    if not device.startswith("cuda"):
        return "cpu"
    return subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=True).stdout


def trained_samples(uri: str, job_run: str) -> int:
    """Images the job's trials trained on: each trial's epochs (the distinct steps of its
    ``val_accuracy`` history) times its epoch's images."""
    from mlflow import MlflowClient

    from examples.cnn import SAMPLES

    client = MlflowClient(uri)
    experiment = client.get_run(job_run).info.experiment_id
    trials = client.search_runs(
        [experiment], f"tags.mlflow.parentRunId = '{job_run}'", max_results=10_000
    )
    total = 0
    for trial in trials:
        steps = {m.step for m in client.get_metric_history(trial.info.run_id, "val_accuracy")}
        total += len(steps) * int(trial.data.params.get("samples", SAMPLES))
    return total


def run_job(
    name: str, job: dict[str, Any], profile: dict[str, Any], packing: str, device: str
) -> dict[str, Any]:
    """``elastune plan`` and ``run`` of ``job`` with ``compute.packing: packing``, in a
    fresh folder and stores; the run against its forecast, its speed and the GPU's use."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        uri = f"sqlite:///{folder}/mlflow.db"
        stores = {"mlflow_uri": uri, "optuna_storage": f"sqlite:///{folder}/optuna.db"}
        mine = {**job, "compute": {**job["compute"], "packing": packing}, "tracking": stores}
        path = folder / "job.yaml"
        path.write_text(yaml.safe_dump(planned(name, mine, profile)))
        plan = elastune(["plan", str(path)], folder, "0")
        began = time.perf_counter()
        with gpu_sampler(device) as samples:
            run = elastune(["run", str(path)], folder, "0")
        process_s = time.perf_counter() - began
        images = trained_samples(uri, run["mlflow_run_id"])
    wall, best = run["wall_seconds"], run["best"]
    row = {
        "packing": packing,
        "mode": run.get("mode"),
        "plan_jct_s": plan["jct_s"],
        "wall_seconds": wall,
        "process_seconds": round(process_s, 2),
        "trials": run["trials"],
        "segments": run["segments"],
        "best_metric": None if best is None else best["metric"],
        "best": best,
        "samples": images,
        "samples_per_s": round(images / wall, 1),
        **held(run),
    }
    if samples:
        row["gpu_util_mean_pct"] = round(statistics.fmean(u for u, _ in samples), 1)
        row["gpu_used_mib_max"] = round(max(m for _, m in samples), 1)
    return row


def measure(args: argparse.Namespace, write: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Profile once, then run the job unpacked and packed; ``write(result)`` after each step."""
    name, job = the_job(args.dry_run)
    mps = mps_available(args.device)
    result: dict[str, Any] = {
        "complete": False,
        "dry_run": args.dry_run,
        "device": device_name(args.device),
        "nvidia_smi": nvidia_smi(args.device),
        "mps": mps,
        "job": {"name": name, **job},
        "profile_flags": ["--shares", SHARES, *calibration(args.repeats)],
        "jobs": {},
    }
    write(result)
    with mps_daemon() if mps else contextlib.nullcontext():
        began = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            profile, out = profiled(name, job, Path(tmp), "0", result["profile_flags"])
        result["profile_seconds"] = round(time.perf_counter() - began, 1)
        result["profile"] = profile
        result["calibration_walls_s"] = out.get("calibration_walls_s")
        print(f"profile: {result['profile_seconds']} s", flush=True)
        write(result)
        # On a CPU no share may pay, and packing: on is then bad input: auto, there.
        for key, packing in (("unpacked", "off"), ("packed", "auto" if args.dry_run else "on")):
            result["jobs"][key] = run_job(name, job, profile, packing, args.device)
            print_row(result["jobs"][key])
            write(result)
    return {**result, **verdict(result["jobs"]), "complete": True}


def calibration(repeats: int) -> list[str]:
    """``elastune profile``'s flags for ``repeats`` runs of each calibration job."""
    return ["--no-calibrate"] if repeats == 0 else ["--repeats", str(repeats)]


def verdict(jobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The packed job's wall over the unpacked one's, and the goals met or not."""
    off, on = jobs["unpacked"], jobs["packed"]
    ratio = round(on["wall_seconds"] / off["wall_seconds"], 3)
    return {
        "packed_over_unpacked_wall": ratio,
        "goals": {
            "packed_in_half_the_time": ratio <= 0.5,
            "same_best_metric": on["best_metric"] == off["best_metric"],
            "within_10pct_of_p50": all(j["within_10pct"] for j in jobs.values()),
            "none_above_p95": not any(j["above_p95"] for j in jobs.values()),
        },
    }


def print_row(row: dict[str, Any]) -> None:
    f = row["forecast_jct_s"]
    print(
        f"packing {row['packing']:4}: {row['wall_seconds']:7.1f} s (p50 {f['p50']:.1f}, "
        f"p95 {f['p95']:.1f}, {row['error_vs_p50']:+.1%}), best {row['best_metric']}, "
        f"{row['samples_per_s']:.0f} samples/s, GPU {row.get('gpu_util_mean_pct', '-')}%",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="no GPU: a small CNN on the CPU, to check the loop"
    )
    parser.add_argument(
        "--repeats", type=int, help="calibration runs of each small job (0: no calibration)"
    )
    parser.add_argument("--out", type=Path, help="the results file")
    args = parser.parse_args(argv)
    args.device = "cpu" if args.dry_run else "cuda:0"
    if args.repeats is None:
        args.repeats = 0 if args.dry_run else 2
    if args.out is None:
        args.out = Path(tempfile.gettempdir()) / "gpu_job_dry_run.json" if args.dry_run else RESULT
    if not args.dry_run and shutil.which("nvidia-smi") is None:
        parser.error("no nvidia-smi here: without a GPU, --dry-run")
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write(result: dict[str, Any]) -> None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    # `timeout` sends SIGTERM: end as Ctrl-C does, so that MPS is stopped and folders go.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # A Prefect home of its own, shared by its commands (its database migrated once), so
    # that no other Prefect user of this machine shares their servers' database.
    with tempfile.TemporaryDirectory(prefix="gpu-job-prefect-") as home:
        os.environ["PREFECT_HOME"] = home
        result = measure(args, write)
    write(result)
    print(json.dumps({"packed_over_unpacked_wall": result["packed_over_unpacked_wall"]}))
    print(json.dumps(result["goals"]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
