"""The nightly flow: re-tune each job, warm-started from last night's best configurations,
and promote a new model version only when it beats the registered one."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from elastune.flows.job import SPEC_ATTR
from elastune.flows.prepare import prepare
from elastune.flows.tune import tune_prepared
from elastune.planners.spec import JobSpec, contains, load_job
from elastune.tasks.tracking import local_uri


def previous_best(spec: JobSpec, count: int) -> tuple[str | None, list[dict[str, Any]]]:
    """The newest earlier study of this job and its ``count`` best complete configurations
    that still lie in the job's space."""
    storage = local_uri(spec.tracking.optuna_storage)
    studies = [
        s
        for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
        if s.user_attrs.get(SPEC_ATTR, {}).get("name") == spec.name and s.datetime_start
    ]
    if not studies:
        return None, []
    last = max(studies, key=lambda s: s.datetime_start)
    trials = optuna.load_study(study_name=last.study_name, storage=storage).get_trials(
        deepcopy=False, states=(TrialState.COMPLETE,)
    )
    ranked = sorted(trials, key=lambda t: spec.loss(t.value))
    return last.study_name, [t.params for t in ranked if contains(spec, t.params)][:count]


def _row(job_file: str, source: str | None, seeded: int, summary: dict[str, Any]) -> str:
    model, best = summary["model"] or {}, summary["best"]
    previous = model.get("previous") or {}
    kept = f"kept v{previous['version']}" if previous else "-"
    return (
        f"| {job_file} | {summary['job_id']} | {source or '-'} ({seeded} configs) | "
        + (f"v{previous['version']}: {previous['metric']:.4f}" if previous else "none")
        + f" | {best['metric']:.4f} | "
        + (f"**v{model['version']}**" if model.get("version") else kept)
        + " |"
    )


@flow(name="tune-nightly")
def tune_nightly(job_files: list[str], warm_start: int = 3) -> list[dict[str, Any]]:
    """Run every job file once; each study starts from the previous night's best."""
    logger = get_run_logger()
    rows, summaries, failures = [], [], []
    for job_file in job_files:
        try:
            spec = load_job(job_file)
            source, configs = previous_best(spec, warm_start)
            summary = tune_prepared(prepare(spec), warm_start=configs)
        except Exception as exc:  # one bad job (or job file) must not stop the others
            logger.error("%s failed: %s", job_file, exc)
            failures.append(job_file)
            rows.append(f"| {job_file} | failed: {exc} | | | | |")
            continue
        summaries.append(summary)
        rows.append(_row(job_file, source, len(configs), summary))
    create_markdown_artifact(
        key="tune-nightly",
        markdown="# Nightly tuning\n\n"
        "| job file | job | warm start from | registered before | best tonight | model |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows),
        description="tonight's best against the registered models",
    )
    if failures:
        raise RuntimeError(f"{len(failures)} nightly job(s) failed: {', '.join(failures)}")
    return summaries
