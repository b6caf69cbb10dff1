"""The ``elastune`` command line (docs/architecture.md §4).

Exit codes: 0 done, 1 the job failed, 2 bad input (one line on stderr naming the field or
file; nothing is created in MLflow or Optuna). ``--json`` prints one JSON object on stdout
and nothing else there; logs and progress go to stderr.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastune.flows import api
from elastune.flows.gc_freeze import exit_uncollected
from elastune.infra.sizing import InfraError
from elastune.planners.spec import JobSpec, SpecError, load_job

if TYPE_CHECKING:
    from elastune.planners.cost import Catalog, PlanReport

BAD_INPUT, FAILED = 2, 1
ERROR_LINES = 12  # of a failed trial's error shown when every trial failed


class UsageError(SpecError):
    """A command-line mistake."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exit code 2, one line
        raise UsageError(f"{self.prog}: {message}")


def _emit(payload: dict[str, Any], as_json: bool, human: Callable[[dict[str, Any]], None]) -> None:
    if as_json:
        sys.stdout.write(json.dumps(payload, default=str) + "\n")
    else:
        human(payload)


def _overrides(args: argparse.Namespace) -> list[str]:
    overrides = list(getattr(args, "set", None) or ())
    if getattr(args, "pool", None):
        overrides.append(f"compute.pool={args.pool}")
    return overrides


def _load(args: argparse.Namespace) -> JobSpec:
    return load_job(args.job, _overrides(args))


# --- run ----------------------------------------------------------------------------------


def _print_run(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    best = summary["best"]
    table = Table(title=f"job {summary['job_id']}", show_header=False)
    table.add_row("best trial", "-" if best is None else str(best["trial"]))
    table.add_row("best metric", "-" if best is None else f"{best['metric']:.4f}")
    table.add_row("best config", "-" if best is None else json.dumps(best["config"]))
    for key in ("trials", "segments", "wall_seconds", "mlflow_run_id", "optuna_storage"):
        table.add_row(key.replace("_", " "), str(summary[key]))
    deadline = summary.get("deadline")
    if deadline is not None:
        cut = deadline["segments_cut"]
        passed = f"passed, {cut} segment{'' if cut == 1 else 's'} cut short"
        table.add_row(
            "deadline",
            f"{deadline['seconds']:g} s: " + (passed if deadline["passed"] else "not reached"),
        )
    Console().print(table)


def cmd_run(args: argparse.Namespace) -> int:
    spec = _load(args)
    announced: list[str] = []

    def announce(job_id: str) -> None:
        announced.append(job_id)
        print(f"job {job_id}", file=sys.stderr, flush=True)

    return _finish(announced, lambda: api.run_spec(spec, announce), args.json)


def _finish(announced: list[str], run: Callable[[], dict[str, Any]], as_json: bool) -> int:
    """Run the job and print its summary; a job that failed (not bad input) is exit 1."""
    try:
        summary = run()
    except (SpecError, InfraError):
        raise
    except Exception as exc:
        if not announced:  # it failed before it had a job id
            raise
        print(f"job {announced[0]} failed: {exc}", file=sys.stderr)
        return FAILED
    _emit(summary, as_json, _print_run)
    if summary.get("already_finished"):
        at = summary["finished_at"]
        print(f"job {summary['job_id']} finished at {at}: nothing to resume", file=sys.stderr)
    elif summary.get("error"):  # every trial failed
        tail = "\n".join(summary["error"].splitlines()[-ERROR_LINES:])
        job_id = announced[0]
        print(f"job {job_id} failed: every trial failed; the first:\n{tail}", file=sys.stderr)
        return FAILED
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    announced: list[str] = []

    def announce(job_id: str) -> None:
        announced.append(job_id)
        print(f"job {job_id}", file=sys.stderr, flush=True)

    def resume() -> dict[str, Any]:
        return api.resume_job(args.job_id, args.storage, "--storage", announce)

    return _finish(announced, resume, args.json)


# --- plan -------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    spec = _load(args)
    if args.gantt:
        _check_gantt(args.gantt)
    from elastune.planners.cost import read_catalog

    catalog = read_catalog(args.catalog) if args.catalog else None
    report = api.plan_report(spec, args.planner, catalog)
    if args.gantt:
        from elastune.planners.cost.reports.gantt import draw_gantt

        draw_gantt(report, args.gantt)
    _emit(report.to_dict(), args.json, lambda _: _print_plan(report))
    report.check()  # an infeasible deadline or budget is bad input: exit 2, naming it
    # `run` plans with RubberBand: another planner's report does not say what it runs.
    print(
        _run_mode(spec, catalog, report if args.planner == "rubberband" else None), file=sys.stderr
    )
    return 0


def _run_mode(spec: JobSpec, catalog: Catalog | None, report: PlanReport | None) -> str:
    """The mode line of ``elastune run`` for this job."""
    from elastune.flows.prepare import PreparedJob
    from elastune.tasks.trainable import TrainableError, load_trainable

    try:
        trainable = load_trainable(spec.trainable)
    except TrainableError as exc:  # the plan prices the job; its code may live elsewhere
        return f"mode: unknown here ({exc})"
    return str(PreparedJob.of(spec, trainable, catalog, report).execution.mode)


def _check_gantt(path: str) -> None:
    """``--gantt``'s file: its folder exists and matplotlib writes its format."""
    from matplotlib.backend_bases import FigureCanvasBase

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--gantt {path}: folder {folder} does not exist")
    formats = FigureCanvasBase.get_supported_filetypes()
    if Path(path).suffix.lower().removeprefix(".") not in formats:
        raise UsageError(f"--gantt {path}: name a file ending in one of .{', .'.join(formats)}")


def _print_plan(report: Any) -> None:
    from rich.console import Console

    console = Console()
    title = f"{report.planner} plan"
    wide = console.options.update_width(10_000)  # what the table needs, whatever the screen
    # Bordered, then compact, then with a header folded, then a spot plan's two market
    # columns as one: the first that fits the screen (an 80-column terminal gets the
    # second for an on-demand plan, the last for a spot plan).
    for fold, narrow in ((None, False), (False, False), (True, False), (True, True)):
        table = _table(title, *report.to_table(narrow), fold)
        if console.measure(table, options=wide).maximum <= console.width:
            break
    # Every value whole: a screen narrower than the last table gets it wider than itself.
    width = max(console.width, console.measure(table, options=wide).minimum)
    console.print(table, width=width, crop=False)
    for line in report.summary_lines():
        console.print(line, highlight=False)


def _table(title: str, columns: list[str], rows: list[list[str]], fold: bool | None) -> Any:
    """A rich table; ``fold`` not None: compact (no borders, no padding), and when True each
    header wider than its column's values folded after a slash (``GPUs/`` over ``trial``)."""
    from rich import box
    from rich.table import Table

    if fold is None:
        table = Table(title=title)
        for column in columns:
            table.add_column(column)
    else:
        table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 0))
        for i, column in enumerate(columns):
            width = max(len(row[i]) for row in rows)
            if fold and len(column) > width and "/" in column:
                column = column.replace("/", "/\n")
            # Values and headers whole: a screen too narrow gets a table wider than itself.
            width = max(width, *(len(line) for line in column.splitlines()))
            table.add_column(column, min_width=width)
    for row in rows:
        table.add_row(*row)
    return table


# --- profile ----------------------------------------------------------------------------


def cmd_profile(args: argparse.Namespace) -> int:
    spec = _load(args)
    folder = Path(args.out).resolve().parent if args.out else None
    if folder is not None and not folder.is_dir():  # found before minutes of measuring
        raise UsageError(f"--out {args.out}: folder {folder} does not exist")
    api.quiet_optuna()
    # SIGTERM (`timeout`, a service manager) ends it as Ctrl-C does: its calibration run
    # stopped and its throwaway folder removed, not left behind.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        result = _measure(spec, args)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.out:
        Path(args.out).write_text(profile_yaml(result["profile"]))

    def human(data: dict[str, Any]) -> None:
        print(f"# measured on {data['device']}: {data['configs']} configs x {data['units']} units")
        print(profile_yaml(data["profile"]), end="")

    _emit(result, args.json, human)
    return 0


def _measure(spec: JobSpec, args: argparse.Namespace) -> dict[str, Any]:
    """Units timed in this process, then calibrated by small real runs (unless
    ``--no-calibrate``)."""
    from elastune.tasks.measure import measure

    result = measure(spec, units=args.units, shares=args.shares)
    if not args.no_calibrate:
        from elastune.flows.calibrate import calibrate

        # A slot's unit time and the overheads, measured through the real flow, anchor the
        # in-process timings (docs/cli.md, profile).
        result["profile"], result["calibration_walls_s"] = calibrate(
            spec, result["profile"], args.repeats
        )
    return result


def profile_yaml(profile: dict[str, Any]) -> str:
    """The job file's ``profile:`` section, a matrix's rows one to a line."""
    import yaml

    class Row(list):  # type: ignore[type-arg]
        pass

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(
        Row, lambda dumper, row: dumper.represent_sequence("tag:yaml.org,2002:seq", row, True)
    )
    if "calibration_cov" in profile:
        profile = {**profile, "calibration_cov": [Row(r) for r in profile["calibration_cov"]]}
    return yaml.dump({"profile": profile}, Dumper=Dumper, sort_keys=False)


# --- simulate ---------------------------------------------------------------------------


def cmd_simulate(args: argparse.Namespace) -> int:
    report = api.simulate(
        _load(args),
        args.benchmark,
        workers=args.workers,
        seeds=args.seeds,
        preemptions_per_hour=args.preemptions_per_hour,
    )
    from elastune.planners.sim import format_report

    _emit(report, args.json, lambda r: print(format_report(r)))
    return 0


def _shares(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list like 1,0.5,0.25") from None


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


# --- parser -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="elastune", description="Elastic, cost-aware hyperparameter tuning.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = _job_command(commands, "run", "run a tuning job", cmd_run, "one JSON summary")
    run.add_argument("--pool", help="run segments on this Prefect work pool (compute.pool)")

    plan = _job_command(
        commands,
        "plan",
        "dry run: staged plan, predicted time and cost",
        cmd_plan,
        "the plan as one JSON object",
    )
    plan.add_argument("--gantt", metavar="FILE.png", help="draw stages, instances and trials")
    plan.add_argument("--planner", choices=("rubberband", "seer"), default="rubberband")
    plan.add_argument("--catalog", metavar="FILE.yaml", help="your own instance catalog")

    sim = _job_command(
        commands, "simulate", "run the job in simulated time on a benchmark", cmd_simulate
    )
    sim.add_argument(
        "--benchmark",
        required=True,
        metavar="NAME",
        help="lcbench:TASK_ID (surrogate, any config) or lcbench-table:TASK_ID (1000 configs)",
    )
    sim.add_argument("--workers", type=int, help="virtual workers (default compute.workers)")
    sim.add_argument("--seeds", type=int, default=1, help="independent runs")
    sim.add_argument(
        "--preemptions-per-hour",
        type=float,
        default=0.0,
        metavar="RATE",
        help="interrupt each worker at this rate; segments resume from checkpoints",
    )

    prof = _job_command(commands, "profile", "measure seconds per resource unit here", cmd_profile)
    prof.add_argument("--units", type=int, default=3, help="resource units per config")
    prof.add_argument(
        "--shares",
        type=_shares,
        default=(1.0,),
        metavar="1,0.5,...",
        help="device shares to time: 1 (a whole device) and 1/k (k trials at once on it)",
    )
    prof.add_argument("--out", metavar="FILE.yaml", help="write the profile: section there")
    prof.add_argument(
        "--no-calibrate",
        action="store_true",
        help="skip the four small jobs that time a slot and the overheads in real runs",
    )
    prof.add_argument(
        "--repeats",
        type=_positive,
        metavar="N",
        help="runs of each calibration job (default 3; 1 measures no run-to-run spread)",
    )

    again = commands.add_parser("resume", help="continue a job whose driver died")
    again.add_argument("job_id", help="the id printed as `job <ID>`")
    again.add_argument(
        "--storage",
        default=api.DEFAULT_STORAGE,
        help="the job's Optuna storage (tracking.optuna_storage)",
    )
    again.add_argument("--json", action="store_true", help="print one JSON summary on stdout")
    again.set_defaults(handler=cmd_resume)
    return parser


def _job_command(
    commands: Any,
    name: str,
    purpose: str,
    handler: Callable[[argparse.Namespace], int],
    prints: str = "one JSON object",
) -> argparse.ArgumentParser:
    """A command on a job file: the file, ``--set`` overrides and ``--json``."""
    command = commands.add_parser(name, help=purpose)
    command.add_argument("job", help="job file (YAML)")
    command.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field")
    command.add_argument("--json", action="store_true", help=f"print {prints} on stdout")
    command.set_defaults(handler=handler)
    return command


def main(argv: Sequence[str] | None = None) -> int:
    exit_uncollected()  # before the imports: the shell gets its prompt back 2-3 s sooner
    api.quiet_defaults()
    try:
        args = build_parser().parse_args(argv)
        return args.handler(args)
    except (SpecError, InfraError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return FAILED


# How long the command's exit may wait on threads a trainable left running before it goes
# without them: Python joins every non-daemon thread before its exit handlers, one of which
# stops the command's Prefect server.
EXIT_GRACE_SECONDS = 10.0


def command() -> None:
    """The ``elastune`` command: :func:`main`, and an exit no stray thread can hold up."""
    code = main()
    handlers = threading.Event()
    atexit.register(handlers.set)  # registered last, run first: the threads were joined

    def leave_stray_threads() -> None:
        if handlers.wait(EXIT_GRACE_SECONDS):
            return
        main_thread = threading.main_thread()
        stray = [t.name for t in threading.enumerate() if not t.daemon and t is not main_thread]
        print(f"exiting without threads still running: {', '.join(stray)}", file=sys.stderr)
        sys.stderr.flush()
        atexit._run_exitfuncs()  # the handlers Python would have run: the server stops
        os._exit(code)

    threading.Thread(target=leave_stray_threads, name="elastune-exit", daemon=True).start()
    sys.exit(code)


if __name__ == "__main__":
    command()
