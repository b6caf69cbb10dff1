"""The ECS work-pool base job template for GPU training, generated, never hand-edited.

It starts from prefect-aws's own default ECS template (so a prefect-aws upgrade is picked up
by regenerating) and adds what GPU training on EC2 needs (docs/stack.md §3):

- ``gpu_count``: a *string* variable. ``"{{ gpu_count }}"`` keeps the value's native type,
  and ECS rejects an integer in ``resourceRequirements`` (``"value": 1``);
- ``instance_type``: pins tasks to that EC2 instance type through a ``memberOf``
  placement constraint, so a 4-GPU trial never lands on a 1-GPU node;
- EC2 launch type by default (Fargate has no GPUs) and an EC2-compatible task definition;
  ``capacity_provider_strategy`` (already a variable) replaces the launch type when set.

Regenerate with ``python -m elastune.infra.template``; ``--check`` exits 1 when the file is stale.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

TEMPLATE_PATH = Path(__file__).with_name("ecs_gpu_template.json")
DEFAULT_INSTANCE_TYPE = "g5.xlarge"  # 1 x A10G: the smallest current NVIDIA type on EC2


def gpu_template(base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The GPU template built on ``base`` (default: prefect-aws's ECS default template)."""
    if base is None:
        from prefect_aws.workers.ecs_worker import ECSWorker

        base = ECSWorker.get_default_base_job_template()
    template = copy.deepcopy(base)
    variables = template["variables"]["properties"]
    variables["gpu_count"] = {
        "title": "GPUs per task",
        "description": (
            "GPUs reserved for the flow run's container (ECS resourceRequirements). A string "
            "of digits, because ECS rejects a number there; elastune sets it per segment."
        ),
        "type": "string",
        "pattern": "^[1-9][0-9]*$",
        "default": "1",
    }
    variables["instance_type"] = {
        "title": "EC2 instance type",
        "description": (
            "Tasks run only on container instances of this type (placement constraint); "
            "a capacity provider of the cluster must launch it."
        ),
        "type": "string",
        "default": DEFAULT_INSTANCE_TYPE,
    }
    variables["launch_type"]["default"] = "EC2"
    variables["capacity_provider_strategy"]["description"] += (
        " For GPU capacity use the cluster's EC2 capacity provider, e.g. "
        '[{"capacityProvider": "gpu-cp", "weight": 1, "base": 0}] (all three keys are '
        "required); the launch type is then dropped."
    )

    task_definition = template["job_configuration"]["task_definition"]
    task_definition["requiresCompatibilities"] = ["EC2"]
    task_definition["containerDefinitions"][0]["resourceRequirements"] = [
        {"type": "GPU", "value": "{{ gpu_count }}"}
    ]
    task_definition["placementConstraints"] = [
        {"type": "memberOf", "expression": "attribute:ecs.instance-type == {{ instance_type }}"}
    ]
    return template


def gpu_job_variables(gpus_per_trial: float, instance_type: str | None = None) -> dict[str, str]:
    """Per-run job variables of a segment on the GPU pool (``run_deployment(job_variables=)``).

    Example:
        >>> gpu_job_variables(2.0, "g5.12xlarge")
        {'gpu_count': '2', 'instance_type': 'g5.12xlarge'}
    """
    if gpus_per_trial < 1 or not float(gpus_per_trial).is_integer():
        raise ValueError(
            f"gpus_per_trial must be a whole number >= 1 on ECS, got {gpus_per_trial:g}"
        )
    variables = {"gpu_count": str(int(gpus_per_trial))}
    if instance_type:
        variables["instance_type"] = instance_type
    return variables


def render(template: dict[str, Any]) -> str:
    return json.dumps(template, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=TEMPLATE_PATH)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render(gpu_template())
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run python -m elastune.infra.template", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
