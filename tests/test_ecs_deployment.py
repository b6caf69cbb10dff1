"""infra/prefect-ecs.yaml deploys train-segment to a GPU ECS pool (Prefect DB only, no AWS):
its runs start in the image's project folder and take the plan's GPU job variables."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.deployments import run_deployment

from elastune.flows.pools import segment_deployment
from elastune.flows.segment import flow_parameters
from elastune.infra.template import gpu_job_variables
from elastune.planners.search import Segment
from elastune.tasks.contract import JobRef

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
# Another test module owns the pool named gpu-ecs on the session server.
POOL = "gpu-ecs-deployed"


def test_ecs_deployment_file_deploys_train_segment_to_the_gpu_pool(prefect_api, tmp_path) -> None:
    template = json.loads((ROOT / "infra" / "ecs_gpu_template.json").read_text())
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=POOL, type="ecs", base_job_template=template))
    config = yaml.safe_load((ROOT / "infra" / "prefect-ecs.yaml").read_text())
    (entry,) = config["deployments"]
    entry["work_pool"]["name"] = POOL
    copy = tmp_path / "prefect-ecs.yaml"
    copy.write_text(yaml.safe_dump(config))

    done = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all", "--prefect-file", copy],
        cwd=ROOT,  # entrypoints are relative to the repository root
        env={**os.environ, "PREFECT_API_URL": prefect_api},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    deployment = segment_deployment(POOL, "ecs")  # how a job on the pool finds it
    with get_client(sync_client=True) as client:
        found = client.read_deployment(deployment)
    (workdir,) = re.findall(r"^WORKDIR (\S+)$", (ROOT / "infra" / "Dockerfile").read_text(), re.M)
    assert found.pull_steps == [
        {"prefect.deployments.steps.set_working_directory": {"directory": workdir}}
    ]
    assert found.job_variables["instance_type"] == "g5.12xlarge"

    # The server checks a run's job variables against the pool's schema (422 otherwise).
    job = JobRef("job-1", "tests.trainables:quadratic", "val_accuracy", "max", 3, "", "job")
    run = run_deployment(
        deployment,
        parameters=flow_parameters(job, Segment(0, 0, 1, 0, gpus=2), {"x": 0.5}, "run-1"),
        job_variables=gpu_job_variables(2, "g5.12xlarge"),
        timeout=0,  # no ECS worker here: the run stays scheduled
    )
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run.id).job_variables == {
            "gpu_count": "2",
            "instance_type": "g5.12xlarge",
        }
        client.delete_flow_run(run.id)
