"""Staging: where and how wide the segments of a job run.

The modules, from the bottom up: ``plan`` (the staged plan of a synchronous job, one stage
per rung of every bracket), ``profile`` (the speed profile: seconds per resource unit on
``g`` GPUs), ``occupancy``, ``packing`` and ``fluid`` (the Fluid packer: each segment's
width and GPUs), ``placement`` (a stage's trials on GPU nodes), ``devices`` (a local
driver's CUDA devices per segment) and ``stagepack`` (Fluid inside the staged flow).

Example (a three-stage SHA plan, and its top rung's survivor packed onto two GPUs):
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9},
    ...     "compute": {"workers": 2}})
    >>> plan = compile_plan(spec)
    >>> [stage.name for stage in plan.stages]
    ['b0-r0', 'b0-r1', 'b0-r2']
    >>> packer = StagePacker(plan, Profile.from_speeds({2: 1.8}), gpus=2)
    >>> from elastune.planners.search import Segment
    >>> top = Segment(0, 3, 9, rung=2)
    >>> packer.may_start(top, []), packer.width(top)
    (True, 2.0)
    >>> place([2.0, 1.0, 1.0], gpus_per_node=2).nodes
    2
"""

from elastune.planners.staging.devices import LocalDevices
from elastune.planners.staging.fluid import DynamicFluid, StaticFluid, best_rigid
from elastune.planners.staging.packing import Assignment, Packer, Schedule, Work
from elastune.planners.staging.placement import nodes_needed, place
from elastune.planners.staging.plan import Plan, Stage, allocate, compile_plan, is_staged
from elastune.planners.staging.profile import Profile, ProfileError, Timing
from elastune.planners.staging.stagepack import StagePacker, stage_packer

__all__ = [
    "Assignment",
    "DynamicFluid",
    "LocalDevices",
    "Packer",
    "Plan",
    "Profile",
    "ProfileError",
    "Schedule",
    "Stage",
    "StagePacker",
    "StaticFluid",
    "Timing",
    "Work",
    "allocate",
    "best_rigid",
    "compile_plan",
    "is_staged",
    "nodes_needed",
    "place",
    "stage_packer",
]
