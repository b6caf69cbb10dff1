"""The wheels a GPU machine without a package index needs to run elastune and its CUDA
tests: elastune's dependencies and the tests' (``moto[ec2,ecs,autoscaling]``), as
installed here (the versions of ``constraints.txt``), less what that machine's Python
already holds (:data:`MACHINE_HAS`: PyTorch and the scientific stack), downloaded for
CPython 3.12 on x86-64 Linux into ``.whl/``.

They are slimmed so that they and the repository fit in 64 MiB together
(:data:`LIMIT_MIB`, checked at the end): the web UIs of MLflow and Prefect (no job here
serves one) and the AWS service models botocore holds beyond the services elastune and
its tests call (:data:`AWS_SERVICES`) are left out, and so are moto's ECS-optimised AMI
parameters for SSM, which no test asks for. ``benchmarks/gpu_checks.sh`` installs them
(``pip install --no-index --no-deps --target``) when ``.whl/`` is there.

    python benchmarks/gpu_wheels.py      # here, with a package index: writes .whl/
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
LIMIT_MIB = 64  # what travels to the GPU machine: the repository and these wheels
ROOTS = (("elastune", ()), ("moto", ("ec2", "ecs", "autoscaling")))
# The target: CPython 3.12 on x86-64 Linux.
MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
PLATFORMS = (
    "manylinux1_x86_64",
    "manylinux2014_x86_64",
    *(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)),
)
# What the GPU machine's Python holds of these packages already (its `pip list`).
_HAS = """
aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer
click cloudpickle colorama contourpy cycler filelock flatbuffers fonttools frozenlist
fsspec h11 httpcore httpx humanize idna jinja2 joblib kiwisolver markdown markdown-it-py
markupsafe matplotlib mdurl mpmath multidict narwhals networkx numpy onnxruntime packaging
pandas pathspec pillow pluggy prometheus-client propcache protobuf pyarrow pygments
pyparsing python-dateutil pyyaml regex requests rich scikit-learn scipy setuptools
shellingham six sympy threadpoolctl torch tqdm typer typing-extensions urllib3 werkzeug
wrapt yarl
"""
MACHINE_HAS = frozenset(_HAS.split())
# The AWS services elastune (infra/ecs*.py) and its tests call, those moto's backends of
# them call in turn, and those credentials are asked through.
_AWS = "autoscaling ec2 ecs elb elbv2 iam kms logs s3 sso sso-oidc sts"
AWS_SERVICES = frozenset(_AWS.split())


def name(text: str) -> str:
    """A distribution's name as package indexes compare them."""
    return re.sub(r"[-_.]+", "-", text).lower()


def closure() -> dict[str, str]:
    """Every distribution :data:`ROOTS` need on the target, with its version here."""
    seen: dict[str, set[str]] = {}

    def walk(dist: str, extras: tuple[str, ...]) -> None:
        key = name(dist)
        if key in seen and set(extras) <= seen[key]:
            return
        seen.setdefault(key, set()).update(extras)
        for line in metadata.requires(dist) or []:
            req = Requirement(line)
            markers = ({**MARKERS, "extra": extra} for extra in ("", *extras))
            if req.marker is None or any(req.marker.evaluate(m) for m in markers):
                walk(req.name, tuple(req.extras))

    for dist, extras in ROOTS:
        walk(dist, extras)
    return {key: metadata.version(key) for key in seen}


def download(pins: list[str]) -> None:
    """The wheels of ``pins`` into :data:`WHEELS`, built for the target."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
        requirements.write("\n".join(pins) + "\n")
        requirements.flush()
        platforms = [flag for p in PLATFORMS for flag in ("--platform", p)]
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        target = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
        into = ["--dest", str(WHEELS), "--requirement", requirements.name]
        subprocess.run([*pip, *target, *platforms, *into], check=True)


def unused(member: str) -> bool:
    """Is this file of a wheel one that nothing here reads (the module docstring)?"""
    parts = member.split("/")
    return (
        member.startswith(("mlflow/server/js/", "prefect/server/ui/", "prefect/server/ui-v2/"))
        or member.startswith("moto/ssm/resources/ecs/")
        or (parts[:2] == ["botocore", "data"] and len(parts) > 3 and parts[2] not in AWS_SERVICES)
    )


def slim(wheel: Path) -> None:
    """``wheel`` without its :func:`unused` files, nor their lines in its ``RECORD``."""
    with zipfile.ZipFile(wheel) as old:
        dropped = {m for m in old.namelist() if unused(m)}
        if not dropped:
            return
        slimmer = wheel.with_suffix(".slim")
        with zipfile.ZipFile(slimmer, "w", zipfile.ZIP_DEFLATED) as new:
            for info in old.infolist():
                if info.filename in dropped:
                    continue
                data = old.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    kept = [r for r in data.decode().splitlines() if r.split(",")[0] not in dropped]
                    data = ("\n".join(kept) + "\n").encode()
                new.writestr(info, data)
    slimmer.replace(wheel)


def travelling_bytes() -> int:
    """The repository's files that travel with the wheels: tracked, and untracked but not
    ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sum((ROOT / p).stat().st_size for p in listed.split("\0") if (ROOT / p).is_file())


def main() -> int:
    pins = sorted(
        f"{dist}=={version}"
        for dist, version in closure().items()
        if dist not in MACHINE_HAS and dist != "elastune"
    )
    shutil.rmtree(WHEELS, ignore_errors=True)
    download(pins)
    for wheel in WHEELS.glob("*.whl"):
        slim(wheel)
    wheels = sum(w.stat().st_size for w in WHEELS.glob("*.whl"))
    total = (wheels + travelling_bytes()) / 2**20
    print(f"{len(pins)} wheels in {WHEELS}: {wheels / 2**20:.1f} MiB; with the repository")
    print(f"{total:.1f} MiB of the {LIMIT_MIB} MiB that may travel")
    return 0 if total <= LIMIT_MIB else 1


if __name__ == "__main__":
    raise SystemExit(main())
