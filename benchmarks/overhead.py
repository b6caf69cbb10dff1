"""Where a job's time goes besides training: the bookkeeping a trainable and the driver pay.

Measured one piece at a time, on the same stores a job uses (MLflow and Optuna on SQLite):

- ``ctx.report``: one epoch's metrics (3 values) written to the trial's MLflow run;
- ``ctx.checkpoint``: the digits CNN (width 32) and its Adam state saved as an MLflow
  artifact;
- ``ctx.restore``: the newest checkpoint found and loaded, once per segment;
- a Prefect task run: a task that does nothing, submitted and awaited in a flow, as the
  local pool runs each segment;
- the sampler's ``ask`` after ``n`` finished trials, for ``tpe`` and ``mf-tpe``, with the
  digits search space.

Beside them, one epoch of the digits CNN (width 32) on this machine, the training the
bookkeeping is paid for. Run: ``python benchmarks/overhead.py``; writes
``benchmarks/results/overhead.json``. Medians of repeated calls; the machine's other load
shows in them, so read them to about 20%.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULT = ROOT / "benchmarks" / "results" / "overhead.json"


def median_seconds(call: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def tracking_costs(tmp: Path) -> dict[str, float]:
    """ctx.report, ctx.checkpoint and ctx.restore of the digits CNN, and one epoch of it."""
    import torch

    from examples.digits import Net, data
    from tasks.context import TrialContext
    from tasks.tracking import Tracker

    tracker = Tracker(f"sqlite:///{tmp}/mlflow.db", "overhead")
    run_id = tracker.start_trial("job", tracker.start_job("job", {}, {}), 0, {})
    model = Net(32)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ctx = TrialContext(
        trial=0, start=0, stop=1000, max_resource=1000, run_id=run_id, tracker=tracker
    )
    steps = iter(range(1, 10_000))

    def report() -> None:
        ctx.report(next(steps), val_accuracy=0.9, val_loss=0.3, train_loss=0.2)

    def checkpoint() -> None:
        ctx.resource = next(steps)
        ctx.checkpoint(model=model, optimizer=optimizer)

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

    return {
        "ctx.report": median_seconds(report, 30),
        "ctx.checkpoint": median_seconds(checkpoint, 15),
        "ctx.restore": median_seconds(lambda: ctx.restore(model=model, optimizer=optimizer), 10),
        "digits epoch (width 32)": median_seconds(epoch, 5),
    }


def task_run_cost() -> float:
    """Seconds per no-op Prefect task run submitted and awaited inside a flow."""
    from prefect import flow, task
    from prefect.task_runners import ThreadPoolTaskRunner

    @task
    def nothing() -> None:
        return None

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=2))
    def many(n: int) -> float:
        nothing.submit().result()  # the first task run pays for set-up
        began = time.perf_counter()
        for _ in range(n):
            nothing.submit().result()
        return (time.perf_counter() - began) / n

    return many(40)


def sampler_costs() -> dict[str, dict[int, float]]:
    """Seconds per ask after n finished trials, for tpe and mf-tpe on the digits space."""
    import optuna

    from planners.spec import distributions, load_job, make_sampler

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


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        costs = tracking_costs(Path(tmp))
    costs["prefect task run"] = task_run_cost()
    samplers = sampler_costs()
    result = {
        "seconds": {k: round(v, 4) for k, v in costs.items()},
        "sampler_ask_seconds": {
            name: {str(n): round(s, 4) for n, s in by_n.items()} for name, by_n in samplers.items()
        },
    }
    for name, seconds in result["seconds"].items():
        print(f"{name:<26}{seconds * 1000:>10.1f} ms")
    for name, by_n in result["sampler_ask_seconds"].items():
        row = "  ".join(f"{n} trials: {s * 1000:.1f} ms" for n, s in by_n.items())
        print(f"{name + ' ask':<26}{row}")
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
