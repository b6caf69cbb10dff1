"""The ``train-segment`` flow: one segment on whichever worker of a work pool picks it up.

In work-pool mode the tune flow launches this flow through the ``train-segment``
deployment of the pool. Checkpoints and the segment's report travel through the MLflow
artifact store, so any worker can resume any trial and the tune flow reads the result
from the same place.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import flow

from planners.search import Segment
from tasks.train import JobRef, run_segment

FLOW_NAME = "train-segment"


@flow(name=FLOW_NAME, flow_run_name="{job[job_id]} trial-{segment[trial]}")
def train_segment_flow(
    job: dict[str, Any], segment: dict[str, Any], config: dict[str, Any], run_id: str
) -> dict[str, Any]:
    return run_segment(JobRef(**job), Segment(**segment), config, run_id).to_dict()


def flow_parameters(job: JobRef, segment: Segment, config: dict[str, Any], run_id: str) -> dict:
    return {"job": asdict(job), "segment": asdict(segment), "config": config, "run_id": run_id}
