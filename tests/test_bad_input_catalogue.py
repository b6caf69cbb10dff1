"""More bad input: the price catalog, the profile, the flags of
``plan``, ``simulate`` and ``resume``, and job-file fields that test_bad_input.py does not
cover. Each case: exit code 2, one line on stderr naming the field or flag, no traceback,
nothing created in MLflow or Optuna.
"""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
import yaml

from elastune.flows.cli import main
from tests.helpers.jobs import GOOD, assert_rejected, edit

# A job the cost planner can plan: a deadline, a profile and one instance type.
PLANNED = {
    **GOOD,
    "budget": {"deadline": "2h"},
    "compute": {"instance_types": ["g5.xlarge"]},
    "profile": {"seconds_per_unit": {1: 300}},
}
# Every case leaves nothing new in MLflow or Optuna (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("unchanged_stores")
# Cases that get as far as a Prefect flow share the session's server (tests/conftest.py).
needs_prefect = pytest.mark.usefixtures("prefect_api")
G5 = {"gpus": 1, "gpu": "A10G", "price_per_hour": 1.006}


def planned(**sections: object) -> dict:
    return {**yaml.safe_load(yaml.safe_dump(PLANNED)), **sections}


def write(tmp: Path, name: str, data: object) -> str:
    path = tmp / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def without_job_line(capsys: pytest.CaptureFixture[str]) -> pytest.CaptureFixture[str]:
    """``run`` and ``resume`` print ``job <ID>`` before the flow starts; drop that line so
    :func:`assert_rejected` sees the error line alone."""

    class _Filtered:
        def readouterr(self):  # the one method assert_rejected calls
            captured = capsys.readouterr()
            lines = [line for line in captured.err.splitlines() if not line.startswith("job ")]
            return type(captured)(captured.out, "\n".join(lines))

    return _Filtered()  # type: ignore[return-value]


# --- job-file fields test_bad_input.py leaves out ----------------------------------------

ASHA = {"name": "asha", "eta": 3, "min_resource": 1, "max_resource": 9}
JOBS = [
    ("negative budget", edit("budget", {"max_cost_usd": -1}), "budget.max_cost_usd"),
    ("zero budget deadline", edit("budget", {"deadline": 0}), "budget.deadline"),
    (
        "no categorical choices",
        edit("space.x", {"type": "categorical", "choices": []}),
        "space.x.choices",
    ),
    ("zero float step", edit("space.x.step", 0), "space.x.step"),
    ("more brackets than rungs", edit("scheduler", {**ASHA, "brackets": 4}), "scheduler.brackets"),
    (
        "median interval above max",
        edit("scheduler", {"name": "median", "max_resource": 9, "interval": 10}),
        "scheduler.interval",
    ),
    (
        "pbt interval above max",
        edit("scheduler", {"name": "pbt", "max_resource": 9, "perturbation_interval": 10}),
        "scheduler.perturbation_interval",
    ),
    (
        "pbt population of one",
        edit("scheduler", {"name": "pbt", "population_size": 1}),
        "scheduler.population_size",
    ),
    ("zero GPUs", edit("compute", {"max_gpus": 0}), "compute.max_gpus"),
    ("ecs without a cluster", edit("compute", {"ecs": {"cluster": ""}}), "compute.ecs.cluster"),
    (
        "ecs with an inline key",
        edit("compute", {"ecs": {"cluster": "gpu", "aws_secret_access_key": "x"}}),
        "compute.ecs.aws_secret_access_key",
    ),
    # More than one driver keeps in flight (they waited for a thread, unseen).
    ("more workers than a driver runs", edit("compute", {"workers": 513}), "compute.workers"),
    # A ladder up to .inf never ended (validation looped for ever).
    ("infinite max_resource", edit("scheduler.max_resource", math.inf), "scheduler.max_resource"),
    ("NaN deadline", edit("budget", {"deadline": math.nan}), "budget.deadline"),
    ("infinite deadline", edit("budget", {"deadline": math.inf}), "budget.deadline"),
    ("infinite bound", edit("space.x.high", math.inf), "space.x.high"),
    (
        "a parameter named like a scheduler",
        edit("space", {"sha": {"type": "float", "low": 1.0, "high": 0.0}}),
        "space.sha.high",
    ),
    (
        "a sampler option's value refused",
        edit("sampler", {"name": "qmc", "qmc_type": "bogus"}),
        "sampler.qmc_type",
    ),
]


@pytest.mark.parametrize(("why", "job", "field"), JOBS, ids=[c[0] for c in JOBS])
def test_bad_job_field(why, job, field, tmp_path, stores, capsys) -> None:
    code = main(["run", write(tmp_path, "job.yaml", job), *stores])
    assert_rejected(capsys, code, field, tmp_path)


# --- the price catalog (elastune plan --catalog) ------------------------------------------


def catalog(**g5: object) -> dict:
    return {"instance_types": {"g5.xlarge": {**G5, **g5}}}


CATALOGS = [
    ("malformed YAML", "instance_types: [", "malformed YAML at line 1"),
    ("not a mapping", "- g5.xlarge", "expected a mapping"),
    ("no instance types", {"instance_types": {}}, "instance_types"),
    ("unknown top-level field", {**catalog(), "regoin": "x"}, "regoin"),
    ("defaults not a mapping", {**catalog(), "defaults": 3}, "defaults"),
    ("zero GPUs", catalog(gpus=0), "instance_types.g5.xlarge.gpus"),
    ("price not positive", catalog(price_per_hour=-1), "instance_types.g5.xlarge.price_per_hour"),
    ("unknown type field", catalog(colour="red"), "instance_types.g5.xlarge.colour"),
    (
        "missing GPU model",
        {"instance_types": {"g5.xlarge": {"gpus": 1, "price_per_hour": 1}}},
        "instance_types.g5.xlarge.gpu",
    ),
    (
        "spot discount above 1",
        catalog(spot={"discount": 1.5, "interruptions_per_hour": 0}),
        "instance_types.g5.xlarge.spot.discount",
    ),
    ("billing quantum 0", catalog(billing={"quantum_s": 0}), "billing.quantum_s"),
    ("negative startup", catalog(startup={"mean_s": -5}), "startup.mean_s"),
    (
        "job names a type the catalog lacks",
        {"instance_types": {"p3.2xlarge": {**G5, "gpu": "V100"}}},
        "compute.instance_types[0]",
    ),
]


@pytest.mark.parametrize(("why", "text", "field"), CATALOGS, ids=[c[0] for c in CATALOGS])
def test_bad_catalog(why, text, field, tmp_path, stores, capsys) -> None:
    job = write(tmp_path, "job.yaml", PLANNED)
    code = main(["plan", job, "--catalog", write(tmp_path, "catalog.yaml", text), *stores])
    assert_rejected(capsys, code, field, tmp_path)


def test_missing_catalog_file(tmp_path, stores, capsys) -> None:
    job = write(tmp_path, "job.yaml", PLANNED)
    code = main(["plan", job, "--catalog", str(tmp_path / "prices.yaml"), *stores])
    assert_rejected(capsys, code, "prices.yaml", tmp_path)


# --- the profile (the job file's profile: section) ----------------------------------------

PROFILES = [
    ("not a mapping", 300, "profile"),
    ("no GPU counts", {"seconds_per_unit": {}}, "profile.seconds_per_unit"),
    ("negative seconds", {"seconds_per_unit": {1: -5}}, "profile.seconds_per_unit.1"),
    ("zero GPUs", {"seconds_per_unit": {0: 300}}, "profile.seconds_per_unit.0"),
    ("unknown field", {"seconds_per_unit": {1: 300}, "colour": 1}, "profile.colour"),
    (
        "spread for a count without a timing",
        {"seconds_per_unit": {1: 300}, "sd_per_unit": {2: 5}},
        "sd_per_unit",
    ),
    (
        "speedup and serial fraction",
        {"seconds_per_unit": {1: 300}, "speedup": {2: 1.8}, "serial_fraction": 0.1},
        "serial_fraction",
    ),
    (
        "scaling model over a measured table",
        {"seconds_per_unit": {1: 300, 2: 160}, "speedup": {2: 1.8}},
        "seconds_per_unit",
    ),
    ("serial fraction 1", {"seconds_per_unit": {1: 300}, "serial_fraction": 1}, "serial_fraction"),
    (
        "relative speeds without a GPU model",
        {"seconds_per_unit": {1: 300}, "speed": {"V100": 2}},
        "speed",
    ),
    ("negative straggler spread", {"seconds_per_unit": {1: 300}, "segment_cv": -1}, "segment_cv"),
    ("no GPU counts to scale to", {"seconds_per_unit": {1: 300}, "gpus": []}, "profile.gpus"),
]


@pytest.mark.parametrize(("why", "profile", "field"), PROFILES, ids=[c[0] for c in PROFILES])
def test_bad_profile(why, profile, field, tmp_path, stores, capsys) -> None:
    code = main(["plan", write(tmp_path, "job.yaml", planned(profile=profile)), *stores])
    assert_rejected(capsys, code, field, tmp_path)


# Profiles that parse but cannot time the job's instance types: found while planning.
UNPLANNABLE = [
    ("no profile", planned(profile=None), "profile"),
    (
        "measured on another GPU",
        planned(profile={"seconds_per_unit": {1: 300}, "gpu": "H100"}),
        "profile.speed.A10G",
    ),
    (
        "no count fits one node",
        planned(profile={"seconds_per_unit": {8: 40}}),
        "profile.seconds_per_unit",
    ),
    (
        "unknown instance type",
        planned(compute={"instance_types": ["g9.huge"]}),
        "compute.instance_types[0]",
    ),
    ("deadline cannot be met", planned(budget={"deadline": "1s"}), "budget.deadline"),
    (
        "budget cannot be met",
        planned(budget={"deadline": "2h", "max_cost_usd": 0.0001}),
        "budget.max_cost_usd",
    ),
]


@pytest.mark.parametrize(("why", "job", "field"), UNPLANNABLE, ids=[c[0] for c in UNPLANNABLE])
def test_unplannable_job(why, job, field, tmp_path, stores, capsys) -> None:
    code = main(["plan", write(tmp_path, "job.yaml", job), *stores])
    assert_rejected(capsys, code, field, tmp_path)


@needs_prefect
def test_run_with_an_infeasible_deadline_creates_nothing(tmp_path, stores, capsys) -> None:
    """The cost planner's verdict stops ``run`` too, before any run or study exists."""
    job = write(tmp_path, "job.yaml", planned(budget={"deadline": "1s"}))
    code = main(["run", job, *stores])
    assert_rejected(without_job_line(capsys), code, "budget.deadline", tmp_path)


# --- flags of plan, simulate, resume and run -----------------------------------------------

FLAGS = [
    ("plan: unknown planner", ["plan", "{planned}", "--planner", "greedy"], "--planner"),
    (
        "plan: seer without a budget",
        ["plan", "{planned}", "--planner", "seer"],
        "budget.max_cost_usd",
    ),
    ("plan: no job file", ["plan"], "arguments are required: job"),
    ("plan: unknown flag", ["plan", "{job}", "--colour"], "--colour"),
    ("simulate: no benchmark", ["simulate", "{job}"], "--benchmark"),
    ("simulate: unknown benchmark", ["simulate", "{job}", "--benchmark", "mnist"], "--benchmark"),
    ("simulate: unknown task", ["simulate", "{job}", "--benchmark", "lcbench:1"], "--benchmark"),
    (
        "simulate: zero seeds",
        ["simulate", "{job}", "--benchmark", "lcbench:3945", "--seeds", "0"],
        "--seeds",
    ),
    (
        "simulate: zero workers",
        ["simulate", "{job}", "--benchmark", "lcbench:3945", "--workers", "0"],
        "--workers",
    ),
    (
        "simulate: workers not a number",
        ["simulate", "{job}", "--benchmark", "lcbench:3945", "--workers", "two"],
        "--workers",
    ),
    (
        "simulate: metric the benchmark lacks",
        ["simulate", "{job}", "--benchmark", "lcbench:3945", "--set", "metric=f1"],
        "metric",
    ),
    (
        "simulate: parameter the benchmark lacks",
        ["simulate", "{job}", "--benchmark", "lcbench:3945"],
        "space.x",
    ),
    ("resume: no job id", ["resume"], "job_id"),
    ("resume: unknown flag", ["resume", "some-job", "--colour"], "--colour"),
    ("run: --pool without a name", ["run", "{job}", "--pool"], "--pool"),
    ("run: --set without a value", ["run", "{job}", "--set"], "--set"),
    ("run: job file is a folder", ["run", "{tmp}"], "cannot read job file"),
    (
        "plan: a gantt format matplotlib lacks",
        ["plan", "{planned}", "--gantt", "{tmp}/g.xyz"],
        "--gantt",
    ),
    ("plan: a gantt file without a format", ["plan", "{planned}", "--gantt", "{tmp}/g"], "--gantt"),
    (
        "simulate: NaN preemptions",
        ["simulate", "{job}", "--benchmark", "lcbench:3945", "--preemptions-per-hour", "nan"],
        "--preemptions-per-hour",
    ),
    (
        "profile: --out into a missing folder",
        ["profile", "{job}", "--no-calibrate", "--out", "{tmp}/no/such/profile.yaml"],
        "--out",
    ),
]


@pytest.mark.parametrize(("why", "argv", "field"), FLAGS, ids=[c[0] for c in FLAGS])
def test_bad_flag(why, argv, field, tmp_path, stores, capsys) -> None:
    job, plannable = write(tmp_path, "job.yaml", GOOD), write(tmp_path, "planned.yaml", PLANNED)
    argv = [a.format(job=job, planned=plannable, tmp=tmp_path) for a in argv]
    # --set goes last only where the command takes it (resume and a dangling --set do not).
    extra = stores if argv[0] != "resume" and argv[-1] != "--set" else []
    assert_rejected(capsys, main([*argv, *extra]), field, tmp_path)


@pytest.mark.parametrize("command", ["run", "plan"])
def test_a_job_file_that_is_not_text(command, tmp_path, stores, capsys) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"\xff\xfe\x00bin\x80")
    assert_rejected(capsys, main([command, str(path), *stores]), "not UTF-8 text", tmp_path)


def test_a_catalog_that_is_not_text(tmp_path, stores, capsys) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_bytes(b"\xff\xfe\x00bin\x80")
    job = write(tmp_path, "job.yaml", PLANNED)
    code = main(["plan", job, "--catalog", str(catalog), *stores])
    assert_rejected(capsys, code, "not UTF-8 text", tmp_path)


def test_plan_gantt_into_a_missing_folder(tmp_path, stores, capsys) -> None:
    job = write(tmp_path, "job.yaml", PLANNED)
    code = main(["plan", job, "--gantt", str(tmp_path / "no" / "such" / "gantt.png"), *stores])
    assert_rejected(capsys, code, "--gantt", tmp_path)


def test_resume_unknown_job_in_an_existing_store(tmp_path, capsys, unchanged_stores) -> None:
    storage = f"sqlite:///{tmp_path}/optuna.db"
    optuna.create_study(study_name="someone-else", storage=storage)
    unchanged_stores.take()
    code = main(["resume", "no-such-job", "--storage", storage])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1, err  # answered before the job line: no Prefect start-up
    assert "job id" in err[0] and "no-such-job" in err[0] and "Traceback" not in err[0]
    # Nothing created: the store holds only the study it held before, and no MLflow db.
    assert optuna.get_all_study_names(storage) == ["someone-else"]
    assert not (tmp_path / "mlflow.db").exists()


def test_resume_of_a_study_elastune_did_not_make(tmp_path, capsys, unchanged_stores) -> None:
    storage = f"sqlite:///{tmp_path}/optuna.db"
    optuna.create_study(study_name="foreign", storage=storage)
    unchanged_stores.take()
    code = main(["resume", "foreign", "--storage", storage])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "job id" in err[-1] and "not made by elastune" in err[-1], err
    assert optuna.get_all_study_names(storage) == ["foreign"]
    assert not (tmp_path / "mlflow.db").exists()


def test_resume_unknown_job_creates_no_store(tmp_path, capsys) -> None:
    code = main(["resume", "no-such-job", "--storage", f"sqlite:///{tmp_path}/optuna.db"])
    assert_rejected(without_job_line(capsys), code, "job id", tmp_path)


BAD_STORAGE = [
    ("not a URL", "nonsense"),
    ("folder missing", "sqlite:///{tmp}/no/such/optuna.db"),
]


@pytest.mark.parametrize(("why", "storage"), BAD_STORAGE, ids=[c[0] for c in BAD_STORAGE])
def test_resume_bad_storage(why, storage, tmp_path, capsys) -> None:
    code = main(["resume", "some-job", "--storage", storage.format(tmp=tmp_path)])
    assert_rejected(without_job_line(capsys), code, "--storage", tmp_path)


BAD_TRACKING = [
    ("optuna storage not a URL", "tracking.optuna_storage=nonsense", "tracking.optuna_storage"),
    ("mlflow uri a plain word", "tracking.mlflow_uri=nonsense", "tracking.mlflow_uri"),
]


@pytest.mark.parametrize(
    ("why", "override", "field"), BAD_TRACKING, ids=[c[0] for c in BAD_TRACKING]
)
def test_bad_tracking_store(why, override, field, tmp_path, stores, capsys) -> None:
    job = write(tmp_path, "job.yaml", GOOD)
    code = main(["run", job, *stores, "--set", override])
    assert_rejected(without_job_line(capsys), code, field, tmp_path)
