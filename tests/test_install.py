"""elastune installed beside a user's own code: one import name, nothing of theirs shadowed,
and a wheel that runs a job from an unrelated directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

import elastune

ROOT = Path(__file__).resolve().parent.parent

# A Prefect user's project: its own flows/ package, a tasks.py (Celery, Invoke), examples/
# and infra/ folders; its trainable imports every one of them.
PROJECT = {
    "flows/__init__.py": "",
    "flows/etl.py": "ROWS = 3\n",
    "tasks.py": "def scale(x):\n    return 0.5 * x\n",
    "examples/__init__.py": "",
    "examples/data.py": "TARGET = 0.7\n",
    "infra/__init__.py": "",
    "infra/cluster.py": "NAME = 'ours'\n",
    "mymodel.py": """\
import elastune
import examples.data
import flows.etl
import infra.cluster
import tasks


def train(config: dict, ctx: elastune.TrialContext) -> None:
    assert flows.etl.ROWS == 3 and infra.cluster.NAME == "ours"
    for epoch in ctx.range(ctx.restore()):
        fit = 1 - (config["x"] - examples.data.TARGET) ** 2
        ctx.report(val_accuracy=tasks.scale(fit) * (2 - 0.5**epoch))
""",
}
JOB = {
    "name": "own-code",
    "trainable": "mymodel:train",
    "metric": "val_accuracy",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "sampler": {"name": "random", "seed": 0},
    "scheduler": {"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 3},
    "compute": {"workers": 2},
    "tracking": {
        "mlflow_uri": "sqlite:///stores/mlflow.db",
        "optuna_storage": "sqlite:///stores/optuna.db",
    },
}


def make_project(folder: Path) -> Path:
    for name, text in PROJECT.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    (folder / "job.yaml").write_text(yaml.safe_dump(JOB))
    return folder


def clean_env() -> dict[str, str]:
    """This process's environment without the repository on the path: a user's shell."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def json_out(folder: Path, *argv: str | Path) -> dict:
    """Run ``argv`` in ``folder`` as a user's shell would; the JSON it printed last."""
    done = subprocess.run(
        argv, cwd=folder, env=clean_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_every_package_folder_installs_under_elastune() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {f"elastune.{name}": ROOT / name for name in elastune.SUBPACKAGES}
    found = {"elastune"} | {
        ".".join([package, *init.parent.relative_to(folder).parts])
        for package, folder in folders.items()
        for init in folder.rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == found
    assert setuptools["package-dir"] == {"elastune": "elastune"} | {
        package: name.relative_to(ROOT).as_posix() for package, name in folders.items()
    }


def test_import_elastune_is_cheap_and_gives_the_public_api() -> None:
    code = (
        "import sys, elastune; heavy = [m for m in ('torch', 'prefect', 'mlflow') "
        "if m in sys.modules]; names = [n for n in elastune.__all__ if not hasattr(elastune, n)];"
        "print(heavy, names)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd="/"
    )
    assert done.stdout.strip() == "[] []", done.stderr


def test_bad_input_from_python_raises_naming_the_field(tmp_path: Path) -> None:
    bad = {**JOB, "space": {"x": {"type": "float", "low": 1.0, "high": 0.0}}}
    with pytest.raises(elastune.SpecError, match=r"space\.x"):
        elastune.run(bad)
    with pytest.raises(elastune.SpecError, match="job id: no job 'nope'"):
        elastune.resume("nope", f"sqlite:///{tmp_path}/optuna.db")
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.slow
def test_a_job_runs_beside_a_project_with_its_own_flows_and_tasks(tmp_path: Path) -> None:
    """From the project's folder, by the command and from Python: nothing of the user's is
    shadowed by elastune, nor the reverse."""
    project = make_project(tmp_path)
    command = Path(sys.executable).with_name("elastune")
    by_command = json_out(project, command, "run", "job.yaml", "--json")
    assert by_command["best"]["metric"] > 0.5

    code = "import elastune, json; print(json.dumps(elastune.run('job.yaml', ['name=again'])))"
    by_python = json_out(project, sys.executable, "-c", code)
    assert by_python.keys() == by_command.keys()
    assert by_python["best"]["metric"] == by_command["best"]["metric"]  # same seed, same job


@pytest.mark.slow
def test_the_wheel_runs_a_job_from_an_unrelated_folder(tmp_path: Path) -> None:
    """The built wheel alone, no checkout on the path: one top-level name, the surrogate and
    the price catalog inside, and `run`, `plan` and `simulate` from a user's folder."""
    # The sdist first, then the wheel from it, as `python -m build` does: nothing a stale
    # build/ folder of the checkout holds gets in.
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp_path / "dist"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("elastune-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert archive.read(info).decode().split() == ["elastune"]
        assert {n.split("/")[0] for n in names if not n.startswith("elastune-")} == {"elastune"}
        assert "elastune/planners/data/yahpo_lcbench/model.onnx" in names
        assert "elastune/planners/data/catalog.yaml" in names

    # A venv of its own holding the wheel; the dependencies are this venv's, behind it.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    (site,) = (venv / "lib").glob("python*/site-packages")
    (site / "deps.pth").write_text(
        "\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n"
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, wheel],
        check=True,
        capture_output=True,
    )
    project = make_project(tmp_path / "project")
    python = venv / "bin" / "python"

    def elastune_command(*args: str) -> dict:
        return json_out(project, python, "-m", "elastune.flows.cli", *args, "--json")

    where = subprocess.run(
        [python, "-c", "import elastune; print(elastune.__file__)"],
        cwd=project,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr
    assert elastune_command("run", "job.yaml")["best"]["metric"] > 0.5
    hyperband = ["--set", "scheduler.name=hyperband", "--set", "compute.workers=3"]
    profile = ["--set", "profile.seconds_per_unit={1: 2.0}"]
    assert elastune_command("plan", "job.yaml", *hyperband, *profile)["feasible"]
    (project / "lcbench.yaml").write_text((ROOT / "examples" / "lcbench.yaml").read_text())
    small = ["--set", "scheduler.max_trials=20"]
    simulated = elastune_command("simulate", "lcbench.yaml", "--benchmark", "lcbench:3945", *small)
    assert simulated["seeds"][0]["final_best"] > 90  # percent
