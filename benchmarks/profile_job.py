"""Where a local job's time goes: a profile of ``elastune run`` on the useful-work job.

Runs ``python -m elastune.flows.cli run`` on ``benchmarks/useful_work.py``'s job (bloom + mf-tpe,
two workers, fresh stores, a migrated Prefect home) for ``--seconds``, in a process that also
runs a sampling profiler, then kills it. The driver and each of its worker processes
(tasks/worker_processes.py: forks of the command, which inherit the profiler) run a sampler that
wakes every 5 ms and charges each thread's CPU time since the last wake
(``time.pthread_getcpuclockid``) to the stack that thread is in, so it sees every thread
(training, the driver, Prefect's) and counts CPU, not waiting. Stacks are summed into parts
(the training epochs, ``ctx``'s bookkeeping, the driver's steps, Prefect, imports), over
the driver and its workers. Beside it, wall-clock timers around the driver's and the
segment's steps give the seconds per call, Python's garbage collections are counted and
timed by generation (each stops every thread of its process), and the Prefect server's CPU
is read from ``/proc``.

    python benchmarks/profile_job.py [--seconds 60]

Writes ``benchmarks/results/profile_job.json``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULT = ROOT / "benchmarks" / "results" / "profile_job.json"

# A stack belongs to the first part whose marker it holds (a file and function, or a folder).
PARTS = [
    ("training epochs", "useful_work.py:epoch"),
    ("imports", "importlib._bootstrap"),
    ("ctx: report, checkpoint, restore, finish", "tasks/context.py:"),
    ("segment: tags, report, other", "tasks/train.py:"),
    ("driver: record a result", "flows/job.py:record"),
    ("driver: tell Optuna and MLflow a result", "flows/job.py:flush"),
    ("driver: hand out segments (sampler, journal)", "flows/drive.py:admit"),
    ("driver: start a segment (MLflow run)", "flows/drive.py:start"),
    ("driver: create the job", "flows/job.py:create"),
    ("workers: take a segment, send its report", "tasks/worker_processes.py:"),
    ("driver: other", "flows/"),
    ("Prefect (engine, client, events, logs)", "prefect/"),
]
# Steps timed by the wall clock: (module, owner in it or None, function).
TIMED = [
    ("elastune.flows.drive", None, "admit"),
    ("elastune.flows.drive", None, "start"),
    ("elastune.flows.launch", "Launcher", "next_report"),
    ("elastune.flows.job", "Job", "record"),
    ("elastune.flows.job", "Job", "flush"),
    ("elastune.flows.job", "Job", "create"),
    ("elastune.tasks.train", None, "run_segment"),
    ("elastune.tasks.context", "TrialContext", "report"),
    ("elastune.tasks.context", "TrialContext", "checkpoint"),
    ("elastune.tasks.context", "TrialContext", "restore"),
    ("elastune.tasks.context", "TrialContext", "finish"),
    ("elastune.tasks.tracking", "Tracker", "save_report"),
]


def part(stack: tuple[str, ...]) -> str:
    text = " ".join(stack)
    return next((name for name, marker in PARTS if marker in text), "other")


def frames_of(frame: Any) -> tuple[str, ...]:
    names = []
    while frame is not None:
        code = frame.f_code
        names.append(f"{code.co_filename.split('site-packages/')[-1]}:{code.co_name}")
        frame = frame.f_back
    return tuple(names)


def profile_this_process(out: Path) -> None:
    """Time the steps and count the collections here and in every worker; sample every
    thread's CPU by stack in the driver once it has forked its workers' server (it forks
    only while it runs one thread) and in each worker as it starts. On SIGUSR1 each process
    dumps its figures to ``out``'s folder, as ``profile-PID.json``."""
    import importlib

    import elastune.tasks.worker_processes

    cpu: collections.Counter[str] = collections.Counter()
    walls: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    collected: dict[int, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    began = [0.0]

    def sample() -> None:
        me, last = threading.get_ident(), {}
        while True:
            time.sleep(0.005)
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                try:
                    now = time.clock_gettime(time.pthread_getcpuclockid(ident))
                except OSError:  # the thread ended
                    continue
                spent = now - last.get(ident, now)
                last[ident] = now
                if spent > 0:  # an ended thread's id reused by a new one reads lower
                    cpu[part(frames_of(frame))] += spent

    def timed(function: Callable[..., Any], label: str) -> Callable[..., Any]:
        @functools.wraps(function)  # pickled by its name, as the driver sends run_segment
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            begun = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                walls[label][0] += 1
                walls[label][1] += time.perf_counter() - begun

        return wrapper

    def collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
            return
        took, seen = time.perf_counter() - began[0], collected[info["generation"]]
        seen[0], seen[1], seen[2] = seen[0] + 1, seen[1] + took, max(seen[2], took)

    def dump(*_: Any) -> None:
        gcs = {str(g): [n, s, most] for g, (n, s, most) in collected.items()}
        data = {"cpu_by_part": dict(cpu), "steps": dict(walls), "collections": gcs}
        out.with_name(f"profile-{os.getpid()}.json").write_text(json.dumps(data))

    def start_sampling() -> None:
        signal.signal(signal.SIGUSR1, dump)
        threading.Thread(target=sample, daemon=True).start()

    gc.callbacks.append(collection)
    gc.disable()  # these imports are the command's own, which starts without collections
    for module_name, owner_name, name in TIMED:
        module = importlib.import_module(module_name)
        owner = module if owner_name is None else getattr(module, owner_name)
        setattr(owner, name, timed(getattr(owner, name), f"{owner_name or module_name}.{name}"))
    gc.enable()
    fork_server_here, serve = (
        elastune.tasks.worker_processes.fork_server_here,
        elastune.tasks.worker_processes._serve,
    )

    def forked() -> bool:
        made = fork_server_here()
        start_sampling()
        return made

    def worker(*args: Any) -> int:
        cpu.clear()  # what the driver counted before the fork is the driver's
        walls.clear()
        collected.clear()
        start_sampling()
        return serve(*args)

    elastune.tasks.worker_processes.fork_server_here = forked
    elastune.tasks.worker_processes._serve = worker


def merged(dumps: list[dict[str, Any]]) -> dict[str, Any]:
    """The driver's and the workers' figures added up."""
    cpu: collections.Counter[str] = collections.Counter()
    steps: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    gcs: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for data in dumps:
        cpu.update(data["cpu_by_part"])
        for label, (n, seconds) in data["steps"].items():
            steps[label] = [steps[label][0] + n, steps[label][1] + seconds]
        for g, (n, seconds, most) in data["collections"].items():
            seen = gcs[g]
            gcs[g] = [seen[0] + n, seen[1] + seconds, max(seen[2], most)]
    return {
        "cpu_by_part": dict(cpu),
        "steps": {
            k: {"calls": n, "ms_per_call": round(1000 * s / n, 1)} for k, (n, s) in steps.items()
        },
        "collections": {
            g: {"count": n, "seconds": round(s, 3), "longest_ms": round(1000 * most, 1)}
            for g, (n, s, most) in sorted(gcs.items())
        },
    }


def run(seconds: float) -> dict[str, Any]:
    from benchmarks.useful_work import LOG, Watch, job_file, label, prepare, processes

    with tempfile.TemporaryDirectory(prefix="profile-job-") as tmp:
        folder = Path(tmp)
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env.update(PREFECT_HOME=str(folder), PYTHONPATH=str(ROOT), **{LOG: str(folder / "e")})
        # What flows/cli.py sets, set before the profiler imports Prefect and MLflow.
        env.update(PREFECT_LOGGING_LEVEL="WARNING", PREFECT_SERVER_ANALYTICS_ENABLED="false")
        env.update(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false")
        prepare(folder)
        out = folder / "profile.json"
        command = [sys.executable, __file__, "--child", str(out), str(job_file(folder, 0, 2))]
        began = time.time()
        child = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
        watch = Watch(child.pid)
        while time.time() - began < seconds:
            watch.sample()
            time.sleep(0.25)
        watch.sample()
        # The driver, and its workers: the children of its fork server, its own fork.
        parents = {pid: parent for pid, (parent, _) in processes().items()}
        forks = {p for p, parent in parents.items() if label(p, child.pid) == "workers"}
        servers = {p for p in forks if parents[p] == child.pid}
        profiled = [child.pid, *(p for p in forks if parents[p] in servers)]
        for pid in profiled:
            os.kill(pid, signal.SIGUSR1)
        files = [folder / f"profile-{pid}.json" for pid in profiled]
        while not all(f.exists() for f in files):
            time.sleep(0.1)
        time.sleep(0.5)  # each dump is one write; let it finish
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        data = merged([json.loads(f.read_text()) for f in files])
        log = folder / "e"
        epochs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    total = sum(data["cpu_by_part"].values())
    return {
        "seconds": seconds,
        "epochs": len(epochs),
        "first_epoch_s": round(epochs[0]["t"] - began, 1) if epochs else None,
        "cpu_seconds_by_process": watch.by_label(),
        "cpu_share_by_part": {
            k: round(v / total, 3)
            for k, v in sorted(data["cpu_by_part"].items(), key=lambda x: -x[1])
        },
        "cpu_seconds_sampled": round(total, 1),
        "steps": data["steps"],
        "collections_by_generation": data["collections"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--child", nargs=2, metavar=("OUT", "JOB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        profile_this_process(Path(args.child[0]))
        sys.argv = ["elastune.flows.cli", "run", args.child[1]]
        runpy.run_module("elastune.flows.cli", run_name="__main__")
        return 0
    result = run(args.seconds)
    print(f"{result['epochs']} epochs in {args.seconds:g} s, first at {result['first_epoch_s']} s")
    print(f"CPU seconds by process: {result['cpu_seconds_by_process']}")
    for name, share in result["cpu_share_by_part"].items():
        print(f"  {name:<48}{share:>7.1%}")
    for name, step in sorted(result["steps"].items()):
        print(f"  {name:<32}{step['calls']:>6} calls {step['ms_per_call']:>9.1f} ms each")
    for generation, seen in result["collections_by_generation"].items():
        print(
            f"  garbage collections, generation {generation}: {seen['count']}, "
            f"{seen['seconds']} s, the longest {seen['longest_ms']} ms"
        )
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
