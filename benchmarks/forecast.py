"""The forecast figure: profile, plan and run local jobs for real, and hold each
plan's JCT forecast (p50, p95) against the run's measured ``wall_seconds``.

Each job goes through the user's loop, in fresh processes and fresh stores:
``elastune profile JOB --out profile.yaml`` (units timed, then dispatch and job overheads
calibrated by four small jobs), the profile and a deadline added to the job file,
``elastune plan JOB --json``, ``elastune run JOB --json``. Jobs: digits with SHA, and the
LCBench replay trainable (:func:`lcbench_slow`) with Hyperband and SHA, at 0.2 s and 0.5 s
epochs. Goal: every job within 10% of its p50, none above its p95. Beside the p95, the same
plan's p95 were the calibrated numbers and spreads exact (the profile without
``calibration_cov`` and ``calibration_dof``: no band for the calibration's own error), and the stage
whose measured end lay farthest from its forecast p50. Writes benchmarks/results/forecast.json.

    python benchmarks/forecast.py            # the four jobs, about 4 minutes each
    python benchmarks/forecast.py --quick    # two small jobs, to check that it works
    python benchmarks/forecast.py --job examples/cnn.yaml --shares 1,0.5,0.25 \
        --out benchmarks/results/forecast_gpu.json   # one job of yours (on a GPU, say)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
EPOCH_S = "FORECAST_EPOCH_S"  # seconds one epoch of lcbench_slow sleeps

DIGITS = {
    "trainable": "examples.digits:train",
    "metric": "val_accuracy",
    "space": {
        "lr": {"type": "float", "low": 1.0e-4, "high": 0.3, "log": True},
        "width": {"type": "int", "low": 4, "high": 32, "log": True},
    },
    "sampler": {"name": "tpe", "seed": 0},
}
LCBENCH = {
    "trainable": "benchmarks.forecast:lcbench_slow",
    "metric": "val_accuracy",
    "space": {
        "learning_rate": {"type": "float", "low": 1.0e-4, "high": 1.0e-1, "log": True},
        "num_layers": {"type": "int", "low": 1, "high": 5},
    },
    "sampler": {"name": "random", "seed": 0},
}


def lcbench_slow(config: dict[str, Any], ctx: Any) -> None:
    """examples/lcbench.py's replayed curve, each epoch taking ``$FORECAST_EPOCH_S``."""
    from elastune.planners.sim import LCBenchSurrogate

    full = {
        "batch_size": 64,
        "momentum": 0.9,
        "weight_decay": 1e-4,
        "max_units": 256,
        "max_dropout": 0.1,
        **config,
    }
    curve = LCBenchSurrogate("3945").curve(full)
    epoch_s = float(os.environ.get(EPOCH_S, "0.2"))
    for epoch in ctx.range(ctx.restore()):
        time.sleep(epoch_s)
        ctx.report(val_accuracy=curve.metric[epoch - 1])
    ctx.checkpoint()


def jobs(quick: bool) -> list[tuple[str, dict[str, Any], str]]:
    """(name, job file, epoch seconds) of each benchmarked job. Each runs 13-31 s: on a job
    of a few seconds the machine's noise on the start alone (about 0.6 s) is 10% of it."""
    sha = {"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 27}
    out = [
        (
            "digits-sha",
            {**DIGITS, "scheduler": {**sha, "max_trials": 81}, "compute": {"workers": 2}},
            "0",
        ),
        ("lcbench-sha-0.2s", {**LCBENCH, "scheduler": sha, "compute": {"workers": 2}}, "0.2"),
    ]
    if not quick:
        # Hyperband's four brackets run side by side, a slot each: on a machine of fewer
        # cores, slots that train on the CPU slow each other (docs/benchmarks.md), so the
        # replayed curves, which wait as a GPU-bound trainable's CPU does.
        hyperband = {**sha, "name": "hyperband"}
        four = {"workers": 4}
        out += [
            ("lcbench-hyperband-0.2s", {**LCBENCH, "scheduler": hyperband, "compute": four}, "0.2"),
            ("lcbench-sha-0.5s", {**LCBENCH, "scheduler": sha, "compute": {"workers": 3}}, "0.5"),
        ]
    return out


def elastune(args: list[str], folder: Path, epoch_s: str) -> dict[str, Any]:
    """One CLI command in a fresh process in ``folder``; its JSON output."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, EPOCH_S: epoch_s}
    done = subprocess.run(
        [sys.executable, "-m", "elastune.flows.cli", *args, "--json"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"elastune {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def machine_seconds() -> float:
    """Seconds this machine takes for a fixed loop of Python arithmetic, the median of 5:
    taken before the profile and before the run, it tells a run the machine slowed (this
    virtual machine's speed drifts from one minute to the next) from a wrong forecast."""

    def once() -> float:
        began = time.perf_counter()
        total = 0
        for i in range(5_000_000):
            total += i * i
        return time.perf_counter() - began

    return round(statistics.median(once() for _ in range(5)), 4)


def profiled(
    name: str, job: dict[str, Any], folder: Path, epoch_s: str, flags: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``elastune profile`` of ``job`` in ``folder`` with ``flags``: the ``profile:`` section it
    wrote, and its JSON output."""
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump({"name": name, **job}))
    measured = elastune(["profile", str(path), "--out", "profile.yaml", *flags], folder, epoch_s)
    return yaml.safe_load((folder / "profile.yaml").read_text())["profile"], measured


def planned(name: str, job: dict[str, Any], profile: dict[str, Any]) -> dict[str, Any]:
    """``job`` with ``profile`` and a deadline an hour out, so that the cost planner plans
    it: the job file ``elastune plan`` and ``run`` are given."""
    return {**job, "name": name, "budget": {"deadline": "1h"}, "profile": profile}


def held(run: dict[str, Any]) -> dict[str, Any]:
    """``elastune run --json``'s forecast JCT held against its measured wall seconds."""
    forecast, wall = run["forecast"]["jct_s"], run["wall_seconds"]
    stages = {"forecast": run["forecast"]["stages"], "measured": run["measured"]["stages"]}
    error = round(wall / forecast["p50"] - 1, 4)
    return {
        "forecast_jct_s": forecast,
        "measured_jct_s": wall,
        "error_vs_p50": error,
        "within_10pct": abs(error) <= 0.10,
        "above_p95": wall > forecast["p95"],
        "contradicts_profile": run["measured"].get("contradicts_profile", []),
        "stages": stages,
        "worst_stage_end_s": worst_stage_end(stages),
    }


def one(name: str, job: dict[str, Any], epoch_s: str, shares: str = "1") -> dict[str, Any]:
    """Profile (at the device ``shares``), plan and run ``job``; its forecast against its
    measurement."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        speed = {"profile": machine_seconds()}
        profile, measured = profiled(name, job, folder, epoch_s, ["--shares", shares])
        path = folder / "job.yaml"
        path.write_text(yaml.safe_dump(planned(name, job, profile)))
        plan = elastune(["plan", str(path)], folder, epoch_s)
        # the same plan's band were the calibration exact: what its own error adds
        exact = {k: v for k, v in profile.items() if not k.startswith("calibration_")}
        path.write_text(yaml.safe_dump(planned(name, job, exact)))
        exact_band = elastune(["plan", str(path)], folder, epoch_s)["jct_s"]
        path.write_text(yaml.safe_dump(planned(name, job, profile)))
        speed["run"] = machine_seconds()
        run = elastune(["run", str(path)], folder, epoch_s)
        speed["after"] = machine_seconds()
    return {
        "job": name,
        "profile": profile,
        "calibration_walls_s": measured.get("calibration_walls_s"),
        "plan_jct_s": plan["jct_s"],
        "plan_jct_s_calibration_exact": exact_band,
        **held(run),
        "machine_loop_s": speed,
    }


def worst_stage_end(stages: dict[str, Any]) -> float:
    """The measured stage end farthest from its forecast p50, in seconds (+: later)."""
    offs = [
        m["end_s"] - stages["forecast"][name]["end_s"]["p50"]
        for name, m in stages["measured"].items()
    ]
    return round(max(offs, key=abs), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small jobs only")
    parser.add_argument("--job", type=Path, help="this job file instead of the built-in jobs")
    parser.add_argument("--shares", default="1", help="elastune profile --shares for --job")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/forecast.json")
    args = parser.parse_args()
    if args.job:
        job = yaml.safe_load(args.job.read_text())
        chosen = [(job.pop("name", args.job.stem), job, "0")]
    else:
        chosen = jobs(args.quick)
    results = []
    header = f"{'job':22} {'p50 s':>6} {'p95 s':>6} {'measured s':>10} {'vs p50':>7}  above p95"
    print(
        f"{header}  p95 were the calibration exact  worst stage end  "
        "machine loop s: profile, run, after"
    )
    for name, job, epoch_s in chosen:
        row = one(name, job, epoch_s, args.shares if args.job else "1")
        results.append(row)
        f, loop = row["forecast_jct_s"], row["machine_loop_s"]
        print(
            f"{name:22} {f['p50']:6.1f} {f['p95']:6.1f} {row['measured_jct_s']:10.1f} "
            f"{row['error_vs_p50']:+7.1%}  {row['above_p95']!s:9}  "
            f"{row['plan_jct_s_calibration_exact']['p95']:31.2f}  "
            f"{row['worst_stage_end_s']:+14.2f} s  "
            f"{loop['profile']:.3f} {loop['run']:.3f} {loop['after']:.3f}",
            flush=True,
        )
    within = sum(r["within_10pct"] for r in results)
    above = sum(r["above_p95"] for r in results)
    print(f"within 10% of p50: {within}/{len(results)}; above p95: {above}/{len(results)}")
    summary = {"quick": args.quick, "within_10pct": within, "above_p95": above, "jobs": results}
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
