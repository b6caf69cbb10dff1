"""Bad input: one line on stderr naming the field or file, exit code 2, nothing created."""

from __future__ import annotations

import pytest
import yaml

from elastune.flows.cli import main
from elastune.planners.spec import SpecError, parse_job
from tests.helpers.jobs import GOOD, assert_rejected, edit, edit_of

# Every case leaves nothing new in MLflow or Optuna (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("unchanged_stores")


CASES = [
    ("unknown top-level field", edit("colour", "red"), "colour"),
    ("unknown nested field", edit("scheduler.etaa", 3), "scheduler.etaa"),
    ("wrong type", edit("scheduler.eta", "three"), "scheduler.eta"),
    ("low > high", edit("space.x.low", 2.0), "space.x.high"),
    ("low == high: identical trials", edit("space.x.low", 1.0), "space.x.high"),
    (
        "every parameter fixed",
        edit("space.x", {"type": "categorical", "choices": [0.5]}),
        "space: every parameter has a single value",
    ),
    ("log with low <= 0", edit("space.x.log", True), "space.x.log"),
    (
        "log with step",
        edit("space.x", {"type": "float", "low": 0.1, "high": 1, "log": True, "step": 0.1}),
        "space.x.step",
    ),
    ("eta < 2", edit("scheduler.eta", 1), "scheduler.eta"),
    ("min > max resource", edit("scheduler.min_resource", 9), "scheduler.max_resource"),
    ("unknown sampler", edit("sampler.name", "bayesopt"), "sampler.name"),
    ("unknown sampler option", edit("sampler.n_startup", 3), "sampler.n_startup"),
    ("unknown scheduler", edit("scheduler.name", "bohb"), "scheduler"),
    ("unknown parameter type", edit("space.x.type", "complex"), "space.x"),
    ("empty space", edit("space", {}), "space"),
    ("missing metric", {k: v for k, v in GOOD.items() if k != "metric"}, "metric"),
    ("bad mode", edit("mode", "maximise"), "mode"),
    ("too few trials for the top rung", edit("scheduler.max_trials", 2), "scheduler.max_trials"),
    ("grid without step", edit("sampler.name", "grid"), "space.x"),
    ("malformed trainable", edit("trainable", "tests.trainables.quadratic"), "trainable"),
    ("unimportable trainable", edit("trainable", "no_such_module:train"), "trainable"),
    ("missing function", edit("trainable", "tests.trainables:nope"), "trainable"),
    ("bad deadline", edit("budget", {"deadline": "tomorrow"}), "budget.deadline"),
    ("zero workers", edit("compute", {"workers": 0}), "compute.workers"),
    ("bad job name", edit("name", "has spaces"), "name"),
    (
        "calibration covariance not 4 x 4",
        edit("profile", {"seconds_per_unit": {1: 1.0}, "calibration_cov": [[1.0, 0.0]]}),
        "profile.calibration_cov.0",
    ),
    (
        "calibration covariance with a negative variance",
        edit("profile", {"seconds_per_unit": {1: 1.0}, "calibration_cov": [[-1.0] * 4] * 4}),
        "profile.calibration_cov",
    ),
]


@pytest.mark.parametrize(("why", "job", "field"), CASES, ids=[c[0] for c in CASES])
def test_bad_job_file(why, job, field, tmp_path, stores, capsys) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert_rejected(capsys, main(["run", str(path), *stores]), field, tmp_path)


@pytest.mark.parametrize(
    ("text", "field"),
    [("name: [unclosed", "malformed YAML at line 1"), ("- a list\n- not a mapping", "mapping")],
)
def test_malformed_yaml(text, field, tmp_path, stores, capsys) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert_rejected(capsys, main(["run", str(path), *stores]), field, tmp_path)


def test_missing_job_file(tmp_path, stores, capsys) -> None:
    code = main(["run", str(tmp_path / "nope.yaml"), *stores])
    assert_rejected(capsys, code, "nope.yaml", tmp_path)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("scheduler.eta", "--set scheduler.eta"),
        ("scheduler.eta=[1", "--set scheduler.eta=[1"),
        ("scheduler.eta=1", "scheduler.eta"),
        ("name.inner=3", "--set name.inner=3"),
    ],
)
def test_bad_override(override, field, tmp_path, stores, capsys) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    code = main(["run", str(path), "--set", override, *stores])
    assert_rejected(capsys, code, field, tmp_path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"scheduler.etaa": 3}, "scheduler.etaa: not a field here; did you mean eta?"),
        ({"space.x.hihg": 3}, "space.x.hihg: not a field here; did you mean high?"),
        (
            {"scheduler.name": "hyperband", "scheduler.max_trials": 9},
            "scheduler.max_trials: not a field of scheduler hyperband (its fields: eta, "
            "min_resource, max_resource, name)",
        ),
        ({"colour": "red"}, "colour: not a field of the job (its fields: name, trainable, "),
        (
            {"profile": {"seconds_per_unit": {1: 1.0}, "seconds": 3}},
            "profile.seconds: not a field here; did you mean seconds_per_unit?",
        ),
    ],
)
def test_an_unknown_field_is_told_the_known_ones(changes: dict, message: str) -> None:
    job = GOOD
    for path, value in changes.items():
        job = edit_of(job, path, value)
    with pytest.raises(SpecError) as error:
        parse_job(job, "job.yaml")
    assert str(error.value).startswith(f"job.yaml: {message}")


def test_unknown_command_and_option(capsys) -> None:
    assert main(["fly"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main(["run", "x.yaml", "--colour"]) == 2
    assert "--colour" in capsys.readouterr().err
    assert main(["profile", "x.yaml", "--repeats", "0"]) == 2
    assert "'0' is not a whole number of at least 1" in capsys.readouterr().err


@pytest.mark.usefixtures("prefect_api")
def test_metric_never_reported_leaves_no_store(tmp_path, stores, capsys) -> None:
    """Found only once a segment has run: the job's runs, study and the stores it made go."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "trainable": "tests.trainables:wrong_metric"}))
    code = main(["run", str(path), *stores])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: metric:"), err
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "artifacts").exists()
