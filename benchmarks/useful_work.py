"""how much of a tuning job's time trains the model.

The same trainable (a two-layer MLP on a synthetic 8-class problem made in memory by
scikit-learn, 12000 training and 4000 validation rows, so no download), the same search space
and the same budget from the command's start, under:

- elastune's default: bloom + mf-tpe, ``compute.workers: W``, run as ``python -m elastune.flows.cli
  run`` (Prefect's ephemeral server, MLflow and Optuna on SQLite) with ``max_trials: null``,
  and cut at the budget by the wall clock (SIGKILL of its process group), as Optuna's arm
  is: the budget counts from the command's start, ``budget.deadline`` from the job's, a few
  seconds later (docs/job-file.md);
- Optuna's own loop: ``TPESampler`` + ``HyperbandPruner`` (same ladder: 1 to 27 epochs,
  eta 3), ``study.optimize(n_jobs=W)`` in memory, run as its own process and cut alike.

Each arm appends one line per epoch to a log (wall time, thread CPU seconds of the epoch's
training and validation, validation accuracy), so both are measured by the same code.
Printed per seed and as medians:

- epochs trained in the budget (epochs whose line was written before the cut);
- seconds from the command's start to the first epoch, and to the target accuracy;
- the fraction of core-seconds spent in training code: the thread CPU time
  (``time.thread_time``) of those epochs over the CPU time of the command's whole process
  tree (every descendant's ``utime + stime`` from ``/proc/PID/stat``, sampled every 0.25 s
  and at the cut: a process that lives less than that is missed), and over the cores'
  wall-clock seconds (``W`` cores times the budget). Both arms give torch
  ``cores // W`` threads per worker (``flows/drive.py`` does so for elastune); with one,
  the training thread's CPU time is all of the epoch's compute.

The CPU of the elastune command is also split by process (the driver, its worker processes,
Prefect's server).

    python benchmarks/useful_work.py            # 5 seeds, 180 s, 2 workers (about 33 min)
    python benchmarks/useful_work.py --quick    # 1 seed, 45 s

Writes ``benchmarks/results/useful_work.json`` (``useful_work_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MAX_EPOCHS = 27
SPACE: dict[str, dict[str, Any]] = {
    "lr": {"type": "float", "low": 1.0e-4, "high": 0.3, "log": True},
    "width": {"type": "int", "low": 16, "high": 512, "log": True},
    "dropout": {"type": "float", "low": 0.0, "high": 0.5},
    "optimizer": {"type": "categorical", "choices": ["sgd", "adam"]},
}
LOG = "USEFUL_WORK_LOG"  # where the trainable appends its epochs; unset: nowhere
BATCH = 64
TRAIN = 12_000  # rows; 4000 more validate


# --- the trainable ----------------------------------------------------------------------


@functools.cache
def dataset() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training and validation rows: 8 classes of 2 clusters in 64 dimensions."""
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=16000,
        n_features=64,
        n_informative=24,
        n_classes=8,
        n_clusters_per_class=2,
        class_sep=1.5,
        random_state=0,
    )
    x = torch.tensor(x, dtype=torch.float32)
    y = torch.tensor(y)
    return x[:TRAIN], y[:TRAIN], x[TRAIN:], y[TRAIN:]


def build(config: dict[str, Any]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    width = int(config["width"])
    model = torch.nn.Sequential(
        torch.nn.Linear(64, width),
        torch.nn.ReLU(),
        torch.nn.Dropout(config["dropout"]),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 8),
    )
    kind = torch.optim.Adam if config["optimizer"] == "adam" else torch.optim.SGD
    extra = {"momentum": 0.9} if config["optimizer"] == "sgd" else {}
    return model, kind(model.parameters(), lr=config["lr"], **extra)


def epoch(model: torch.nn.Module, optimizer: torch.optim.Optimizer, order: torch.Tensor) -> float:
    """Train one epoch in ``order`` and validate; the validation accuracy. Appends the
    epoch's wall time, thread CPU seconds and accuracy to ``$USEFUL_WORK_LOG``."""
    began = time.thread_time()
    x, y, vx, vy = dataset()
    model.train()
    for start in range(0, len(order), BATCH):
        rows = order[start : start + BATCH]
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(vx).argmax(1) == vy).float().mean().item()
    cpu = time.thread_time() - began
    if os.environ.get(LOG):
        with open(os.environ[LOG], "a") as out:
            out.write(json.dumps({"t": time.time(), "cpu": cpu, "acc": accuracy}) + "\n")
    return accuracy


def train(config: dict[str, Any], ctx: Any) -> None:
    """The trainable elastune runs (``benchmarks.useful_work:train``)."""
    with ctx.seeded():
        model, optimizer = build(config)
    start = ctx.restore(model=model, optimizer=optimizer)
    for step in ctx.range(start):
        order = torch.randperm(TRAIN, generator=ctx.generator(step))
        ctx.report(val_accuracy=epoch(model, optimizer, order))
        ctx.checkpoint(model=model, optimizer=optimizer)


# --- the two arms, each its own process ---------------------------------------------------


def job_file(folder: Path, seed: int, workers: int) -> Path:
    """elastune's default job on this trainable, its stores in ``folder``."""
    job = {
        "name": "useful-work",
        "trainable": "benchmarks.useful_work:train",
        "metric": "val_accuracy",
        "space": SPACE,
        "sampler": {"seed": seed},
        "scheduler": {"max_trials": None, "max_resource": MAX_EPOCHS},
        "compute": {"workers": workers},
        "tracking": {
            "mlflow_uri": f"sqlite:///{folder}/mlflow.db",
            "optuna_storage": f"sqlite:///{folder}/optuna.db",
        },
    }
    path = folder / "job.yaml"
    path.write_text(json.dumps(job))  # JSON is YAML
    return path


def optuna_arm(seed: int, workers: int, budget: float) -> None:
    """Optuna's own loop on the same space: TPE + Hyperband pruning, ``n_jobs=workers``."""
    import optuna

    from elastune.planners.spec import distributions, parse_job

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(max(1, torch.get_num_threads() // workers))  # as flows/drive.py
    spec = parse_job({"name": "x", "trainable": "x:y", "metric": "m", "space": SPACE})
    space = distributions(spec)

    def objective(trial: optuna.Trial) -> float:
        config = {name: suggest(trial, name, d) for name, d in space.items()}
        model, optimizer = build(config)
        generator = torch.Generator().manual_seed(seed * 100_003 + trial.number)
        accuracy = 0.0
        for step in range(1, MAX_EPOCHS + 1):
            accuracy = epoch(model, optimizer, torch.randperm(TRAIN, generator=generator))
            trial.report(accuracy, step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return accuracy

    study = optuna.create_study(
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=optuna.pruners.HyperbandPruner(1, MAX_EPOCHS, 3),
    )
    study.optimize(objective, n_jobs=workers, timeout=budget)


def suggest(trial: Any, name: str, distribution: Any) -> Any:
    """``trial.suggest_*`` for one of :func:`elastune.planners.spec.distributions`'
    distributions."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    d = distribution
    if isinstance(d, CategoricalDistribution):
        return trial.suggest_categorical(name, d.choices)
    if isinstance(d, IntDistribution):
        return trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log)
    return trial.suggest_float(name, d.low, d.high, step=d.step, log=d.log)


# --- measuring a command -----------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def processes() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds it has used itself) of every process."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()
        found[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK)
    return found


def label(pid: int, root: int) -> str:
    if pid == root:
        return "command"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        command = Path(f"/proc/{root}/cmdline").read_bytes()
    except OSError:
        return "other"
    if argv == command:  # forks of the command: its fork server and workers
        return "workers"
    text = argv.replace(b"\0", b" ").decode(errors="replace")
    return "prefect server" if "uvicorn" in text or "server" in text else "other"


@dataclass
class Watch:
    """CPU seconds of a process tree, by process, as last seen."""

    root: int
    cpu: dict[int, float] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)

    def sample(self) -> None:
        table = processes()
        tree, frontier = set(), {self.root}
        while frontier:
            tree |= frontier
            frontier = {pid for pid, (parent, _) in table.items() if parent in frontier} - tree
        for pid in tree & table.keys():
            self.cpu[pid] = table[pid][1]
            # Seen between fork and exec, a child still shows its parent's command line.
            if self.labels.get(pid, "other") in ("other", "workers"):
                self.labels[pid] = label(pid, self.root)

    def by_label(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, seconds in self.cpu.items():
            out[self.labels[pid]] = out.get(self.labels[pid], 0.0) + seconds
        return {k: round(v, 1) for k, v in out.items()}


def run_cut(command: list[str], budget: float, env: dict[str, str]) -> tuple[float, Watch]:
    """Start ``command``, watch its process tree, kill it all at ``budget`` seconds; its
    start time (epoch seconds) and what it used."""
    began = time.time()
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    watch = Watch(process.pid)
    while time.time() - began < budget and process.poll() is None:
        watch.sample()
        time.sleep(0.25)
    watch.sample()
    with_children = set(watch.cpu)
    os.killpg(process.pid, signal.SIGKILL)
    for pid in with_children - {process.pid}:  # any that left the group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    _, stderr = process.communicate()
    if process.returncode not in (0, -signal.SIGKILL):
        print(stderr.decode(errors="replace")[-3000:], file=sys.stderr)
    return began, watch


def measure(
    arm: str, seed: int, budget: float, workers: int, target: float, folder: Path
) -> dict[str, Any]:
    """Run one arm for one seed and read its epoch log."""
    log = folder / f"{arm}-{seed}.jsonl"
    env = dict(os.environ, **{LOG: str(log)}, PYTHONPATH=str(ROOT))
    if arm == "elastune":
        stores = folder / f"stores-{seed}"
        stores.mkdir()
        job = job_file(stores, seed, workers)
        command = [sys.executable, "-m", "elastune.flows.cli", "run", str(job), "--json"]
    else:
        command = [sys.executable, __file__, "--optuna-arm", str(seed)]
        command += ["--workers", str(workers), "--budget", str(budget)]
    began, watch = run_cut(command, budget, env)
    lines = log.read_text().splitlines() if log.exists() else []
    epochs = [e for e in map(json.loads, lines) if e["t"] - began <= budget]
    reached = [e["t"] - began for e in epochs if e["acc"] >= target]
    training = sum(e["cpu"] for e in epochs)
    used = sum(watch.cpu.values())
    return {
        "epochs": len(epochs),
        "first_epoch_s": round(epochs[0]["t"] - began, 1) if epochs else None,
        "to_target_s": round(min(reached), 1) if reached else None,
        "best_accuracy": round(max((e["acc"] for e in epochs), default=0.0), 4),
        "training_cpu_s": round(training, 1),
        "process_tree_cpu_s": round(used, 1),
        "cpu_by_process": watch.by_label(),
        "training_share_of_cpu": round(training / used, 3) if used else None,
        "training_share_of_cores": round(training / (workers * budget), 3),
    }


# --- the report --------------------------------------------------------------------------


def median(values: list[Any]) -> float | None:
    """The median of the values a seed produced; a seed that never reached the target
    counts as never (infinitely late)."""
    if not values:
        return None
    middle = statistics.median(float("inf") if v is None else v for v in values)
    return None if middle == float("inf") else round(middle, 3)


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    keys = ["epochs", "first_epoch_s", "to_target_s", "training_share_of_cpu"]
    keys += ["training_share_of_cores"]
    medians = {arm: {k: median([r[k] for r in rs]) for k in keys} for arm, rs in runs.items()}
    out: dict[str, Any] = {"medians": medians}
    if {"elastune", "optuna"} <= runs.keys():
        e, o = medians["elastune"], medians["optuna"]
        out["epochs_ratio"] = round(e["epochs"] / o["epochs"], 3) if o["epochs"] else None
        out["goal"] = {
            "epochs_ratio >= 0.9": out["epochs_ratio"] is not None and out["epochs_ratio"] >= 0.9,
            "target no later than optuna": e["to_target_s"] is not None
            and (o["to_target_s"] is None or e["to_target_s"] <= o["to_target_s"]),
            "training share of cpu >= 0.85": (e["training_share_of_cpu"] or 0) >= 0.85,
        }
    return out


def show(arm: str, seed: int, row: dict[str, Any]) -> None:
    print(
        f"{arm:<9} seed {seed}: {row['epochs']:>5} epochs, first at {row['first_epoch_s']} s, "
        f"target at {row['to_target_s']} s, best {row['best_accuracy']}, "
        f"training {row['training_share_of_cpu']} of CPU used "
        f"({row['training_share_of_cores']} of cores); CPU {row['cpu_by_process']}",
        flush=True,
    )


def prepare(home: Path) -> None:
    """A Prefect home whose database is already migrated, and the cache's empty MLflow store
    and Optuna database made, as a user's machine has them after a first run (made by this
    checkout's code, in a process of their own)."""
    home.mkdir(parents=True, exist_ok=True)
    made = (
        "import sys, pathlib, elastune.infra.server as i, elastune.tasks.tracking as t, "
        "elastune.tasks.study_storage as s;"
        "home = pathlib.Path(sys.argv[1]); i.new_database(home / 'prefect.db');"
        "t.new_store(home / 'mlflow.db'); s.driver_storage(f'sqlite:///{home}/optuna.db')"
    )
    command = [sys.executable, "-c", made, str(home)]
    subprocess.run(
        command, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, capture_output=True
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 45 s")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=180.0, help="seconds per run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.93, help="validation accuracy")
    parser.add_argument("--arms", default="elastune,optuna")
    parser.add_argument("--optuna-arm", type=int, metavar="SEED", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.optuna_arm is not None:
        optuna_arm(args.optuna_arm, args.workers, args.budget)
        return 0
    if args.quick:
        args.seeds, args.budget = 1, 45.0
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="useful-work-") as tmp:
        folder = Path(tmp)
        os.environ["PREFECT_HOME"] = str(folder / "prefect")
        os.environ.pop("PREFECT_API_URL", None)  # the ephemeral server, as a local user has
        prepare(folder / "prefect")
        for seed in range(args.seeds):
            for arm in args.arms.split(","):
                row = measure(arm, seed, args.budget, args.workers, args.target, folder)
                runs.setdefault(arm, []).append(row)
                show(arm, seed, row)
    result = {
        "setup": {**vars(args), "cores": os.cpu_count(), "max_epochs": MAX_EPOCHS},
        "runs": runs,
        **summarize(runs),
    }
    del result["setup"]["optuna_arm"]
    for arm, row in result["medians"].items():
        print(f"median {arm}: {row}")
    if "goal" in result:
        print(f"elastune/optuna epochs: {result['epochs_ratio']}; goal: {result['goal']}")
    name = "useful_work_quick.json" if args.quick else "useful_work.json"
    (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
