"""Where a job's time goes besides training: the bookkeeping a trainable and the driver pay.

Measured one piece at a time, on the stores a job uses (MLflow and Optuna on SQLite):

- ``ctx.report``: one epoch's metrics (3 values); they are held and written to MLflow in one
  batch with the checkpoint that follows (work pool) or when the segment ends (local pool);
- ``ctx.checkpoint``: the digits CNN (width 32) and its Adam state, kept in the local spool
  (a segment of the local pool) or written to MLflow at once (a segment on a work pool);
- the end of a local segment (``ctx.finish``): its held metrics and its newest checkpoint
  handed to MLflow, after 3 epochs;
- ``ctx.restore``: the newest checkpoint found and loaded, once per segment;
- a Prefect task run: a task that does nothing, submitted and awaited in a flow, as the
  local pool runs each segment: wall-clock seconds, and the CPU seconds it costs this process
  and the Prefect server (the ephemeral server this script starts, its CPU read from
  ``/proc``, with 15 s left after the last task run for it to record the events);
- the sampler's ``ask`` after ``n`` finished trials, for ``tpe`` and ``mf-tpe``, with the
  digits search space, in memory; and mf-tpe's ask and tell on SQLite beside ``n`` trials
  paused at a rung, as a job's study holds them: on Optuna's own storage for a database URL
  and on the one a job's driver uses (``tasks/study_storage.py``); and mf-tpe's ask beside
  ``n`` (up to 10,000) trials stopped along a rung ladder, which fits its model every time
  (``--proposals`` measures that alone and writes it into the results file);
- a command's exit: ``elastune run`` of a 2-trial digits job in a fresh process, the seconds
  from its last exit handler to the process's end (CPython's last collections and module
  teardown), as the command leaves it (what lives at exit frozen out of those
  collections, ``flows/gc_freeze.py``) and with that undone.

Beside them, one epoch of the digits CNN (width 32) on this machine, the training the
bookkeeping is paid for. Run: ``python benchmarks/overhead.py`` (no ``PREFECT_API_URL``);
writes ``benchmarks/results/overhead.json``. Medians of repeated calls; the machine's other
load shows in them, so read them to about 20%.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULT = ROOT / "benchmarks" / "results" / "overhead.json"

from elastune.flows.ephemeral import RECORDER_BATCHES  # noqa: E402  (after the path)


def median_seconds(call: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def tracking_costs(tmp: Path) -> dict[str, float]:
    """ctx.report, ctx.checkpoint, a segment's end and ctx.restore of the digits CNN, and
    one epoch of it."""
    import torch

    from elastune.tasks.checkpoint_spool import Spool
    from elastune.tasks.context import TrialContext
    from elastune.tasks.tracking import Tracker
    from examples.digits import Net, data

    tracker = Tracker(f"sqlite:///{tmp}/mlflow.db", "overhead")
    parent = tracker.start_job("job", {}, {})
    model = Net(32)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = iter(range(1, 100_000))

    def context(spool: Spool | None) -> TrialContext:
        run_id = tracker.start_trial("job", parent, next(steps), {})
        return TrialContext(
            trial=0,
            start=0,
            stop=10**6,
            max_resource=10**6,
            run_id=run_id,
            tracker=tracker,
            spool=spool,
        )

    local, direct = context(Spool(tmp / "spool")), context(None)

    def report(ctx: TrialContext) -> None:
        ctx.resource = next(steps)
        ctx.report(val_accuracy=0.9, val_loss=0.3, train_loss=0.2)

    def checkpoint(ctx: TrialContext) -> None:
        ctx.resource = next(steps)
        ctx.checkpoint(model=model, optimizer=optimizer)

    ends: list[float] = []

    def segment_end() -> None:
        for _ in range(3):
            report(local)
            checkpoint(local)
        began = time.perf_counter()
        local.finish()
        ends.append(time.perf_counter() - began)

    x, y, _, _ = data()

    def epoch() -> None:
        model.train()
        for begin in range(0, len(y) - 63, 64):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(
                model(x[begin : begin + 64]), y[begin : begin + 64]
            )
            loss.backward()
            optimizer.step()

    costs = {
        "ctx.report": median_seconds(lambda: report(local), 30),
        "ctx.checkpoint (local pool: spool)": median_seconds(lambda: checkpoint(local), 15),
        "ctx.checkpoint (work pool: MLflow)": median_seconds(lambda: checkpoint(direct), 15),
    }
    local.finish()
    for _ in range(10):
        segment_end()
    costs["segment end (3 epochs held)"] = statistics.median(ends)
    costs["ctx.restore"] = median_seconds(
        lambda: local.restore(model=model, optimizer=optimizer), 10
    )
    costs["digits epoch (width 32)"] = median_seconds(epoch, 5)
    return costs


def task_run_costs() -> dict[str, float]:
    """Per no-op Prefect task run submitted and awaited inside a flow: wall seconds, this
    process's CPU seconds and the ephemeral server's."""
    from prefect import flow, task
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.task_runners import ThreadPoolTaskRunner

    @task
    def nothing() -> None:
        return None

    def server_cpu() -> float:
        process = SubprocessASGIServer().server_process
        assert process is not None, "set no PREFECT_API_URL: this measures the local server"
        text = Path(f"/proc/{process.pid}/stat").read_text()
        fields = text[text.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=2))
    def many(n: int) -> dict[str, float]:
        nothing.submit().result()  # the first task run pays for set-up
        time.sleep(5)
        server, cpu, wall = server_cpu(), time.process_time(), time.perf_counter()
        for _ in range(n):
            nothing.submit().result()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        time.sleep(15)  # the server records the task runs' events after they end
        return {
            "prefect task run (wall)": wall / n,
            "prefect task run (driver CPU)": cpu / n,
            "prefect task run (server CPU)": (server_cpu() - server) / n,
        }

    return many(200)


def sampler_costs() -> dict[str, dict[int, float]]:
    """Seconds per ask after n finished trials, for tpe and mf-tpe on the digits space."""
    import optuna

    from elastune.planners.spec import distributions, load_job, make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out: dict[str, dict[int, float]] = {}
    for name in ("tpe", "mf-tpe"):
        spec = load_job(ROOT / "examples" / "digits.yaml", [f"sampler.name={name}"])
        study = optuna.create_study(direction="maximize", sampler=make_sampler(spec))
        space = distributions(spec)
        costs: dict[int, float] = {}
        for n in (10, 100, 300):
            while len(study.trials) < n:
                trial = study.ask(space)
                study.tell(trial, sum(hash(str(v)) % 100 for v in trial.params.values()) / 400)
            costs[n] = median_seconds(lambda s=study, d=space: s.tell(s.ask(d), 0.5), 5)
        out[name] = costs
    return out


def ladder_ask_costs(sizes: tuple[int, ...] = (100, 1000, 10_000)) -> dict[int, float]:
    """Seconds per mf-tpe ask beside n trials stopped along a rung ladder, as a job's study
    holds them: every trial has a value at 3 epochs, a third of them at 9, a ninth at 27
    (the digits job's rungs), so the model is fitted for every proposal. The study is
    filled with random draws; the asks timed are mf-tpe's, in memory."""
    import optuna
    from optuna.trial import TrialState

    from elastune.planners.spec import distributions, load_job, make_sampler

    spec = load_job(ROOT / "examples" / "digits.yaml", ["sampler.name=mf-tpe"])
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(0))
    space = distributions(spec)
    costs: dict[int, float] = {}
    for n in sizes:
        study.sampler = optuna.samplers.RandomSampler(n)
        # (the study's trials are counted here: study.trials copies them all)
        for _ in range(n - len(study.get_trials(deepcopy=False))):
            trial = study.ask(space)
            value = sum(hash(str(v)) % 100 for v in trial.params.values()) / 400
            rungs = (3, 9, 27)[: 1 + (trial.number % 3 == 0) + (trial.number % 9 == 0)]
            for step in rungs:
                trial.report(value + step / 100, step)
            done = rungs[-1] == 27
            study.tell(trial, value if done else None, state=None if done else TrialState.PRUNED)
        study.sampler = make_sampler(spec, seed=n)

        def ask() -> None:
            study.tell(study.ask(space), state=TrialState.PRUNED)

        costs[n] = median_seconds(ask, 5)
    return costs


def paused_ask_costs(tmp: Path, driver: bool) -> dict[int, float]:
    """Seconds per mf-tpe ask and tell on a SQLite study holding n trials paused at a rung
    (Optuna keeps them running): on Optuna's cached storage, which reads every running
    trial back from the database each time the study's trials are read, or (``driver``) on
    the storage a job's driver uses, which reads them from memory."""
    import optuna

    from elastune.planners.spec import distributions, load_job, make_sampler
    from elastune.tasks.study_storage import driver_storage

    spec = load_job(ROOT / "examples" / "digits.yaml", ["sampler.name=mf-tpe"])
    url = f"sqlite:///{tmp}/paused-{driver}.db"
    storage = driver_storage(url) if driver else url
    study = optuna.create_study(storage=storage, sampler=make_sampler(spec))
    space = distributions(spec)
    costs: dict[int, float] = {}
    for n in (10, 100, 300, 1000):
        while len(study.trials) < n:
            trial = study.ask(space)
            for step in (1, 2, 3):  # a rung's intermediate values, then paused
                trial.report(0.5, step)
        costs[n] = median_seconds(lambda: study.tell(study.ask(space), 0.5), 5)
    return costs


EXIT_PROBE = """
import atexit, gc, sys, time
atexit.register(lambda: print(time.time(), file=sys.stderr))  # first in, so it runs last
from elastune.flows.cli import main
code = main(["run", sys.argv[1], "--json"])
if sys.argv[2] == "collected":
    atexit.unregister(gc.freeze)
raise SystemExit(code)
"""


def exit_costs(tmp: Path, repeat: int = 3) -> dict[str, float]:
    """Seconds from a job command's last exit handler to its process's end, the median of
    ``repeat`` runs in turns: as it is (``frozen``) and with the objects collected. The job
    is ``elastune profile``'s first calibration job of the digits example, 2 workers."""
    import yaml

    from elastune.flows.calibrate import Run, calibration_job
    from elastune.planners.spec import load_job

    spec = load_job(ROOT / "examples" / "digits.yaml", ["compute.workers=2"])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    seconds: dict[str, list[float]] = {"frozen": [], "collected": []}
    for i in range(repeat):
        for mode, runs in seconds.items():
            folder = tmp / f"exit-{mode}-{i}"
            folder.mkdir()
            job = calibration_job(spec, Run(1, 1), 1.0, folder)
            (folder / "job.yaml").write_text(yaml.safe_dump(job.model_dump(mode="json")))
            done = subprocess.run(
                [sys.executable, "-c", EXIT_PROBE, str(folder / "job.yaml"), mode],
                cwd=folder,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            ended = time.time()
            runs.append(ended - float(done.stderr.split()[-1]))
    return {f"a command's exit, {mode}": statistics.median(v) for mode, v in seconds.items()}


def main() -> int:
    if sys.argv[1:] == ["--proposals"]:  # the sampler's proposals alone, into the results
        return proposals_only()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # no line per task run
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name, value in RECORDER_BATCHES.items():  # as elastune run's own server
        os.environ.setdefault(name, value)
    with tempfile.TemporaryDirectory() as tmp:
        costs = tracking_costs(Path(tmp))
    costs.update(task_run_costs())
    with tempfile.TemporaryDirectory() as tmp:
        costs.update(exit_costs(Path(tmp)))
    samplers = sampler_costs()
    samplers["mf-tpe, n along a rung ladder"] = ladder_ask_costs()
    with tempfile.TemporaryDirectory() as tmp:
        samplers["mf-tpe, SQLite (Optuna), n paused"] = paused_ask_costs(Path(tmp), False)
        samplers["mf-tpe, SQLite (driver), n paused"] = paused_ask_costs(Path(tmp), True)
    result = {
        "seconds": {k: round(v, 4) for k, v in costs.items()},
        "sampler_ask_seconds": {
            name: {str(n): round(s, 4) for n, s in by_n.items()} for name, by_n in samplers.items()
        },
    }
    for name, seconds in result["seconds"].items():
        print(f"{name:<38}{seconds * 1000:>10.1f} ms")
    for name, by_n in result["sampler_ask_seconds"].items():
        row = "  ".join(f"{n} trials: {s * 1000:.1f} ms" for n, s in by_n.items())
        print(f"{name + ' ask':<38}{row}")
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULT}")
    return 0


def proposals_only() -> int:
    """``--proposals``: mf-tpe's ask along a rung ladder, written into the results file."""
    costs = ladder_ask_costs()
    result = json.loads(RESULT.read_text())
    name = "mf-tpe, n along a rung ladder"
    result["sampler_ask_seconds"][name] = {str(n): round(s, 4) for n, s in costs.items()}
    print(
        f"{name + ' ask':<38}"
        + "  ".join(f"{n} trials: {s * 1000:.1f} ms" for n, s in costs.items())
    )
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
